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
    ``N*k >= C`` every label is held and the union is the whole dataset. When ``N*k < C`` the
    labels ``N*k .. C-1`` would be on no rank: a model trained on such a partition never sees
    them, so that partition is refused unless ``allow_uncovered`` asks for it (the labels no
    rank holds are then left out). Labels without samples do not count.

    Args:
        labels_per_rank: ``k``, 1 <= k <= C.
        num_classes: ``C``; default: ``max(label) + 1``.
        allow_uncovered: accept a partition that leaves labels on no rank.

    Raises:
        PartitionError: ``labels_per_rank < 1``; from :meth:`assign`: ``k > C``, a label
            outside ``0 .. C-1``, or (without ``allow_uncovered``) labels on no rank, named
            with the smallest ``k`` that covers them all.
    """

    def __init__(
        self,
        *,
        labels_per_rank: int = 1,
        num_classes: int | None = None,
        allow_uncovered: bool = False,
    ) -> None:
        if labels_per_rank < 1:
            raise PartitionError(f"labels_per_rank must be >= 1, got {labels_per_rank}")
        self.labels_per_rank = int(labels_per_rank)
        self.num_classes = num_classes
        self.allow_uncovered = bool(allow_uncovered)

    def rank_labels(self, world_size: int, num_classes: int) -> list[list[int]]:
        """The labels each rank holds."""
        k = self.labels_per_rank
        return [sorted({(r * k + j) % num_classes for j in range(k)}) for r in range(world_size)]

    def assign(self, labels: np.ndarray, world_size: int, seed: int) -> list[np.ndarray]:
        c = int(self.num_classes or (int(labels.max()) + 1 if len(labels) else 0))
        if self.labels_per_rank > c:
            raise PartitionError(
                f"labels_per_rank={self.labels_per_rank} exceeds the {c} classes of the dataset; "
                f"use at most {c}"
            )
        outside = sorted({int(v) for v in labels[(labels < 0) | (labels >= c)]})
        if outside:
            raise PartitionError(
                f"labels {outside} are outside 0..{c - 1} (num_classes={c}); pass the dataset's "
                "number of classes as num_classes, or leave it unset"
            )
        held = self.rank_labels(world_size, c)
        counts = np.bincount(labels.astype(np.int64, copy=False), minlength=c)
        uncovered = sorted(set(np.flatnonzero(counts).tolist()) - {x for h in held for x in h})
        if uncovered and not self.allow_uncovered:
            k = -(-c // max(world_size, 1))  # the smallest k with world_size * k >= c
            ranks = f"{world_size} rank{'' if world_size == 1 else 's'}"
            lost = int(counts[uncovered].sum())
            raise PartitionError(
                f"labels_per_rank={self.labels_per_rank} on {ranks} leaves {_classes(uncovered)} "
                f"on no rank ({lost} of {len(labels)} samples would never be trained on); "
                f"--labels-per-rank {k} or more covers all {c} classes on {ranks}, or pass "
                "allow_uncovered=True (--allow-uncovered) to leave them out"
            )
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


def _classes(values: list[int]) -> str:
    """``class 9``, ``classes [4, 5, 6]``; past 12, runs of three or more as ``a-b``."""
    if len(values) == 1:
        return f"class {values[0]}"
    if len(values) <= 12:
        return f"classes {values}"
    out: list[str] = []
    start = 0
    for i in range(1, len(values) + 1):
        if i == len(values) or values[i] != values[i - 1] + 1:
            run = values[start:i]
            out += [f"{run[0]}-{run[-1]}"] if len(run) >= 3 else [str(v) for v in run]
            start = i
    return f"{len(values)} classes [{', '.join(out)}]"
