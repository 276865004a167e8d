"""Figures of a dynamic-batching run judged in hindsight (``benchmarks/bench_dynbatch.py``),
beside the simulator whose :class:`~hethpc.batching.simulate.SimResult` they reuse: plain
functions of the run's per-rank logs ``[(step, batch, compute seconds), ...]`` and decisions."""

from __future__ import annotations

from typing import Any

import numpy as np

from hethpc.batching.decision import Adjustment
from hethpc.batching.simulate import PhaseFigures, SimResult


def throughput(log: list[tuple[int, int, float]]) -> float:
    """Samples per second of compute over the steps of ``log``: all samples over all compute
    seconds. (A median of per-step rates would leave out the slow spells, which the epoch times
    do include: on a shared host the speed drifts by tens of percent for seconds at a time.)"""
    return sum(b for _, b, _ in log) / sum(t for _, _, t in log)


def balanced(rec: dict[str, Any], tol: float) -> bool:
    t = rec["times"]
    return bool(min(t) > 0 and max(t) / min(t) - 1 <= tol)


def phase_figures(
    decisions: list[dict[str, Any]], start: int, end: int, tol: float
) -> tuple[int | None, int]:
    """By the estimates: for decisions in [start, end), decisions before the first balanced
    one, and the adjustments adopted after it."""
    ds = [d for d in decisions if start <= d["step"] < end]
    first = next((i for i, d in enumerate(ds) if balanced(d, tol)), None)
    if first is None:
        return None, 0
    return first, sum(1 for d in ds[first + 1 :] if d["applied"])


def judged(run: dict[str, Any], bounds: list[int]) -> SimResult:
    """The run's sizes judged in hindsight: each step's time taken as its size times the rank's
    per-sample time over the whole phase (``bounds``: the steps where the slowdown changes, and
    the end), the best knowledge of the speeds a rank had there. A decision's estimate covers
    20 steps, over which this host's speed alone wanders by up to 10 %; the phase's mean covers
    them all. The figures then come from :meth:`SimResult.phase`, as in the simulator."""
    sizes = np.array([[b for _, b, _ in log] for log in run["logs"]], dtype=np.int64).T
    secs = np.array([[t for _, _, t in log] for log in run["logs"]]).T
    true = np.empty_like(secs)
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        true[a:b] = sizes[a:b] * (secs[a:b].sum(axis=0) / sizes[a:b].sum(axis=0))
    return SimResult(sizes, true, secs, [Adjustment.from_dict(d) for d in run["decisions"]])


def to_balance(f: PhaseFigures) -> int | None:
    """Adjustments adopted before the sizes were balanced (None: never in the phase)."""
    return None if f.balanced_at is None else f.adjustments_to_balance


def loss_parts(
    epoch_s: float, ideal_s: float, per_step: np.ndarray
) -> tuple[dict[str, float], tuple[float, float, float]]:
    """Split ``epoch_s / ideal_s`` into factors: ``1 + part`` each, their product the ratio.

    Args:
        epoch_s: the measured epoch time.
        ideal_s: the ideal epoch time.
        per_step: ``[ranks, steps]`` compute seconds of one epoch's worth of steps.

    Returns:
        The parts (``speed``, ``imbalance``, ``step_noise``, ``outside_compute``; see the
        module's docstring), and the slowest-rank, busiest-rank and mean-rank compute sums.
    """
    slowest = float(per_step.max(axis=0).sum())
    busiest = float(per_step.sum(axis=1).max())
    mean_rank = float(per_step.sum(axis=1).mean())
    parts = {
        "speed": mean_rank / ideal_s - 1,
        "imbalance": busiest / mean_rank - 1,
        "step_noise": slowest / busiest - 1,
        "outside_compute": epoch_s / slowest - 1,
    }
    return parts, (slowest, busiest, mean_rank)


def block_drift(log: list[tuple[int, int, float]], block: int) -> float:
    """Standard deviation of the log mean per-sample time over blocks of ``block`` steps."""
    per = np.log([t / b for _, b, t in log])
    means = [per[i : i + block].mean() for i in range(0, len(per) - block + 1, block)]
    return float(np.std(means)) if len(means) > 1 else 0.0


def brief(d: dict[str, Any]) -> list[Any]:
    """A decision as ``[step, new sizes, applied, reason, per-rank step times (ms),
    elasticities]``."""
    return [
        d["step"],
        d["new_sizes"],
        d["applied"],
        d["reason"],
        [round(1e3 * t, 1) for t in d["times"]],
        [round(e, 2) for e in d.get("elasticities", ())],
    ]
