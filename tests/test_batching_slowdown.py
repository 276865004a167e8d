"""Emulated slowdown: the schedule notation, factors over steps, and the stretched time."""

from __future__ import annotations

import time

import pytest

from hethpc.batching.slowdown import Slowdown, SlowdownError, SlowdownSchedule, stretch


@pytest.mark.parametrize(
    ("spec", "entries"),
    [
        (None, ()),
        ("", ()),
        ("1:3", (Slowdown(1, 3.0, 0),)),
        ("1:3@0,1:1@400", (Slowdown(1, 3.0, 0), Slowdown(1, 1.0, 400))),
        (" 0:2.5@10 , 2:4 ", (Slowdown(0, 2.5, 10), Slowdown(2, 4.0, 0))),
    ],
    ids=["none", "empty", "no-step", "recover", "spaces-and-two-ranks"],
)
def test_parse(spec: str | None, entries: tuple[Slowdown, ...]) -> None:
    s = SlowdownSchedule.parse(spec)
    assert s.entries == entries
    assert SlowdownSchedule.parse(s.spec) == s  # the spec round-trips


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("1", "cannot read slowdown entry '1'"),
        ("1:x", "cannot read slowdown entry '1:x'"),
        ("1:3@", "cannot read"),
        ("a:3", "cannot read"),
        ("1:0.5", "factor must be a finite number >= 1"),
        ("1:nan", "factor must be a finite number >= 1"),
        ("-1:2", "rank must be >= 0"),
        ("1:2@-5", "step must be >= 0"),
        ("1:2@5,1:3@5", "same rank and step"),
    ],
    ids=["no-factor", "bad-factor", "empty-step", "bad-rank", "speed-up", "nan", "neg-rank",
         "neg-step", "duplicate"],
)
def test_parse_errors(spec: str, match: str) -> None:
    with pytest.raises(SlowdownError, match=match):
        SlowdownSchedule.parse(spec)


SCHEDULE = SlowdownSchedule.parse("1:3@0,1:1@400,0:2@200,1:1.5@600")


@pytest.mark.parametrize(
    ("rank", "step", "factor"),
    [(1, 0, 3.0), (1, 399, 3.0), (1, 400, 1.0), (1, 599, 1.0), (1, 600, 1.5), (1, 10**6, 1.5),
     (0, 0, 1.0), (0, 199, 1.0), (0, 200, 2.0), (2, 300, 1.0)],
    ids=["r1-start", "r1-before-recover", "r1-recovered", "r1-before-relapse", "r1-relapse",
         "r1-late", "r0-start", "r0-before", "r0-slowed", "unnamed-rank"],
)
def test_factor_follows_schedule(rank: int, step: int, factor: float) -> None:
    assert SCHEDULE.factor(rank, step) == factor


def test_change_steps_and_max_rank() -> None:
    assert SCHEDULE.change_steps() == [200, 400, 600]
    assert SCHEDULE.max_rank == 1
    assert SlowdownSchedule().max_rank == -1


def test_of_coerces() -> None:
    s = SlowdownSchedule.of([Slowdown(0, 2.0)])
    assert SlowdownSchedule.of(s) is s
    assert SlowdownSchedule.of("0:2") == s
    assert SlowdownSchedule.of(None) == SlowdownSchedule()


@pytest.mark.parametrize("mode", ["busy", "sleep"])
@pytest.mark.parametrize("factor", [1.0, 3.0], ids=["none", "3x"])
def test_stretch_takes_at_least_factor_minus_one_times(factor: float, mode: str) -> None:
    # A lower bound only: neither mode returns before its deadline, so this cannot be flaky.
    t0 = time.perf_counter()
    stretch(0.02, factor, mode=mode)
    assert time.perf_counter() - t0 >= (factor - 1) * 0.02


def test_busy_stretch_computes_and_sleep_stretch_does_not() -> None:
    # CPU seconds of this thread over a 0.2 s stretch: a busy one spends most of it computing
    # (a third allows for a loaded host), a sleeping one almost none.
    used = {}
    for mode in ("busy", "sleep"):
        c0 = time.thread_time()
        stretch(0.1, 3.0, mode=mode)
        used[mode] = time.thread_time() - c0
    assert used["busy"] > 0.2 / 3, used
    assert used["sleep"] < 0.02, used


def test_stretch_refuses_an_unknown_mode() -> None:
    with pytest.raises(SlowdownError, match=r"slowdown mode must be one of \('busy', 'sleep'\)"):
        stretch(0.01, 2.0, mode="spin")
