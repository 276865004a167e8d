"""A validation split held out of the training samples: drawn once, the same on every rank."""

from __future__ import annotations

import numpy as np

from hethpc.data.adapt import in_memory
from hethpc.data.arrays import ArrayDataset
from hethpc.data.errors import DatasetError
from hethpc.data.shards.sharded import ShardedDataset


def holdout_indices(n: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(kept, held)``: ascending sample indices of ``range(n)``, ``round(fraction * n)`` held.

    A function of ``(n, fraction, seed)`` alone, so every rank draws the same split without
    talking, and a run with a different model, method or world size holds out the same samples.

    Raises:
        DatasetError: the split would leave no sample on either side.
    """
    held_n = int(round(fraction * n))
    if fraction > 0 and not 0 < held_n < n:
        raise DatasetError(
            f"a validation split of {fraction} of {n} training samples holds {held_n}; "
            "choose a fraction that leaves samples on both sides (val_fraction)"
        )
    order = np.random.default_rng(seed).permutation(n)
    return np.sort(order[held_n:]), np.sort(order[:held_n])


def holdout(
    train: ArrayDataset | ShardedDataset, fraction: float, seed: int
) -> tuple[np.ndarray, ArrayDataset]:
    """The kept training indices and the held-out samples, read into memory for evaluation.

    The training set itself is left whole; a loader given the kept indices (and a partitioner
    whose indices are filtered by them) never draws a held-out sample.
    """
    kept, held = holdout_indices(len(train), fraction, seed)
    if isinstance(train, ArrayDataset):
        return kept, ArrayDataset(train.x[held], train.y[held], train.num_classes, train.task)
    return kept, in_memory(train, held)
