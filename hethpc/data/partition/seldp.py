"""SelDP partitioner: every rank walks the whole dataset as N chunks rotated by rank."""

from __future__ import annotations

import numpy as np

from hethpc.data.partition.base import Partitioner


class SelDPPartitioner(Partitioner):
    """Each rank gets every sample: a seeded shuffle cut into ``N`` chunks, rank ``r`` starting
    at chunk ``r`` (``r, r+1, ..., N-1, 0, ..., r-1``).

    Ranks that take local steps (SelSync) therefore see different samples at the same time,
    while each still covers the whole dataset. Not disjoint.
    """

    disjoint = False

    def assign(self, labels: np.ndarray, world_size: int, seed: int) -> list[np.ndarray]:
        perm = np.random.default_rng(seed).permutation(len(labels))
        chunks = np.array_split(perm, world_size)
        return [np.concatenate(chunks[r:] + chunks[:r]) for r in range(world_size)]
