"""What every source reader shares: pieces of ``(x, y)``, the holdout split, the pair check."""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

from hethpc.data.errors import DatasetError, SourceError

Pieces = Iterator[tuple[np.ndarray, np.ndarray]]
PIECE = 8192  # samples per piece


def holdout(
    num_samples: int, *, test_fraction: float, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """A seeded split of ``range(num_samples)`` into train and test indices.

    ``round(num_samples * (1 - test_fraction))`` samples of a ``default_rng(seed)`` permutation
    go to train, the rest to test; each side is sorted, so reads stay in source order.

    Returns:
        Train and test indices, int64 ``[k]`` and ``[num_samples - k]``.

    Raises:
        ValueError: ``test_fraction`` is not finite and in ``[0, 1)``.
    """
    if not (math.isfinite(test_fraction) and 0 <= test_fraction < 1):
        raise ValueError(f"test_fraction must be finite and in [0, 1), got {test_fraction}")
    perm = np.random.default_rng(seed).permutation(num_samples)
    k = int(round(num_samples * (1 - test_fraction)))
    return np.sort(perm[:k]), np.sort(perm[k:])


def pieces_of(
    x: np.ndarray, y: np.ndarray, *, piece: int = PIECE, index: np.ndarray | None = None
) -> Pieces:
    """``(x, y)`` in slices of ``piece`` samples (views of memory-mapped arrays stay lazy).

    Args:
        x: samples ``[n, ...]``.
        y: labels ``[n]``.
        piece: samples per piece.
        index: if given, only these samples (in this order), read ``piece`` at a time.

    Raises:
        DatasetError: ``x`` and ``y`` differ in length.
    """
    if len(x) != len(y):
        raise DatasetError(f"x has {len(x)} samples but y has {len(y)} labels")
    if index is None:
        for a in range(0, len(y), piece):
            yield np.asarray(x[a : a + piece]), np.asarray(y[a : a + piece]).astype(np.int64)
        return
    for a in range(0, len(index), piece):
        i = index[a : a + piece]
        yield np.asarray(x[i]), np.asarray(y[i]).astype(np.int64)


def check_pair(x: np.ndarray, y: np.ndarray, xs: str, ys: str) -> None:
    """Refuse samples ``x`` and labels ``y`` unfit for a dataset; ``xs``, ``ys`` name them."""
    if x.ndim < 1:
        raise SourceError(f"{xs} has shape (); expected samples of shape [n, ...]")
    if y.ndim != 1:
        raise SourceError(f"{ys} has shape {y.shape}; expected labels of shape [n]")
    whole = y.dtype.kind in "biu" or (y.dtype.kind == "f" and bool(np.all(np.mod(y, 1) == 0)))
    if not whole:
        raise SourceError(f"{ys} has dtype {y.dtype} (not whole numbers); expected class labels")
    if len(x) != len(y):
        raise SourceError(f"{xs} holds {len(x)} samples but {ys} holds {len(y)} labels; "
                          "expected one label per sample")
    if len(y) == 0:
        raise SourceError(f"{ys} holds no samples; expected at least one")
