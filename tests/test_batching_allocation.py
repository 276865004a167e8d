"""Allocation math: proportional integer sizes, bounds, rounding and the dead-band (no MPI)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hethpc.batching import AllocationError
from hethpc.batching.allocation import (
    allocate,
    default_min_batch,
    exceeds_deadband,
    max_relative_change,
    uniform_sizes,
)


@pytest.mark.parametrize(
    ("B", "x", "kw", "expected"),
    [
        (128, [1, 1], {}, [64, 64]),
        (128, [3, 1], {}, [96, 32]),
        (128, [1, 3], {}, [32, 96]),
        (10, [1, 1, 1], {}, [4, 3, 3]),  # remainder 1 goes to the lowest rank on a tie
        (7, [1, 1, 1], {}, [3, 2, 2]),
        (100, [1, 2, 3, 4], {}, [10, 20, 30, 40]),
        (100, [2, 1, 1], {}, [50, 25, 25]),
        (11, [1.0, 1.1], {}, [5, 6]),  # 5.238 / 5.762: the larger remainder wins
        (10, [1, 0, 0], {}, [8, 1, 1]),  # zero throughput still gets b_min
        (100, [10, 1, 1], {"b_max": 50}, [50, 25, 25]),  # clamped excess shared by the others
        (100, [10, 1, 1], {"b_max": [60, 100, 100]}, [60, 20, 20]),
        (30, [100, 1, 1], {"b_min": 5}, [20, 5, 5]),
        (30, [100, 1, 1], {"b_min": [1, 8, 2]}, [20, 8, 2]),
        (6, [5, 1, 1], {"b_min": 2}, [2, 2, 2]),  # B == sum(b_min): only one answer
        (9, [5, 1, 1], {"b_max": 3}, [3, 3, 3]),  # B == sum(b_max)
        (1000, [1e-9, 1e9], {}, [1, 999]),
        (5, [7.0], {}, [5]),
    ],
    ids=[
        "equal", "3to1", "1to3", "tie-low-rank", "7-over-3", "1234", "2-1-1", "largest-remainder",
        "zero-throughput", "clamp-max", "clamp-max-per-rank", "clamp-min", "clamp-min-per-rank",
        "all-at-min", "all-at-max", "extreme-ratio", "one-rank",
    ],
)
def test_allocate(B: int, x: list[float], kw: dict, expected: list[int]) -> None:
    got = allocate(B, x, **kw)
    assert got.dtype == np.int64
    assert got.tolist() == expected


@pytest.mark.parametrize(
    ("B", "x", "kw", "match"),
    [
        (1, [1, 1], {}, "cannot give each of the 2 ranks its minimum"),
        (10, [1, 1], {"b_min": 6}, "at least 12"),
        (10, [1, 1], {"b_max": 4}, "exceeds what the 2 ranks may hold"),
        (10, [1, 1], {"b_min": 5, "b_max": [4, 10]}, r"b_min > b_max on rank\(s\) \[0\]"),
        (10, [1, 1], {"b_min": 0}, "at least 1 on every rank"),
        (10, [1, 1], {"b_max": [5, 5, 5]}, "3 entries but there are 2 ranks"),
        (10, [1, -1], {}, "rank 1: -1.0"),
        (10, [1, math.nan], {}, "rank 1: nan"),
        (10, [math.inf, 1], {}, "rank 0: inf"),
        (10, [0, 0], {}, "at least one throughput must be positive"),
        (10, [], {}, "at least one rank"),
        (10, [1, 0], {"b_max": 5}, r"rank\(s\) \[1\] have zero throughput"),
    ],
    ids=[
        "B-below-world", "B-below-min", "B-above-max", "crossed-bounds", "b_min-zero",
        "bounds-length", "negative", "nan", "inf", "all-zero", "no-ranks", "zero-rank-cannot-fill",
    ],
)
def test_allocate_errors(B: int, x: list[float], kw: dict, match: str) -> None:
    with pytest.raises(AllocationError, match=match):
        allocate(B, x, **kw)


def test_allocation_error_is_a_value_error() -> None:
    assert issubclass(AllocationError, ValueError)


@pytest.mark.parametrize("seed", range(20), ids=lambda s: f"seed{s}")
def test_allocate_properties_on_random_inputs(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 9))
    x = rng.uniform(0.1, 10, n)
    lo = rng.integers(1, 5, n)
    hi = lo + rng.integers(0, 60, n)
    B = int(rng.integers(lo.sum(), hi.sum() + 1))
    got = allocate(B, x, b_min=lo, b_max=hi)
    assert int(got.sum()) == B
    assert np.all(got >= lo) and np.all(got <= hi)
    # Among unclamped ranks, sizes follow throughput to within one sample of rounding.
    free = (got > lo) & (got < hi)
    if free.sum() >= 2:
        lam = got[free].sum() / x[free].sum()
        assert np.all(np.abs(got[free] - lam * x[free]) <= 1 + 1e-9)
    # Deterministic: the same inputs give the same vector, as every rank must compute.
    assert allocate(B, x.copy(), b_min=lo, b_max=hi).tolist() == got.tolist()


def test_allocate_unbounded_matches_proportional_shares() -> None:
    x = np.array([3.7, 1.2, 8.9, 0.4])
    got = allocate(1000, x)
    np.testing.assert_allclose(got, 1000 * x / x.sum(), atol=1)


@pytest.mark.parametrize(
    ("B", "n", "expected"),
    [(128, 2, [64, 64]), (10, 3, [4, 3, 3]), (4, 4, [1, 1, 1, 1])],
    ids=["even", "remainder", "one-each"],
)
def test_uniform_sizes(B: int, n: int, expected: list[int]) -> None:
    assert uniform_sizes(B, n).tolist() == expected


def test_uniform_sizes_refuses_batch_below_world() -> None:
    with pytest.raises(AllocationError, match="at least 3"):
        uniform_sizes(2, 3)


@pytest.mark.parametrize(
    ("old", "new", "change", "adopt"),
    [
        ([64, 64], [64, 64], 0.0, False),
        ([64, 64], [67, 61], 3 / 64, False),  # 4.7 %: inside the 5 % band
        ([64, 64], [68, 60], 4 / 64, True),  # 6.25 %
        ([96, 32], [95, 33], 1 / 32, False),
        ([96, 32], [94, 34], 2 / 32, True),
        ([20, 20], [21, 19], 0.05, False),  # exactly 5 % is not "exceeds"
    ],
    ids=["same", "inside-band", "outside-band", "small-rank-1", "small-rank-2", "on-the-edge"],
)
def test_deadband(old: list[int], new: list[int], change: float, adopt: bool) -> None:
    assert max_relative_change(old, new) == pytest.approx(change)
    assert exceeds_deadband(old, new, 0.05) is adopt


def test_deadband_zero_adopts_any_change() -> None:
    assert exceeds_deadband([64, 64], [65, 63], 0.0)


@pytest.mark.parametrize(
    ("old", "new", "band", "match"),
    [
        ([1, 2], [3], 0.05, "differ in length"),
        ([0, 2], [1, 1], 0.05, "must be positive"),
        ([1, 1], [1, 1], 1.5, r"deadband must be in \[0, 1\)"),
    ],
    ids=["length", "zero-old", "band-range"],
)
def test_deadband_errors(old: list[int], new: list[int], band: float, match: str) -> None:
    with pytest.raises(AllocationError, match=match):
        exceeds_deadband(old, new, band)


@pytest.mark.parametrize(
    ("B", "n", "expected"),
    [(128, 2, 16), (128, 1, 32), (256, 8, 8), (10, 4, 1), (3, 3, 1)],
    ids=["demo", "one-rank", "eight-ranks", "rounds-down", "at-least-one"],
)
def test_default_min_batch_is_a_quarter_of_the_uniform_share(B: int, n: int, expected: int) -> None:
    assert default_min_batch(B, n) == expected
    assert n * default_min_batch(B, n) <= B  # always leaves room to allocate


@pytest.mark.parametrize(
    ("B", "n", "expected"), [(128, 2, 8), (128, 1, 16), (256, 8, 4), (10, 4, 1)],
    ids=["bench-tta", "one-rank", "eight-ranks", "at-least-one"],
)  # fmt: skip
def test_default_min_batch_on_iid_data_is_an_eighth(B: int, n: int, expected: int) -> None:
    assert default_min_batch(B, n, skewed=False) == expected
