"""BatchController in one process (world size 1): settings, schedule of decisions, EWMA, state.

The multi-rank behaviour (sizes that follow the ranks' times) is in tests/mpi/.
"""

from __future__ import annotations

import json
import math
import time

import pytest

from hethpc.batching import AllocationError, BatchController, BatchingError, ControlSettings


@pytest.mark.parametrize(
    ("kw", "error", "match"),
    [
        ({"mode": "adaptive"}, BatchingError, "mode must be one of"),
        ({"interval": 0}, BatchingError, "interval must be at least 1"),
        ({"deadband": 1.0}, BatchingError, r"deadband must be in \[0, 1\)"),
        ({"window": 0}, BatchingError, "window must be at least 1 step"),
        ({"noise_z": -1.0}, BatchingError, "noise_z must be a finite number >= 0"),
        ({"trim": 0.5}, BatchingError, r"trim must be in \[0, 0.5\)"),
        ({"min_change": -1}, BatchingError, "min_change must be >= 0 samples"),
        ({"probe_steps": -1}, BatchingError, "probe_steps must be >= 0"),
        ({"slowdown": "1:3"}, BatchingError, "names rank 1, but the group has 1 rank"),
        ({"slowdown_mode": "spin"}, BatchingError, r"slowdown_mode must be one of \('busy'"),
        ({"mode": "uniform", "weights": [1.0]}, BatchingError, "takes no weights"),
        ({"mode": "static", "weights": [1.0, 2.0]}, BatchingError, "must be 1 finite positive"),
        ({"mode": "static", "weights": [0.0]}, BatchingError, "must be 1 finite positive"),
        ({"b_max": 8}, AllocationError, "exceeds what the 1 ranks may hold"),
        ({"b_min": 0}, AllocationError, "at least 1 on every rank"),
    ],
    ids=["mode", "interval", "deadband", "window", "noise_z", "trim", "min_change", "probe",
         "slowdown-rank", "slowdown-mode", "uniform-weights", "weights-length", "weights-zero",
         "b_max", "b_min"],
)
def test_bad_settings(kw: dict, error: type[Exception], match: str) -> None:
    control = {k: v for k, v in kw.items() if k in ControlSettings.__dataclass_fields__}
    rest = {k: v for k, v in kw.items() if k not in control}
    with pytest.raises(error, match=match):
        BatchController(16, settings=ControlSettings(**control), **rest)


def test_batch_below_world_is_an_error() -> None:
    with pytest.raises(AllocationError, match="at least 1"):
        BatchController(0)


@pytest.mark.parametrize("mode", ["dynamic", "static", "uniform"])
def test_sizes_in_one_process(mode: str) -> None:
    c = BatchController(32, mode=mode)
    assert c.batch_sizes.tolist() == [32] and c.local_batch == 32


def test_decisions_every_interval_and_never_in_fixed_modes() -> None:
    dyn = BatchController(32, settings=ControlSettings(interval=4))
    fixed = BatchController(32, mode="static")
    got = [dyn.update(step=s, compute_s=0.01) for s in range(12)]
    assert [s for s, r in enumerate(got) if r is not None] == [3, 7, 11]
    assert all(r is None or (r.reason == "unchanged" and not r.applied) for r in got)
    assert len(dyn.adjustments) == 3
    assert all(fixed.update(step=s, compute_s=0.01) is None for s in range(12))
    assert fixed.adjustments == []


def test_probe_decides_early_then_every_interval() -> None:
    c = BatchController(32, settings=ControlSettings(interval=5), probe_steps=2)
    got = [c.update(step=s, compute_s=0.01) for s in range(12)]
    steps = [s for s, r in enumerate(got) if r is not None]
    assert steps == [1, 6, 11]
    assert [a.reason for a in c.adjustments] == ["probe", "unchanged", "unchanged"]


def test_estimate_is_the_geometric_mean_over_the_interval() -> None:
    c = BatchController(10, settings=ControlSettings(interval=3, trim=0.0))
    for s, t in enumerate([1.0, 2.0, 4.0]):
        c.update(step=s, compute_s=t)
    # per-sample 0.1, 0.2, 0.4 -> geometric mean 0.2; times 10 samples
    m = c.last_metrics
    assert m["smoothed_s"] == pytest.approx(2.0)
    assert (m["step"], m["rank"], m["batch_size"], m["compute_s"]) == (2, 0, 10, 4.0)


@pytest.mark.parametrize("bad", [math.nan, 0.0, -1.0, math.inf], ids=["nan", "zero", "neg", "inf"])
def test_invalid_times_are_skipped_and_reported(bad: float) -> None:
    c = BatchController(10, settings=ControlSettings(interval=2))
    c.update(step=0, compute_s=bad)
    rec = c.update(step=1, compute_s=bad)
    assert rec is not None and not rec.applied and rec.reason.startswith("invalid time: rank(s) 0")
    c.update(step=2, compute_s=2.0)
    c.update(step=3, compute_s=bad)  # left out of the estimate
    assert c.last_metrics["smoothed_s"] == pytest.approx(2.0)


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_timer_stop_applies_the_slowdown_of_the_current_step() -> None:
    c = BatchController(8, slowdown="0:3@2")
    t0 = time.perf_counter()
    _busy(0.01)
    assert c.timer_stop(t0, step=2) >= 0.03  # 3x: a lower bound, sleep never returns early
    c.update(step=1, compute_s=0.01)  # the next step is 2: slowed
    t0 = c.timer_start()  # on a CPU a plain clock reading
    assert 0 <= time.perf_counter() - t0 < 0.01
    _busy(0.01)
    assert c.timer_stop(t0) >= 0.03


def test_state_dict_round_trip_through_json() -> None:
    a = BatchController(16, settings=ControlSettings(interval=3), probe_steps=2)
    for s in range(6):
        a.update(step=s, compute_s=0.01 * (s + 1))
    state = json.loads(json.dumps(a.state_dict()))
    b = BatchController(16, settings=ControlSettings(interval=3), probe_steps=2)
    b.load_state_dict(state)
    assert b.state_dict() == a.state_dict()
    assert b.adjustments == a.adjustments
    # Both go on identically.
    ra = [a.update(step=s, compute_s=0.02) for s in range(6, 12)]
    rb = [b.update(step=s, compute_s=0.02) for s in range(6, 12)]
    assert ra == rb and a.last_metrics == b.last_metrics


@pytest.mark.parametrize(
    ("other", "match"),
    [({"global_batch": 32}, "global_batch=32"), ({"mode": "static"}, "mode='static'"),
     ({"world_size": 2}, "world_size=2"), ({"sizes": [15]}, r"do not split global batch 16")],
    ids=["batch", "mode", "world", "sizes"],
)
def test_load_state_dict_refuses_other_runs(other: dict, match: str) -> None:
    c = BatchController(16)
    with pytest.raises(BatchingError, match=match):
        c.load_state_dict({**c.state_dict(), **other})
