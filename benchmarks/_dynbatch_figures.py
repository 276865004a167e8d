"""Figures of a dynamic-batching run judged in hindsight (``benchmarks/bench_dynbatch.py``),
beside the simulator whose :class:`~_dynbatch_simulate.SimResult` they reuse: plain
functions of the run's per-rank logs ``[(step, batch, compute seconds), ...]`` and decisions.

The benchmark's three runs: 1. uniform batches, 2. dynamic batching (same slowdown, seed and
epochs), 3. dynamic batching while the slowdown changes at steps S and 2S.

Definitions: a rank's *throughput* is its samples over its compute seconds (all of them, slow
spells included, as the epoch times include them) in epochs 2..; the *ideal* epoch time is the
epoch's samples over the sum of the ranks' throughputs, each rank taken at the higher of its
throughputs in runs 1 and 2. Sizes are *balanced* when the step times they predict differ by
at most ``tol`` (max/min - 1), each rank's time taken as its size times its per-sample compute
time over the whole phase (run 2; each of run 3's three phases): the sizes are judged, in
hindsight, against the best measure of the speeds, not against the 20 steps a decision sees,
over which this host's speed alone wanders by up to 10 % (``timing_drift``).
``adjustments_to_balance``: adopted adjustments before the sizes of run 2 were balanced.
``intervals_to_rebalance``: for each change in run 3, decisions after the change before the
sizes were balanced at the new speeds (the largest over the changes).
``steady_adjustments``: adopted adjustments after balance, before the next change, summed over
runs 2 and 3. The same figures judged by each decision's own estimates (balanced: the smoothed
step times it gathered within the tolerance) are reported as ``*_by_estimate``.
``dynamic_epoch_s`` and ``uniform_epoch_s``: means over epochs 2.. (epoch 1 holds the transient
from uniform sizes, reported as ``dynamic_first_epoch_s``). ``dynamic_over_ideal_parts``
splits dynamic over ideal into factors whose product it is: ``speed`` (the ranks' mean compute
over the ideal: slower than at their best), ``imbalance`` (the busiest rank's total compute over
the mean: what the sizes cost), ``step_noise`` (the sum over steps of the slowest rank's
compute over the busiest rank's total: each step waits for the slower of two noisy ranks) and
``outside_compute`` (the allreduce, optimiser and waiting), from the per-epoch sums
``dynamic_slowest_compute_epoch_s`` (over steps, the slowest rank's compute),
``dynamic_busiest_rank_compute_epoch_s`` and ``dynamic_mean_compute_epoch_s``;
``ideal_same_run_epoch_s`` is the ideal at the dynamic run's own throughputs.
``timing_noise``: per rank, the standard deviation of the log compute time per step in run 1;
``timing_drift``: of the log mean per-sample time over blocks of ``interval`` steps in run 1
(fixed sizes). ``late_steps`` counts paced steps whose real compute overran the pace.
"""

from __future__ import annotations

import statistics
from typing import Any

import numpy as np
from _dynbatch_simulate import PhaseFigures, SimResult

from hethpc.batching.decision import Adjustment


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


def run_figures(
    uni: dict[str, Any],
    dyn: dict[str, Any],
    chg: dict[str, Any],
    *,
    global_batch: int,
    epochs: int,
    phase_steps: int,
    interval: int,
    tol: float,
    paced_s_per_sample: float,
) -> dict[str, Any]:
    """The benchmark's figures (defined in the module's docstring) from its three runs.

    Args:
        uni: run 1 (uniform batches), as the benchmark gathers it: ``epoch_s``, ``accuracy``,
            per-rank ``logs``, ``decisions``, ``steps_per_epoch`` and ``late``.
        dyn: run 2 (dynamic batching), the same keys.
        chg: run 3 (the slowdown changes at steps ``phase_steps`` and twice that).
        global_batch: B, samples per step over all ranks.
        epochs: epochs of runs 1 and 2.
        phase_steps: S, steps per phase of run 3.
        interval: steps between control decisions.
        tol: balanced: max/min - 1 of the predicted step times at most ``tol``.
        paced_s_per_sample: the pace of the compute (0: not paced), reported as given.

    Returns:
        The figures, keyed as in the benchmark's JSON line (from ``global_batch`` on).
    """
    S = phase_steps
    # Epoch 1 of the dynamic run holds the transient from uniform sizes; both runs are compared
    # over epochs 2.. (measured side by side), and the ranks' throughputs are taken from the
    # uniform run's steps in those epochs.
    spe = uni["steps_per_epoch"]
    e0 = 1 if epochs > 1 else 0
    skip = e0 * spe or min(5, spe // 4)
    X = [throughput(log[skip:]) for log in uni["logs"]]
    X_dyn = [throughput(log[skip:]) for log in dyn["logs"]]
    noise = [statistics.pstdev(np.log([t for _, _, t in log[skip:]])) for log in uni["logs"]]
    # Each rank at the faster of its two measured speeds: a run that slowed a rank down (the
    # host's speed depends on what both cores do) then cannot flatter the ideal.
    ideal = spe * global_batch / sum(max(u, d) for u, d in zip(X, X_dyn, strict=True))
    # Where the dynamic run's time goes, over the same epochs: the ideal at its own measured
    # speeds; each step's slowest compute (the balance and the per-step noise); the rest
    # (allreduce, optimiser, waiting outside compute).
    ideal_same = spe * global_batch / sum(X_dyn)
    per_step = np.array([[t for _, _, t in log[skip:]] for log in dyn["logs"]])
    dyn_epochs = max(1, per_step.shape[1] / spe)
    uniform_epoch = statistics.mean(uni["epoch_s"][e0:])
    dynamic_epoch = statistics.mean(dyn["epoch_s"][e0:])

    # Balance judged in hindsight (the sizes at each phase's mean speeds), the goals' figures.
    n_dyn = len(dyn["logs"][0])
    f2 = judged(dyn, [0, n_dyn]).phase(0, n_dyn, tol)
    bounds = [0, S, 2 * S, 3 * S]
    r3 = judged(chg, bounds)
    f3 = [r3.phase(bounds[i], bounds[i + 1], tol) for i in range(3)]
    rebalance = [f.intervals_to_balance for f in f3[1:]]
    # The same by each decision's own estimates (20 steps or more at the sizes in force).
    first_est, steady2_est = phase_figures(dyn["decisions"], 0, 10**9, tol)
    applied_before = None
    if first_est is not None:
        applied_before = sum(1 for d in dyn["decisions"][:first_est] if d["applied"])
    rebalance_est: list[int | None] = []
    steady3_est = 0
    for i in range(3):
        first, steady = phase_figures(chg["decisions"], bounds[i], bounds[i + 1], tol)
        steady3_est += steady
        if i > 0:
            rebalance_est.append(first)
    parts, (slowest, busiest, mean_rank) = loss_parts(dynamic_epoch, ideal, per_step / dyn_epochs)
    acc_u, acc_d = uni["accuracy"][-1], dyn["accuracy"][-1]
    return {
        "global_batch": global_batch,
        "steps_per_epoch": spe,
        "uniform_epoch_s": round(uniform_epoch, 3),
        "uniform_first_epoch_s": round(uni["epoch_s"][0], 3),
        "dynamic_epoch_s": round(dynamic_epoch, 3),
        "dynamic_first_epoch_s": round(dyn["epoch_s"][0], 3),
        "ideal_epoch_s": round(ideal, 3),
        "speedup": round(uniform_epoch / dynamic_epoch, 3),
        "ideal_speedup": round(uniform_epoch / ideal, 3),
        "dynamic_over_ideal": round(dynamic_epoch / ideal, 3),
        "ideal_same_run_epoch_s": round(ideal_same, 3),
        "dynamic_over_ideal_same_run": round(dynamic_epoch / ideal_same, 3),
        "dynamic_slowest_compute_epoch_s": round(slowest, 3),
        "dynamic_busiest_rank_compute_epoch_s": round(busiest, 3),
        "dynamic_mean_compute_epoch_s": round(mean_rank, 3),
        # dynamic / ideal = the product of (1 + each part), exactly.
        "dynamic_over_ideal_parts": {k: round(v, 4) for k, v in parts.items()},
        "adjustments_to_balance": to_balance(f2),
        "intervals_to_rebalance": None if None in rebalance else max(rebalance),  # type: ignore[type-var]
        "intervals_to_rebalance_per_change": rebalance,
        "steady_adjustments": f2.steady_adjustments + sum(f.steady_adjustments for f in f3),
        "final_imbalance": round(f2.final_imbalance, 4),
        "phase_final_imbalance": [round(f.final_imbalance, 4) for f in f3],
        "adjustments_to_balance_by_estimate": applied_before,
        "intervals_to_rebalance_by_estimate": rebalance_est,
        "steady_adjustments_by_estimate": steady2_est + steady3_est,
        "throughputs": [round(x, 1) for x in X],
        "dynamic_throughputs": [round(x, 1) for x in X_dyn],
        "timing_noise": [round(v, 3) for v in noise],
        "timing_drift": [round(block_drift(log[skip:], interval), 3) for log in uni["logs"]],
        "final_sizes": dyn["decisions"][-1]["new_sizes"] if dyn["decisions"] else None,
        "epochs": epochs,
        "paced_s_per_sample": paced_s_per_sample,
        "late_steps": uni["late"] + dyn["late"] + chg["late"],
        "uniform_accuracy": round(acc_u, 4),
        "dynamic_accuracy": round(acc_d, 4),
        "accuracy_gap_points": round(100 * abs(acc_u - acc_d), 2),
        "decisions_run2": [brief(d) for d in dyn["decisions"]],
        "decisions_run3": [brief(d) for d in chg["decisions"]],
    }
