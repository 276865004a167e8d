"""The partitioner interface: (labels, world size, seed) -> one index array per rank."""

from __future__ import annotations

import abc

import numpy as np

from hethpc.data.errors import PartitionError


class Partitioner(abc.ABC):
    """Maps sample indices to ranks, deterministically from a seed and without communication.

    Every rank calls :meth:`indices` with the same labels, world size and seed and gets its own
    share of one global assignment, so the ranks agree without talking.

    Subclasses implement :meth:`assign`.
    """

    #: Whether the ranks' index arrays are disjoint.
    disjoint: bool = True

    @abc.abstractmethod
    def assign(self, labels: np.ndarray, world_size: int, seed: int) -> list[np.ndarray]:
        """Every rank's indices (int64 arrays), in rank order.

        Args:
            labels: every sample's label, shape ``[n]``.
            world_size: number of ranks.
            seed: the same on every rank.
        """

    def indices(self, labels: np.ndarray, world_size: int, rank: int, seed: int) -> np.ndarray:
        """The indices of rank ``rank``'s share.

        Raises:
            PartitionError: a rank would get no samples (the message names it), or the world
                size or rank is out of range.
        """
        parts = self.all_indices(labels, world_size, seed)
        if not 0 <= rank < world_size:
            raise PartitionError(f"rank {rank} is outside a world of size {world_size}")
        return parts[rank]

    def all_indices(self, labels: np.ndarray, world_size: int, seed: int) -> list[np.ndarray]:
        """:meth:`assign`, checked: every rank gets at least one sample.

        Raises:
            PartitionError: see :meth:`indices`.
        """
        if world_size < 1:
            raise PartitionError(f"world_size must be >= 1, got {world_size}")
        labels = np.asarray(labels).reshape(-1)
        parts = [np.asarray(p, dtype=np.int64) for p in self.assign(labels, world_size, seed)]
        empty = [r for r, p in enumerate(parts) if len(p) == 0]
        if empty:
            raise PartitionError(
                f"{type(self).__name__} leaves rank(s) {empty} with no samples "
                f"({len(labels)} samples over {world_size} ranks); use fewer ranks, more data, "
                "or other partitioner settings"
            )
        return parts

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({fields})"
