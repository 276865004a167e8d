"""Seeded synthetic data of any shape and size, generated a piece at a time."""

from __future__ import annotations

import numpy as np

from hethpc.data.sources.pieces import PIECE, Pieces


def synthetic_pieces(
    num_samples: int,
    sample_shape: tuple[int, ...],
    *,
    num_classes: int = 10,
    seed: int = 0,
    piece: int = PIECE,
    index: np.ndarray | None = None,
) -> Pieces:
    """Seeded synthetic data of any shape and size: class prototype plus unit noise, float32.

    Generated a piece at a time, so any size fits in memory.

    Args:
        index: if given, sorted indices of the samples to keep (the others are generated and
            dropped, so a sample is the same whichever subset it is drawn in).
    """
    rng = np.random.default_rng(seed)
    protos = rng.standard_normal((num_classes, *sample_shape)).astype(np.float32)
    for a in range(0, num_samples, piece):
        n = min(piece, num_samples - a)
        y = rng.integers(0, num_classes, n)
        x = protos[y] + rng.standard_normal((n, *sample_shape), dtype=np.float32)
        if index is not None:
            keep = index[np.searchsorted(index, a) : np.searchsorted(index, a + n)] - a
            if not len(keep):
                continue
            x, y = x[keep], y[keep]
        yield x, y
