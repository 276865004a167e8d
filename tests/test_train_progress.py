"""Rank 0's progress: plain lines where the output is not a terminal, messages beside a bar."""

from __future__ import annotations

import io

import pytest

from hethpc.train.report.progress import Progress, plain_line


def test_plain_line_shows_the_step_fraction_fields_and_time_left() -> None:
    line = plain_line(300, 750, 12.0, {"loss": "0.412", "sps": "2,950"})
    assert line == "step 300/750 (40 %)  loss 0.412  sps 2,950  elapsed 12 s  eta 18 s"
    # A resumed run: the pace since its own first step.
    assert plain_line(600, 750, 30.0, {}, initial=500).endswith("elapsed 30 s  eta 45 s")
    assert plain_line(0, 10, 0.0, {}).endswith("eta ?")


def test_no_bar_on_a_pipe_only_periodic_lines() -> None:
    lines: list[str] = []
    p = Progress(4, 0, every_s=1e-9, log=lines.append, stream=io.StringIO())
    assert not p.is_bar
    p.update({"loss": "1.000"})
    p.write("epoch 1/2  test accuracy 50.0%")
    p.update()
    p.close()
    assert lines[0].startswith("step 1/4 (25 %)  loss 1.000")
    assert lines[1] == "epoch 1/2  test accuracy 50.0%"
    assert lines[2].startswith("step 2/4 (50 %)  loss 1.000")


def test_every_s_zero_prints_no_lines_and_the_bar_keeps_messages_apart(
    capsys: pytest.CaptureFixture[str],
) -> None:
    lines: list[str] = []
    quiet = Progress(3, 0, every_s=0.0, log=lines.append, stream=io.StringIO())
    for _ in range(3):
        quiet.update()
    assert lines == []
    out = io.StringIO()
    bar = Progress(3, 0, log=lines.append, stream=out, bar=True)
    bar.update({"loss": "0.5"})
    bar.write("a message")
    bar.close()
    # tqdm.write: the bar is cleared, the message printed on its own line, the bar redrawn.
    assert lines == [] and capsys.readouterr().out == "a message\n"
    assert "a message" not in out.getvalue() and "loss=0.5" in out.getvalue()
