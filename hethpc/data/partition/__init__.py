"""Partitioners: pure maps from (labels, world size, rank, seed) to a rank's sample indices."""

from __future__ import annotations

from typing import Any

from hethpc.data.errors import PartitionError
from hethpc.data.partition.base import Partitioner
from hethpc.data.partition.dirichlet import DirichletPartitioner
from hethpc.data.partition.iid import IIDPartitioner
from hethpc.data.partition.label_skew import LabelSkewPartitioner
from hethpc.data.partition.seldp import SelDPPartitioner
from hethpc.data.partition.site import SitePartitioner

PARTITIONERS: dict[str, type[Partitioner]] = {
    "iid": IIDPartitioner,
    "seldp": SelDPPartitioner,
    "labels": LabelSkewPartitioner,
    "dirichlet": DirichletPartitioner,
    "site": SitePartitioner,
}


def make_partitioner(name: str, **kwargs: Any) -> Partitioner:
    """Build a partitioner by name (``iid``, ``seldp``, ``labels``, ``dirichlet``, ``site``: the
    ``partition`` setting's names).

    Args:
        name: a key of :data:`PARTITIONERS`.
        **kwargs: the partitioner's keyword settings, passed through unchanged, e.g.
            ``labels_per_rank``, ``num_classes`` and ``allow_uncovered`` for ``labels``,
            ``alpha`` and ``min_size`` for ``dirichlet``, ``sites`` (every sample's site
            index) and ``names`` for ``site``.

    Raises:
        PartitionError: unknown name, or settings the partitioner does not take.
    """
    cls = PARTITIONERS.get(name)
    if cls is None:
        raise PartitionError(f"unknown partitioner {name!r}; choose one of {sorted(PARTITIONERS)}")
    try:
        return cls(**kwargs)
    except TypeError as e:
        raise PartitionError(f"partitioner {name!r} does not take {sorted(kwargs)}: {e}") from e


__all__ = ["PARTITIONERS", "Partitioner", "make_partitioner"]
