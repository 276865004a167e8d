"""Epoch orders: seeded permutations that keep HDF5 chunk reads few (pure functions)."""

from __future__ import annotations

import numpy as np


def block_shuffle(
    indices: np.ndarray, *, chunk: int, window: int, seed: int, epoch: int
) -> np.ndarray:
    """A seeded permutation of ``indices`` that visits storage chunks in random order.

    Samples are grouped by storage chunk (``index // chunk``); the chunks are shuffled, then
    taken ``window`` at a time, and the samples inside each group of ``window`` chunks are
    shuffled. Any stretch of the result therefore touches about ``window`` chunks, so a reader
    that keeps that many chunks in memory reads every chunk once per epoch. ``chunk=1`` gives
    a uniformly random permutation.

    Args:
        indices: sample indices, shape ``[m]``.
        chunk: samples per storage chunk (>= 1).
        window: chunks shuffled together (>= 1); larger mixes more, costs more memory.
        seed: the same on every rank.
        epoch: a new order each epoch.

    Returns:
        The permuted indices, shape ``[m]``, int64.
    """
    return block_shuffle_windows(indices, chunk=chunk, window=window, seed=seed, epoch=epoch)[0]


def block_shuffle_windows(
    indices: np.ndarray, *, chunk: int, window: int, seed: int, epoch: int
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`block_shuffle`'s permutation and the window each of its positions belongs to.

    Returns:
        ``(order, windows)``: the permutation (the same as :func:`block_shuffle`'s) and, per
        position, its window's number (non-decreasing), both shape ``[m]``, int64.
    """
    idx = np.asarray(indices, dtype=np.int64).reshape(-1)
    rng = np.random.default_rng([int(seed), int(epoch)])
    uniq, inv = np.unique(idx // max(1, int(chunk)), return_inverse=True)
    chunk_rank = rng.permutation(len(uniq))
    group = chunk_rank[inv] // max(1, int(window))
    perm = np.lexsort((rng.random(len(idx)), group))
    return idx[perm], group[perm].astype(np.int64)


def segment_bounds(windows: np.ndarray) -> np.ndarray:
    """Start of every run of equal window numbers, then the length: ``[0, ..., m]``."""
    w = np.asarray(windows).reshape(-1)
    return np.r_[0, np.flatnonzero(w[1:] != w[:-1]) + 1, len(w)].astype(np.int64)


def rotate_chunks(order: np.ndarray, world_size: int, rank: int) -> np.ndarray:
    """SelDP's view of ``order``: cut into ``world_size`` chunks, starting at chunk ``rank``."""
    parts = np.array_split(order, world_size)
    return np.concatenate(parts[rank:] + parts[:rank])
