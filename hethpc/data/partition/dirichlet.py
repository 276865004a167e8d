"""Dirichlet partitioner: per label, shares drawn from Dirichlet(alpha), with a minimum size."""

from __future__ import annotations

import numpy as np

from hethpc.data.errors import PartitionError
from hethpc.data.partition.base import Partitioner


class DirichletPartitioner(Partitioner):
    """For each label, the fractions of its samples given to the ``N`` ranks are drawn from
    ``Dirichlet(alpha * ones(N))``; small ``alpha`` gives skewed shares, large ``alpha`` nearly
    IID ones. Shares are disjoint and their union is the whole dataset: every sample of every
    label goes to some rank, so unlike :class:`LabelSkewPartitioner` no label can be left on no
    rank, however small ``alpha`` (it takes no ``allow_uncovered``).

    A draw whose smallest share is below ``min_size`` is redrawn, at most ``max_retries`` times.

    Args:
        alpha: concentration, > 0.
        min_size: smallest acceptable share (samples).
        max_retries: draws tried before giving up.

    Raises:
        PartitionError: (from :meth:`assign`) no draw met ``min_size``.
    """

    def __init__(self, *, alpha: float = 0.5, min_size: int = 10, max_retries: int = 100) -> None:
        if not alpha > 0:
            raise PartitionError(f"alpha must be > 0, got {alpha}")
        if min_size < 0 or max_retries < 1:
            raise PartitionError(
                f"min_size must be >= 0 and max_retries >= 1, got {min_size}, {max_retries}"
            )
        self.alpha = float(alpha)
        self.min_size = int(min_size)
        self.max_retries = int(max_retries)

    def assign(self, labels: np.ndarray, world_size: int, seed: int) -> list[np.ndarray]:
        rng = np.random.default_rng(seed)
        by_label = [rng.permutation(np.flatnonzero(labels == c)) for c in np.unique(labels)]
        smallest = 0
        for _ in range(self.max_retries):
            parts: list[list[np.ndarray]] = [[] for _ in range(world_size)]
            for idx in by_label:
                p = rng.dirichlet(np.full(world_size, self.alpha))
                cuts = (np.cumsum(p)[:-1] * len(idx)).astype(np.int64)
                for r, piece in enumerate(np.split(idx, cuts)):
                    parts[r].append(piece)
            out = [np.sort(np.concatenate(p)) for p in parts]
            smallest = min(len(p) for p in out)
            if smallest >= self.min_size:
                return out
        raise PartitionError(
            f"Dirichlet(alpha={self.alpha}) gave a rank fewer than min_size={self.min_size} "
            f"samples in {self.max_retries} draws (last smallest share: {smallest}) for "
            f"{len(labels)} samples over {world_size} ranks; raise alpha, lower min_size, or "
            "use fewer ranks"
        )
