"""jobs/report.py: the plots' contents (from the figures' data) and where they are written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from torch import nn

import hethpc
from hethpc.cli import report


def _steps(n: int, *, batch: int = 16, compute_s: float = 0.01, **extra: Any) -> list[dict]:
    return [
        {"kind": "step", "step": s, "time": 0.1 * (s + 1), "loss": 1.0 / (s + 1), "batch": batch,
         "compute_s": compute_s, "synced": True, **extra}
        for s in range(n)
    ]  # fmt: skip


def _run(name: str, steps: list[list[dict]], epochs: Any = (), /, **summary: Any) -> dict:
    return {"name": name, "steps": steps, "epochs": list(epochs), "summary": summary}


def _visible(ax: Any) -> list[Any]:
    return [line for line in ax.get_lines() if len(line.get_xdata()) and line.get_alpha() != 0]


def _regression(run_dir: Path, **kwargs: Any) -> Path:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 3)).astype(np.float32)
    y = (x @ np.array([1.0, -2.0, 0.5], np.float32)).astype(np.float32)
    hethpc.fit(nn.Linear(3, 1), (x[:240], y[:240]), test_data=(x[240:], y[240:]), batch_size=20,
               epochs=3, lr=0.05, run_dir=str(run_dir), progress=False, **kwargs)  # fmt: skip
    return run_dir


@pytest.mark.parametrize(
    ("kwargs", "key", "label"),
    [({}, "test_mse", "test MSE"), ({"val_fraction": 0.2}, "val_mse", "validation MSE")],
    ids=["test", "validation"],
)
def test_a_regression_run_is_plotted_and_summarised_by_its_mse(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kwargs: dict, key: str, label: str
) -> None:
    path = _regression(tmp_path / "reg", **kwargs)
    assert report.main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "test MSE (averaged model)" in out and "accuracy" not in out, out
    assert ("validation MSE" in out) is (key == "val_mse"), out
    assert (path / "plots" / "curves.png").stat().st_size > 0

    run = report.load_run(path)
    fig = report.curves_figure([run])
    score_ax, time_ax = fig.axes[2], fig.axes[3]
    assert score_ax.get_ylabel() == time_ax.get_ylabel() == label
    (curve,) = score_ax.get_lines()
    np.testing.assert_allclose(curve.get_ydata(), [r[key] for r in run["epochs"]])
    star = time_ax.get_lines()[-1]
    assert star.get_marker() == "*" and star.get_ydata()[0] == pytest.approx(run["summary"][key])
    loss_ax = fig.axes[0]
    assert "one rank" in loss_ax.get_ylabel() and "rank 0" in loss_ax.get_lines()[0].get_label()


@pytest.mark.parametrize(
    ("key", "label"),
    [("test_acc", "test accuracy (%)"), ("val_acc", "validation accuracy (%)"),
     ("test_mse", "test MSE"), ("val_mae", "validation MAE"), ("test_top_5", "test top 5")],
    ids=["test-acc", "val-acc", "test-mse", "val-mae", "own"],
)  # fmt: skip
def test_metric_label(key: str, label: str) -> None:
    assert report.metric_label(key) == label


@pytest.mark.parametrize(
    ("epochs", "summary", "key"),
    [
        ([{"step": 9, "test_acc": 0.5}], {"test_acc": 0.6}, "test_acc"),
        ([{"step": 9, "val_mse": 0.5}], {"test_mse": 0.4, "val_mse": 0.5}, "val_mse"),
        ([], {"test_mse": 0.4}, "test_mse"),
        ([], {"test_acc": None, "steps": 3}, None),
    ],
    ids=["test", "validation", "summary-only", "none"],
)
def test_metric_of_is_the_score_the_evaluations_carry(
    epochs: list, summary: dict, key: str | None
) -> None:
    assert report.metric_of(_run("r", [_steps(3)], epochs, **summary)) == key


def test_batch_panels_share_one_scale_from_0_that_holds_every_run() -> None:
    small = _run("small", [_steps(30, batch=16), _steps(30, batch=16)])
    big = _run("big", [_steps(30, batch=150, compute_s=0.05), _steps(30, batch=250)])
    fig = report.batches_figure([small, big])
    top = max(max(line.get_ydata()) for ax in fig.axes for line in _visible(ax))
    assert top >= 250
    for ax in fig.axes:
        bottom, upper = ax.get_ylim()
        assert bottom == 0 and upper >= top


def test_the_dashed_line_is_named_only_where_one_is_drawn() -> None:
    alone = report.batches_figure([_run("alone", [_steps(30)])])
    assert "dashed" not in alone.get_suptitle()
    assert not [line for line in alone.axes[0].get_lines() if line.get_linestyle() == "--"]
    pair = report.batches_figure([_run("pair", [_steps(30), _steps(30, compute_s=0.02)])])
    assert "dashed" in pair.get_suptitle()
    assert [line for line in pair.axes[0].get_lines() if line.get_linestyle() == "--"]


def _pipeline(replicas: int) -> dict:
    """Two stages per replica: stage 0 idle a fifth of the step, stage 1 three fifths."""
    steps = [
        _steps(30, batch=32, idle=idle, stage=stage, replica=d)
        for d in range(replicas)
        for stage, idle in enumerate((0.2, 0.6))
    ]
    for recs in steps:
        for r in recs:
            if r["stage"] == 0:
                r["loss"] = None  # only the last stage computes it
    return _run(f"pipe{replicas}", steps, pipeline_stages=2, replicas=replicas)


def test_a_pipeline_plots_each_stage_busy_time_and_idle_share() -> None:
    fig = report.compute_figure([_pipeline(1)])
    lines = _visible(fig.axes[0])
    np.testing.assert_allclose([line.get_ydata()[-1] for line in lines], [8.0, 4.0])  # ms
    labels = [line.get_label() for line in lines]
    assert "stage 0" in labels[0] and "idle 20 %" in labels[0], labels
    assert "stage 1" in labels[1] and "idle 60 %" in labels[1], labels
    assert "busy share" in fig.get_suptitle()
    batches = report.batches_figure([_pipeline(2)])
    solid = [line.get_label() for line in _visible(batches.axes[0]) if line.get_linestyle() == "-"]
    assert solid == ["every replica (replicas 0-1, equal)"]
    curves = report.curves_figure([_pipeline(1)])
    assert "rank 1" in curves.axes[0].get_lines()[0].get_label()  # the last stage's loss


@pytest.mark.parametrize(
    "run", [_run("one", [_steps(20)]), _pipeline(1)], ids=["one-rank", "one-pipeline"]
)
def test_sync_of_a_single_replica_says_there_is_nothing_to_synchronise(run: dict) -> None:
    fig = report.sync_figure([run])
    ax = fig.axes[0]
    assert ax.get_title()
    assert not _visible(ax)
    texts = [t.get_text() for t in ax.texts] + [t.get_text() for t in ax.get_legend().texts]
    assert any("nothing to synchronise" in t for t in texts), texts


def test_sync_of_replicas_draws_their_share() -> None:
    fig = report.sync_figure([_run("two", [_steps(20), _steps(20)])])
    (line,) = _visible(fig.axes[0])
    assert set(line.get_ydata()) == {100.0}


def _mse_run(name: str, curve: list[tuple[float, float]], **summary: Any) -> dict:
    epochs = [{"step": 10 * i, "time": t, "test_mse": v} for i, (t, v) in enumerate(curve)]
    return _run(name, [_steps(3)], epochs, **summary)


def test_time_to_baseline_of_an_mse_run_goes_down_to_it() -> None:
    fast = _mse_run("fast", [(1.0, 1.0), (2.0, 0.1)], test_mse=0.1, time_s=2.0)
    base = _mse_run("base", [(2.0, 0.5), (4.0, 0.1)], test_mse=0.1, time_s=4.0)
    line = report.time_to_baseline([fast, base])
    # the target is 0.105: fast crosses it between its points, base at its last
    want = 1.0 + (0.105 - 1.0) / (0.1 - 1.0)
    assert f"fast {want:.1f} s ({want / (2 + 2 * 0.395 / 0.4):.2f}x)" in line, line
    assert "test MSE 0.105" in line and "+ 5 %" in line and "accuracy" not in line, line


def test_time_to_baseline_does_not_guess_an_unknown_metric_direction() -> None:
    runs = [_run(n, [_steps(3)], [{"time": 1.0, "test_r2": 0.5}], test_r2=0.5) for n in "ab"]
    assert "not computed for test_r2" in report.time_to_baseline(runs)


def _write_run(path: Path, batch: int) -> Path:
    (path / "metrics").mkdir(parents=True)
    lines = [json.dumps(r) for r in _steps(20, batch=batch)]
    (path / "metrics" / "rank0.jsonl").write_text("\n".join(lines) + "\n")
    (path / "summary.json").write_text(json.dumps({"steps": 20, "world_size": 1}))
    return path


def test_a_comparison_is_written_to_a_folder_of_its_own(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = _write_run(tmp_path / "a", 16), _write_run(tmp_path / "b", 32)
    report.main([str(a)])
    own = (a / "plots" / "batch_sizes.png").read_bytes()
    capsys.readouterr()
    report.main([str(a), str(b)])
    out = capsys.readouterr().out
    assert (a / "plots" / "batch_sizes.png").read_bytes() == own
    written = sorted((a / "plots" / "vs-b").iterdir())
    assert [p.name for p in written] == sorted(report.FIGURES)
    assert f"plots written to {a / 'plots' / 'vs-b'}/" in out
    assert all(str(p) in out for p in written), out


def test_a_resume_is_marked_where_the_resumed_process_took_over() -> None:
    run = {**_run("r", [_steps(40)]), "resumes": [{"kind": "resume", "step": 25, "time": 2.6}]}
    fig = report.curves_figure([run, _run("base", [_steps(40)])])
    by_step, by_time = fig.axes[0], fig.axes[1]
    marks = [ln for ln in by_step.get_lines() if ln.get_linestyle() == ":"]
    assert [ln.get_xdata()[0] for ln in marks] == [25]
    assert "r: resumed" in [t.get_text() for t in by_step.get_legend().get_texts()]
    assert [ln.get_xdata()[0] for ln in by_time.get_lines() if ln.get_linestyle() == ":"] == [2.6]
