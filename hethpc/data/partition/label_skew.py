"""Label-skew partitioner: each rank holds the samples of k labels."""

from __future__ import annotations

import numpy as np

from hethpc.data.errors import PartitionError
from hethpc.data.partition.base import Partitioner


class LabelSkewPartitioner(Partitioner):
    """Rank ``r`` holds labels ``(r*k + j) mod C`` for ``j < k`` (``C`` classes).

    Rule when the classes do not divide evenly: labels are dealt in that round-robin order, so
    a label may be held by several ranks; its samples are then split (seeded shuffle, sizes
    differing by at most one) among the ranks that hold it, so shares stay disjoint. When
    ``N*k >= C`` every label is held and the union is the whole dataset; when ``N*k < C`` the
    labels no rank holds (``N*k .. C-1``) are left out.

    Args:
        labels_per_rank: ``k``, 1 <= k <= C.
        num_classes: ``C``; default: ``max(label) + 1``.
    """

    def __init__(self, *, labels_per_rank: int = 1, num_classes: int | None = None) -> None:
        if labels_per_rank < 1:
            raise PartitionError(f"labels_per_rank must be >= 1, got {labels_per_rank}")
        self.labels_per_rank = int(labels_per_rank)
        self.num_classes = num_classes

    def rank_labels(self, world_size: int, num_classes: int) -> list[list[int]]:
        """The labels each rank holds."""
        k = self.labels_per_rank
        return [sorted({(r * k + j) % num_classes for j in range(k)}) for r in range(world_size)]

    def assign(self, labels: np.ndarray, world_size: int, seed: int) -> list[np.ndarray]:
        c = int(self.num_classes or (int(labels.max()) + 1 if len(labels) else 0))
        if self.labels_per_rank > c:
            raise PartitionError(
                f"labels_per_rank={self.labels_per_rank} exceeds the {c} classes of the dataset"
            )
        held = self.rank_labels(world_size, c)
        rng = np.random.default_rng(seed)
        parts: list[list[np.ndarray]] = [[] for _ in range(world_size)]
        for label in range(c):
            holders = [r for r in range(world_size) if label in held[r]]
            idx = np.flatnonzero(labels == label)
            if not holders:
                continue
            idx = rng.permutation(idx)
            for r, piece in zip(holders, np.array_split(idx, len(holders)), strict=True):
                parts[r].append(piece)
        return [np.sort(np.concatenate(p)) if p else np.empty(0, np.int64) for p in parts]
