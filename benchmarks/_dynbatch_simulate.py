"""A deterministic simulator of N ranks under the dynamic-batching control rule, without MPI.

Each rank's compute time per step is ``per_step_s + per_sample_s * b`` (a fixed per-step cost
plus a per-sample cost) times lognormal noise, plus optional absolute jitter (the part of the
timing noise that does not grow with the batch, so it is larger, relatively, at small batches),
and occasional spikes; a :class:`SlowdownSchedule` then stretches it as the emulation does
(``factor`` times the measured compute) and adds the sleep's wake-up delay; an optional drift
(a slowly varying speed) models interference that lasts many steps. Every rank feeds its own
:class:`TimeEstimator`, and every ``interval`` steps the reports go through :func:`decide`
exactly as the :class:`BatchController` does after its allgather. The figures (adjustments to
balance, intervals to rebalance after a change, adjustments in steady phases) use the noise-free
times, so they say how good the sizes really are, not how good they looked.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hethpc.batching.allocation import Bound, allocate
from hethpc.batching.decision import Adjustment
from hethpc.batching.estimate import common_cut
from hethpc.batching.settings import ControlSettings
from hethpc.batching.slowdown import Slowdown, SlowdownSchedule


@dataclass(frozen=True)
class SimRank:
    """A simulated rank's speed at factor 1.

    Attributes:
        per_sample_s: compute seconds per sample.
        per_step_s: fixed compute seconds per step (kernel launches, framework overhead).
    """

    per_sample_s: float
    per_step_s: float = 0.0


@dataclass(frozen=True)
class SimResult:
    """What a simulation did.

    Attributes:
        sizes: ``[steps, N]`` sizes in force at each step.
        true_s: ``[steps, N]`` noise-free compute seconds at each step (with the mean delays).
        measured_s: ``[steps, N]`` the noisy seconds the estimators saw.
        adjustments: every decision, in order.
    """

    sizes: np.ndarray
    true_s: np.ndarray
    measured_s: np.ndarray
    adjustments: list[Adjustment]

    def imbalance(self) -> np.ndarray:
        """Per step, ``max(true_s) / min(true_s) - 1`` over the ranks."""
        return self.true_s.max(axis=1) / self.true_s.min(axis=1) - 1

    def phase(self, start: int, end: int, tol: float = 0.10) -> PhaseFigures:
        """Figures for the steps ``[start, end)`` (a phase of constant speeds).

        Args:
            start: first step of the phase (a speed change, or 0).
            end: first step after it.
            tol: balanced means an imbalance of at most ``tol``.
        """
        imb = self.imbalance()[start:end]
        hit = np.flatnonzero(imb <= tol)
        balanced_at = start + int(hit[0]) if hit.size else None
        ds = [a for a in self.adjustments if start <= a.step < end]
        cut = end if balanced_at is None else balanced_at
        before = [a for a in ds if a.step < cut]
        after = [a for a in ds if a.step >= cut]
        return PhaseFigures(
            balanced_at=balanced_at,
            adjustments_to_balance=sum(a.applied for a in before),
            intervals_to_balance=len(before) if balanced_at is not None else None,
            steady_adjustments=sum(a.applied for a in after),
            final_imbalance=float(imb[-1]),
            final_sizes=tuple(int(v) for v in self.sizes[end - 1]),
        )


@dataclass(frozen=True)
class PhaseFigures:
    """The control figures of one phase (see :meth:`SimResult.phase`).

    Attributes:
        balanced_at: first step whose sizes were balanced (None: never in the phase).
        adjustments_to_balance: adopted adjustments before that step.
        intervals_to_balance: decisions in the phase before that step (None: never balanced).
        steady_adjustments: adopted adjustments from that step to the end of the phase.
        final_imbalance: imbalance at the phase's last step.
        final_sizes: the sizes at the phase's last step.
    """

    balanced_at: int | None
    adjustments_to_balance: int
    intervals_to_balance: int | None
    steady_adjustments: int
    final_imbalance: float
    final_sizes: tuple[int, ...]


def ideal_sizes(
    global_batch: int, ranks: Sequence[SimRank], factors: Sequence[float]
) -> np.ndarray:
    """Real-valued sizes that equalise the noise-free step times (no bounds)."""
    c1 = [f * r.per_sample_s for r, f in zip(ranks, factors, strict=True)]
    c0 = [f * r.per_step_s for r, f in zip(ranks, factors, strict=True)]
    T = (global_batch + math.fsum(a / b for a, b in zip(c0, c1, strict=True))) / math.fsum(
        1 / b for b in c1
    )
    return np.array([(T - a) / b for a, b in zip(c0, c1, strict=True)])


def simulate(
    global_batch: int,
    ranks: Sequence[SimRank],
    *,
    steps: int,
    slowdown: SlowdownSchedule | str | Sequence[Slowdown] | None = None,
    noise: float = 0.25,
    abs_noise_s: float = 0.0,
    sleep_jitter_s: float = 0.0,
    drift: float = 0.0,
    drift_steps: float = 20.0,
    shared_drift: float = 0.0,
    spike_prob: float = 0.0,
    spike_factor: float = 3.0,
    seed: int = 0,
    start: Sequence[int] | np.ndarray | None = None,
    interval: int = 10,
    deadband: float = 0.05,
    min_change: int = 1,
    window: int = 200,
    noise_z: float = 3.0,
    trim: float = 0.2,
    b_min: Bound = 1,
    b_max: Bound = None,
    settings: ControlSettings | None = None,
) -> SimResult:
    """Run the control rule on simulated ranks; deterministic for a given ``seed``.

    Args:
        global_batch: B.
        ranks: the ranks' speeds at factor 1.
        steps: steps to simulate.
        slowdown: factors over steps (as for :class:`BatchController`).
        noise: sigma of the lognormal noise on each step time (0.25: about +-25 %).
        abs_noise_s: mean of an exponential delay added to each step's compute before the
            stretch (timer and scheduler jitter, the same at any batch size).
        sleep_jitter_s: mean of an exponential delay added to each stretched step (a slowed
            rank's sleep wakes up late: :func:`~hethpc.batching.slowdown.stretch`).
        drift: stationary sigma of a slowly varying log speed per rank (an AR(1) process with
            correlation time ``drift_steps``: interference that lasts many steps). It is part
            of the noise-free time.
        drift_steps: the drift's correlation time in steps (also of ``shared_drift``).
        shared_drift: stationary sigma of a slowly varying log speed common to all ranks (the
            whole host slowing down and speeding up); part of the noise-free time.
        spike_prob: chance that a step is also multiplied by ``spike_factor``.
        spike_factor: the size of a spike (a descheduled step).
        seed: the noise's seed.
        start: the first sizes (default: uniform).
        interval, deadband, min_change, window, noise_z, trim, b_min, b_max: the control
            settings, as for :class:`BatchController`, documented with their defaults in
            :class:`ControlSettings`.
        settings: all of ``interval`` .. ``b_max`` at once (the controller's
            :class:`ControlSettings`); when given, those keywords are ignored.
    """
    n = len(ranks)
    ctl = settings or ControlSettings(interval=interval, deadband=deadband,
                                      min_change=min_change, window=window, noise_z=noise_z,
                                      trim=trim, b_min=b_min, b_max=b_max)  # fmt: skip
    interval, b_min, b_max = ctl.interval, ctl.b_min, ctl.b_max
    sched = SlowdownSchedule.of(slowdown)
    rng = np.random.default_rng(seed)
    sizes = (
        allocate(global_batch, [1.0] * n, b_min=b_min, b_max=b_max)
        if start is None
        else np.asarray(start, dtype=np.int64)
    )
    if int(sizes.sum()) != global_batch or sizes.shape != (n,):
        raise ValueError(f"start sizes {sizes.tolist()} do not split {global_batch} over {n} ranks")
    est = [ctl.estimator() for _ in range(n)]
    all_sizes = np.zeros((steps, n), dtype=np.int64)
    true_s = np.zeros((steps, n))
    measured = np.zeros((steps, n))
    records: list[Adjustment] = []
    level = np.zeros(n)  # the drift's log speed per rank
    common = 0.0  # the shared drift's log speed
    rho = math.exp(-1.0 / drift_steps)
    for step in range(steps):
        if drift:  # drawn only when used, like the jitter
            level = rho * level + drift * math.sqrt(1 - rho * rho) * rng.standard_normal(n)
        if shared_drift:
            common = rho * common + shared_drift * math.sqrt(1 - rho * rho) * rng.standard_normal()
        draws = rng.standard_normal(n)
        spikes = rng.random(n) < spike_prob
        # drawn only when used, so that runs without jitter keep their noise streams
        used = abs_noise_s or sleep_jitter_s
        jitter = rng.exponential(1.0, (2, n)) if used else np.zeros((2, n))
        for k, r in enumerate(ranks):
            f = sched.factor(k, step)
            c = (r.per_step_s + r.per_sample_s * int(sizes[k])) * math.exp(float(level[k]) + common)
            # the expected delays are real time spent: part of the noise-free time
            t = f * (c + abs_noise_s) + (sleep_jitter_s if f > 1 else 0.0)
            c = c * math.exp(noise * float(draws[k])) + abs_noise_s * float(jitter[0, k])
            m = f * c * (spike_factor if spikes[k] else 1.0)
            if f > 1:
                m += sleep_jitter_s * float(jitter[1, k])
            all_sizes[step, k], true_s[step, k], measured[step, k] = sizes[k], t, m
            est[k].add(int(sizes[k]), m)
        if (step + 1) % interval:
            continue
        keep = common_cut([e.change_cut() for e in est])
        reports = [e.report(keep) for e in est]
        rec = ctl.decide(
            step, sizes, [e.per_sample_s for e in reports], [e.rel_se for e in reports],
            [e.elasticity for e in reports], global_batch=global_batch,
        )  # fmt: skip
        records.append(rec)
        if rec.applied and rec.new_sizes != rec.old_sizes:
            sizes = np.asarray(rec.new_sizes, dtype=np.int64)
            for e in est:
                e.reset()
    return SimResult(all_sizes, true_s, measured, records)
