"""Site partitioner: each rank holds whole sites (a text window's package), balanced by size."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hethpc.data.errors import PartitionError
from hethpc.data.partition.base import Partitioner


def assign_sites(sizes: np.ndarray, world_size: int, seed: int) -> list[np.ndarray]:
    """The sites (indices into ``sizes``) each rank holds: largest first, each onto the rank
    with the fewest samples so far (the lowest rank among equals); sites of equal size are
    taken in a ``default_rng(seed)`` order. Sites of size 0 go to no rank.

    Args:
        sizes: each site's number of samples, ``[s]``.
        world_size: number of ranks.
        seed: the same on every rank.

    Returns:
        One sorted int64 array of site indices per rank.
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    shuffled = np.random.default_rng(seed).permutation(len(sizes))
    order = shuffled[np.argsort(-sizes[shuffled], kind="stable")]
    loads = np.zeros(world_size, dtype=np.int64)
    held: list[list[int]] = [[] for _ in range(world_size)]
    for site in order[sizes[order] > 0].tolist():
        r = int(np.argmin(loads))
        held[r].append(site)
        loads[r] += sizes[site]
    return [np.sort(np.array(h, dtype=np.int64)) for h in held]


class SitePartitioner(Partitioner):
    """Rank ``r`` holds every sample of the sites :func:`assign_sites` gives it: whole sites,
    never a part of one, balanced by sample count (largest site first onto the least-loaded
    rank), deterministic from the seed. Shares are disjoint and their union is the whole
    dataset. How even they are depends on the sites: one site larger than the rest together
    makes one rank's share that large.

    Args:
        sites: every sample's site index, ``[n]`` (:attr:`~hethpc.data.ShardedDataset.sites`
            of a dataset written by ``hethpc-convert text``); None for data without sites,
            which :meth:`assign` refuses.
        names: the site names, for messages (default: ``site 0``, ``site 1``, ...).

    Raises:
        PartitionError: (from :meth:`assign`) no sites, sites that do not match the samples in
            number, or fewer sites with samples than ranks.
    """

    def __init__(
        self, *, sites: np.ndarray | None = None, names: Sequence[str] | None = None
    ) -> None:
        self.sites = None if sites is None else np.asarray(sites, dtype=np.int64).reshape(-1)
        self.names = None if names is None else list(names)

    def rank_sites(self, world_size: int, seed: int) -> list[np.ndarray]:
        """The site indices each rank holds (see :func:`assign_sites`).

        Raises:
            PartitionError: see the class.
        """
        if self.sites is None:
            raise PartitionError(
                "partition 'site' needs every sample's site, and this data has no site column; "
                "convert text with 'hethpc-convert text' (which stores one), or choose another "
                "partition"
            )
        if len(self.sites) and self.sites.min() < 0:
            raise PartitionError(f"site indices must be >= 0, got {int(self.sites.min())}")
        sizes = np.bincount(self.sites, minlength=len(self.names or ()))
        present = int((sizes > 0).sum())
        if present < world_size:
            raise PartitionError(
                f"partition 'site' gives each rank whole sites, and the data has {present} "
                f"site{'' if present == 1 else 's'} for {world_size} ranks; use at most "
                f"{present} ranks, or another partition (iid, dirichlet)"
            )
        return assign_sites(sizes, world_size, seed)

    def assign(self, labels: np.ndarray, world_size: int, seed: int) -> list[np.ndarray]:
        held = self.rank_sites(world_size, seed)
        assert self.sites is not None  # rank_sites refuses None
        if len(self.sites) != len(labels):
            raise PartitionError(
                f"{len(self.sites)} site indices for {len(labels)} samples; pass the sites of "
                "the same samples as the labels"
            )
        return [np.flatnonzero(np.isin(self.sites, h)) for h in held]

    def __repr__(self) -> str:
        n = "None" if self.sites is None else f"<{len(self.sites)} samples>"
        return f"SitePartitioner(sites={n})"
