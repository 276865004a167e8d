"""The dynamic-batching benchmark's figures (benchmarks/_dynbatch_figures.py), on made-up runs."""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hethpc.batching.decision import Adjustment
from hethpc.batching.slowdown import pace

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import _dynbatch_figures as figures  # noqa: E402


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


def bench_run(sizes: list[tuple[int, int]], per_sample: list[tuple[float, float]], epoch_s: float,
              accuracy: float, decisions: list[Adjustment]) -> dict[str, Any]:
    """A made-up run with the keys the benchmark gathers: 2 epochs of 10 steps each."""
    run = made_up_run(sizes, per_sample, decisions)
    return {**run, "epoch_s": [2 * epoch_s, epoch_s], "accuracy": [0.5, accuracy],
            "steps_per_epoch": 10, "late": 1}


def test_run_figures_from_three_made_up_runs() -> None:
    # Rank 1 is 3x slower throughout; uniform sizes take 2 s an epoch, balanced sizes 1 s.
    uniform = bench_run([(512, 512)] * 20, [(1e-4, 3e-4)] * 20, 2.0, 0.9, [])
    dynamic = bench_run([(768, 256)] * 20, [(1e-4, 3e-4)] * 20, 1.0, 0.88, [])
    change = bench_run([(768, 256)] * 30, [(1e-4, 3e-4)] * 30, 1.0, 0.88, [])
    out = figures.run_figures(
        uniform, dynamic, change, global_batch=1024, epochs=2, phase_steps=10, interval=5,
        tol=0.10, paced_s_per_sample=0.0,
    )  # fmt: skip
    assert next(iter(out)) == "global_batch" and list(out)[-1] == "decisions_run3"
    assert (out["uniform_epoch_s"], out["dynamic_epoch_s"], out["speedup"]) == (2.0, 1.0, 2.0)
    # Throughputs 1e4 and 1/3e-4 samples/s: the ideal epoch is 10 * 1024 / their sum.
    assert out["ideal_epoch_s"] == round(10 * 1024 / (1e4 + 1e4 / 3), 3)
    assert out["throughputs"] == [1e4, round(1e4 / 3, 1)]
    assert (out["adjustments_to_balance"], out["final_imbalance"]) == (0, 0.0)
    assert (out["late_steps"], out["accuracy_gap_points"]) == (3, 2.0)
