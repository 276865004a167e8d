"""The control rule on simulated noisy ranks (no MPI): balance, stillness, rebalancing.

Ranks cost ``2 ms + 0.25 ms per sample`` per step (measured for the benchmark's CNN on one
core), times lognormal noise of sigma 0.10-0.30 and 2-5 % spikes of 3x. The figures are taken
on the noise-free times, so they say how good the sizes really are. Tolerances are what the
statistics allow: at 25 % noise a 10-step estimate of a rank's speed is itself about +-9 %
(one sigma), so right after a change the sizes can only be within about 30 %, and within 10-15 %
once a longer window has been measured; a rank holding 8-16 samples moves in steps of 6-12 %.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

from hethpc.batching.allocation import allocate
from hethpc.batching.estimate import TimeEstimator, common_cut, trimmed_log_mean

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from _dynbatch_simulate import SimRank, ideal_sizes, simulate  # noqa: E402

R = SimRank(per_sample_s=0.25e-3, per_step_s=2e-3)
SEEDS = [0, 1, 2]


def test_trimmed_log_mean_ignores_spikes() -> None:
    clean = [1.0, 1.1, 0.9, 1.05, 0.95, 1.0, 1.02, 0.98, 1.0, 1.0]
    spiky = [*clean[:-2], 50.0, 40.0]
    m, se = trimmed_log_mean(spiky, 0.2)
    assert math.exp(m) == pytest.approx(1.0, abs=0.03) and se < 0.05
    assert trimmed_log_mean([2.0], 0.2) == (pytest.approx(math.log(2.0)), 0.0)


def test_estimator_drops_old_steps_on_a_real_change_only() -> None:
    rng = np.random.default_rng(0)
    e = TimeEstimator()
    for _ in range(5):  # 50 steady steps in 5 reports: the window grows
        for t in np.exp(0.2 * rng.standard_normal(10)):
            e.add(10, float(t))
        steady = e.report()
    assert steady.steps == 50 and steady.per_sample_s == pytest.approx(0.1, rel=0.1)
    for t in 3 * np.exp(0.2 * rng.standard_normal(10)):
        e.add(10, float(t))
    changed = e.report()
    assert changed.steps == 10 and changed.per_sample_s == pytest.approx(0.3, rel=0.15)


def test_estimator_learns_elasticity_and_round_trips() -> None:
    e = TimeEstimator()
    for b in (64, 96):
        for _ in range(10):
            e.add(b, 2e-3 + 0.25e-3 * b)
        est = e.report()
        e.reset() if b == 64 else None
    # d log t / d log b between 64 and 96 samples of 2 ms + 0.25 ms each
    expected = math.log(26 / 18) / math.log(96 / 64)
    assert est.elasticity == pytest.approx(expected)
    copy = TimeEstimator()
    copy.load_state_dict(e.state_dict())
    assert copy.state_dict() == e.state_dict() and copy.report() == e.report()


@pytest.mark.parametrize(
    ("ranks", "slowdown", "noise", "spikes", "tol"),
    [
        ([R, R], "1:3", 0.10, 0.0, 0.10),
        ([R, R], "1:3", 0.25, 0.02, 0.15),
        ([R, R], "1:3", 0.30, 0.05, 0.15),
        # the 4x rank holds 14-16 samples and one-sample moves are held (min_change)
        ([R, R, R], "1:2,2:4", 0.25, 0.02, 0.15),
        # the 3x rank holds 8 samples: one sample is 12 % of its time
        ([R, R, R, R], "3:3", 0.25, 0.02, 0.15),
    ],
    ids=["2r-3x-noise10", "2r-3x-noise25", "2r-3x-noise30-spikes5", "3r-2x-4x", "4r-3x"],
)
@pytest.mark.parametrize("seed", SEEDS)
def test_balanced_within_three_adjustments_from_uniform(
    ranks: list[SimRank], slowdown: str, noise: float, spikes: float, tol: float, seed: int
) -> None:
    r = simulate(
        128, ranks, steps=400, slowdown=slowdown, noise=noise, spike_prob=spikes, seed=seed
    )
    f = r.phase(0, 400, tol)
    assert f.balanced_at is not None, f
    assert f.adjustments_to_balance <= 3, f
    assert f.final_imbalance <= tol, f


@pytest.mark.parametrize(
    ("ranks", "factors", "slowdown", "noise", "spikes"),
    [
        ([R, R], [1, 1], None, 0.25, 0.02),
        ([R, R], [1, 3], "1:3", 0.25, 0.02),
        ([R, R], [1, 3], "1:3", 0.30, 0.05),
        ([R, R, R, R], [1, 1, 1, 1], None, 0.25, 0.02),
        ([R, R, R, R], [1, 1, 1, 3], "3:3", 0.25, 0.0),
    ],
    ids=["2r-equal", "2r-3x", "2r-3x-noise30", "4r-equal", "4r-3x"],
)
@pytest.mark.parametrize("seed", SEEDS)
def test_no_adjustment_in_steady_phases(
    ranks: list[SimRank],
    factors: list[float],
    slowdown: str | None,
    noise: float,
    spikes: float,
    seed: int,
) -> None:
    start = allocate(128, ideal_sizes(128, ranks, factors))
    r = simulate(
        128,
        ranks,
        steps=500,
        slowdown=slowdown,
        noise=noise,
        spike_prob=spikes,
        seed=seed,
        start=start,
    )
    adopted = [(a.step, a.new_sizes) for a in r.adjustments if a.applied]
    assert adopted == [] and len(r.adjustments) == 50


@pytest.mark.parametrize(
    ("noise", "spikes", "tol"),
    [(0.10, 0.0, 0.15), (0.25, 0.02, 0.30)],
    ids=["noise10", "noise25"],
)
@pytest.mark.parametrize("seed", SEEDS)
def test_rebalanced_within_two_intervals_of_a_3x_change(
    noise: float, spikes: float, tol: float, seed: int
) -> None:
    S = 200
    r = simulate(
        128,
        [R, R],
        steps=3 * S,
        slowdown=f"1:3@0,1:1@{S},1:3@{2 * S}",
        noise=noise,
        spike_prob=spikes,
        seed=seed,
    )
    for start in (S, 2 * S):
        f = r.phase(start, start + S, tol)
        assert f.intervals_to_balance is not None and f.intervals_to_balance <= 2, (start, f)
        assert f.steady_adjustments <= 1, (start, f)  # at most one later fine correction
        assert r.phase(start, start + S, 0.10).final_imbalance <= 0.10


@pytest.mark.parametrize("seed", SEEDS)
def test_four_ranks_one_3x_slower_converge_near_the_ideal_split(seed: int) -> None:
    ranks = [R, R, R, R]
    r = simulate(128, ranks, steps=500, slowdown="1:3", noise=0.25, spike_prob=0.02, seed=seed)
    ideal = ideal_sizes(128, ranks, [1, 3, 1, 1])  # [40, 8, 40, 40]
    final = np.asarray(r.phase(0, 500).final_sizes)
    assert np.abs(final - ideal).max() <= 2, (final.tolist(), ideal.tolist())
    assert final[1] >= 6  # the slow rank keeps a fair share (not starved to 1)


# The emulation's timing (benchmarks/bench_dynbatch.py: cnn1d(192) on one core, about 1.6 ms +
# 0.18 ms per sample): an exponential delay added to every step (timer and scheduler jitter, so
# the noise is larger, relatively, at small batches) and, on the slowed rank, the sleep's late
# wake-up. The delays' means are real time: the ideal split moves from [100, 28] to about
# [107, 21] (3 ms) or [110, 18] (5 ms).
EMU = SimRank(per_sample_s=0.18e-3, per_step_s=1.6e-3)
EMULATION = {
    "abs-jitter-1ms": {"noise": 0.10, "abs_noise_s": 1e-3},
    "sleep-jitter-3ms": {"noise": 0.10, "abs_noise_s": 0.5e-3, "sleep_jitter_s": 3e-3},
    "sleep-jitter-5ms-noise15": {"noise": 0.15, "abs_noise_s": 1e-3, "sleep_jitter_s": 5e-3},
}


@pytest.mark.parametrize("case", list(EMULATION), ids=list(EMULATION))
@pytest.mark.parametrize("seed", SEEDS)
def test_emulated_slowdown_balances_and_holds(case: str, seed: int) -> None:
    r = simulate(
        128, [EMU, EMU], steps=400, slowdown="1:3", spike_prob=0.02, seed=seed, **EMULATION[case]
    )
    f = r.phase(0, 400, 0.15)
    assert f.balanced_at is not None and f.adjustments_to_balance <= 3, f
    assert f.steady_adjustments <= 1 and f.final_imbalance <= 0.10, f
    assert r.sizes[f.balanced_at :, 1].min() >= 12, f  # the slow rank's batch does not swing


@pytest.mark.parametrize("case", ["abs-jitter-1ms", "sleep-jitter-3ms"])
@pytest.mark.parametrize("seed", SEEDS)
def test_emulated_3x_changes_rebalance_within_two_intervals(case: str, seed: int) -> None:
    S = 100  # the benchmark's phases: 3x, 1x from step 100, 3x from step 200
    r = simulate(
        128,
        [EMU, EMU],
        steps=3 * S,
        slowdown=f"1:3@0,1:1@{S},1:3@{2 * S}",
        spike_prob=0.02,
        seed=seed,
        **EMULATION[case],
    )
    for start in (S, 2 * S):
        f = r.phase(start, start + S, 0.15)
        assert f.intervals_to_balance is not None and f.intervals_to_balance <= 2, (start, f)
        assert f.steady_adjustments <= 1 and f.final_imbalance <= 0.10, (start, f)


def test_drift_and_jitter_are_part_of_the_true_time() -> None:
    r = simulate(
        64, [EMU, EMU], steps=2000, noise=0.0, drift=0.1, interval=10**6, sleep_jitter_s=3e-3
    )
    per_step = np.log(r.true_s[:, 0] / (EMU.per_step_s + EMU.per_sample_s * 32))
    assert per_step.std() == pytest.approx(0.1, rel=0.3)  # the drift's stationary sigma
    assert np.corrcoef(per_step[:-1], per_step[1:])[0, 1] > 0.9  # slowly varying
    slow = simulate(64, [EMU, EMU], steps=5, noise=0.0, slowdown="1:3", sleep_jitter_s=3e-3)
    assert slow.true_s[0, 1] == pytest.approx(3 * (1.6e-3 + 0.18e-3 * 32) + 3e-3)


@pytest.mark.parametrize(
    ("cuts", "expected"),
    [([0, 0], 0), ([0, 10], 10), ([20, 10], 10), ([40, 0, 20], 20)],
    ids=["none", "one-rank", "shortest", "three-ranks"],
)
def test_common_cut_is_the_shortest_detected(cuts: list[int], expected: int) -> None:
    assert common_cut(cuts) == expected


def test_estimator_keeps_the_common_cut_it_is_given() -> None:
    e = TimeEstimator()
    for t in [1.0] * 40:
        e.add(1, t)
    assert e.report().steps == 40
    for t in [2.0] * 10:
        e.add(1, t)
    assert e.change_cut() == 10  # the last report's steps differ: keep them
    assert e.report(keep=0).steps == 50  # another rank saw no change and none was agreed


# The benchmark's regime (cnn1d(192), global batch 1024): about 1.5 ms + 0.2 ms per sample.
BIG = SimRank(per_sample_s=0.2e-3, per_step_s=1.5e-3)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_slow_spell_of_the_whole_host_moves_no_sizes(seed: int) -> None:
    # Both ranks slow down and speed up together by about 25 % over tens of steps. A rank that
    # cut its window alone (its own change test) would compare its short window with the other
    # rank's long one and move the sizes: 2-5 adjustments in 300 steps for these seeds.
    r = simulate(
        1024, [BIG, BIG], steps=300, slowdown="1:3", noise=0.15, shared_drift=0.25, seed=seed
    )
    f = r.phase(0, 300, 0.10)
    assert f.balanced_at is not None and f.adjustments_to_balance <= 3, f
    assert f.steady_adjustments == 0, f
