"""IID partitioner: a seeded shuffle cut into disjoint, (nearly) equal shares."""

from __future__ import annotations

import numpy as np

from hethpc.data.partition.base import Partitioner


class IIDPartitioner(Partitioner):
    """Disjoint shares after a seeded shuffle; share sizes differ by at most one sample.

    The union of the shares is the whole dataset.
    """

    def assign(self, labels: np.ndarray, world_size: int, seed: int) -> list[np.ndarray]:
        perm = np.random.default_rng(seed).permutation(len(labels))
        return list(np.array_split(perm, world_size))
