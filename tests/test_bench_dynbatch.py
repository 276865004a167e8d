"""The dynamic-batching benchmark's figures (hethpc.batching.figures), on made-up runs."""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import pytest

from hethpc.batching import figures
from hethpc.batching.decision import Adjustment
from hethpc.batching.slowdown import pace


def made_up_run(
    sizes: list[tuple[int, int]], per_sample: list[tuple[float, float]], decisions: list[Adjustment]
) -> dict[str, Any]:
    """A run's result as the benchmark gathers it: per-rank logs and decisions."""
    logs = [
        [(s, b[k], b[k] * p[k]) for s, (b, p) in enumerate(zip(sizes, per_sample, strict=True))]
        for k in range(2)
    ]
    return {"logs": logs, "decisions": [d.as_dict() for d in decisions]}


def adj(step: int, old: tuple[int, int], new: tuple[int, int], applied: bool) -> Adjustment:
    return Adjustment(step, (1.0, 1.0), (1.0, 1.0), old, new, 0.0, applied, "adopted")


def test_sizes_are_judged_at_each_phase_mean_speed() -> None:
    # Rank 1 is 3x slower in steps 0-19 and as fast as rank 0 in 20-39; one adjustment in each
    # phase lands on the balanced sizes, decisions every 10 steps.
    sizes = [(512, 512)] * 10 + [(768, 256)] * 20 + [(512, 512)] * 10
    speed = [(1e-4, 3e-4)] * 20 + [(1e-4, 1e-4)] * 20
    decisions = [
        adj(9, (512, 512), (768, 256), True),
        adj(19, (768, 256), (768, 256), False),
        adj(29, (768, 256), (512, 512), True),
        adj(39, (512, 512), (512, 512), False),
    ]
    r = figures.judged(made_up_run(sizes, speed, decisions), [0, 20, 40])
    first, second = r.phase(0, 20, 0.10), r.phase(20, 40, 0.10)
    assert (first.balanced_at, figures.to_balance(first), first.steady_adjustments) == (10, 1, 0)
    assert (second.balanced_at, second.intervals_to_balance) == (30, 1)
    assert second.steady_adjustments == 0
    assert first.final_imbalance == pytest.approx(0.0)


def test_a_noisy_step_does_not_unbalance_the_judgement_but_a_bad_adjustment_does() -> None:
    sizes = [(768, 256)] * 20 + [(868, 156)] * 20
    speed = [(1e-4, 3e-4)] * 40
    speed[5] = (3e-4, 3e-4)  # one step of rank 0 took 3x longer: noise, not the sizes' fault
    decisions = [adj(19, (768, 256), (868, 156), True), adj(39, (868, 156), (868, 156), False)]
    r = figures.judged(made_up_run(sizes, speed, decisions), [0, 40])
    f = r.phase(0, 40, 0.10)
    # Balanced from the first step (no adjustment needed), then one adoption moved away: it
    # counts as a steady adjustment and the last sizes are off by much more than 10 %.
    assert (f.balanced_at, figures.to_balance(f), f.steady_adjustments) == (0, 0, 1)
    assert f.final_imbalance > 0.3
    never = figures.judged(made_up_run(sizes[20:], speed[20:], []), [0, 20]).phase(0, 20, 0.10)
    assert never.balanced_at is None and figures.to_balance(never) is None


def test_loss_parts_multiply_to_dynamic_over_ideal() -> None:
    per_step = np.array([[1.0, 1.2, 0.9], [1.1, 1.0, 1.0]])  # [ranks, steps]
    parts, (slowest, busiest, mean_rank) = figures.loss_parts(3.6, 3.0, per_step)
    assert (slowest, busiest, mean_rank) == pytest.approx((3.3, 3.1, 3.1))
    assert parts["imbalance"] == pytest.approx(0.0)
    assert parts["step_noise"] == pytest.approx(3.3 / 3.1 - 1)
    assert math.prod(1 + v for v in parts.values()) == pytest.approx(3.6 / 3.0)
    _, (_, busier, _) = figures.loss_parts(3.6, 3.0, per_step * np.array([[1.0], [2.0]]))
    assert busier == pytest.approx(6.2)


def test_block_drift_sees_slow_wander_not_step_noise() -> None:
    steady = [(s, 100, 0.01 * (1.3 if s % 2 else 1 / 1.3)) for s in range(80)]
    assert figures.block_drift(steady, 20) == pytest.approx(0.0, abs=1e-12)
    wander = [(s, 100, 0.01 * (1.1 if (s // 20) % 2 else 1 / 1.1)) for s in range(80)]
    assert figures.block_drift(wander, 20) == pytest.approx(math.log(1.1))
    assert figures.block_drift(wander[:30], 20) == 0.0  # one block: nothing to compare


def test_pace_sleeps_to_the_deadline_and_reports_an_overrun() -> None:
    t0 = time.perf_counter()
    assert pace(t0, 0.05)
    assert time.perf_counter() - t0 >= 0.05
    late = time.perf_counter() - 0.01
    assert not pace(late, 0.005)  # already past: no sleep
    assert time.perf_counter() - late < 0.05
