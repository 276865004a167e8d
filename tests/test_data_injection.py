"""Injection arithmetic (pure): local batch, share size, seeded senders."""

from __future__ import annotations

import numpy as np
import pytest

from hethpc.data import Injector
from hethpc.data.injection import local_batch_size, senders, share_size


@pytest.mark.parametrize(
    ("b", "alpha", "beta", "n", "want"),
    [
        (64, 0.5, 0.5, 4, 32),  # 64 / (1 + 1)
        (100, 0.25, 0.2, 4, 83),  # 100 / 1.2 = 83.3
        (64, 0.0, 0.5, 4, 64),  # injection off
        (64, 1.0, 1.0, 1, 64),  # one rank: nobody to receive from
        (1, 1.0, 1.0, 8, 1),  # never below one sample
    ],
    ids=["half", "round-down", "alpha0", "world1", "floor1"],
)
def test_local_batch(b: int, alpha: float, beta: float, n: int, want: int) -> None:
    assert local_batch_size(b, alpha, beta, n) == want


def test_share_size_rounds_and_caps() -> None:
    assert [share_size(b, 0.25) for b in (0, 1, 2, 4, 10)] == [0, 0, 1, 1, 3]
    assert share_size(3, 1.0) == 3


@pytest.mark.parametrize(("alpha", "n", "k"), [(0.5, 4, 2), (0.3, 4, 2), (1.0, 3, 3), (0.0, 5, 0)])
def test_senders_count_and_determinism(alpha: float, n: int, k: int) -> None:
    draws = [senders(alpha, n, step, seed=3) for step in range(200)]
    assert all(len(d) == k and len(set(d.tolist())) == k for d in draws)
    np.testing.assert_array_equal(senders(alpha, n, 17, seed=3), draws[17])
    if 0 < k < n:  # every rank gets to send, about k/n of the steps
        freq = np.bincount(np.concatenate(draws), minlength=n) / 200
        np.testing.assert_allclose(freq, k / n, atol=0.12)


def test_bad_fractions() -> None:
    with pytest.raises(ValueError, match="alpha and beta must lie in"):
        Injector(1.5, 0.1)
