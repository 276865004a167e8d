"""Opening a dataset on many ranks at once: each rank hashes a share of the shards."""

from __future__ import annotations

import os
from collections.abc import Sequence

from hethpc import comm
from hethpc.comm import Group
from hethpc.data.errors import DatasetError, ShardError
from hethpc.data.shards.sharded import ShardedDataset, open_dataset
from hethpc.data.shards.verify import hash_problems


def split_shards(num_bytes: Sequence[int], world_size: int) -> list[list[int]]:
    """Shard indices for each rank to hash, balanced by bytes (largest first, each to the rank
    with the fewest bytes so far; ties to the lower rank). Deterministic: every rank computes
    the same split.

    Args:
        num_bytes: each shard's size in bytes.
        world_size: number of ranks (>= 1).

    Returns:
        ``world_size`` lists of shard indices, each ascending; together every shard once.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    load = [0] * world_size
    out: list[list[int]] = [[] for _ in range(world_size)]
    for i in sorted(range(len(num_bytes)), key=lambda i: (-int(num_bytes[i]), i)):
        r = min(range(world_size), key=lambda r: (load[r], r))
        out[r].append(i)
        load[r] += int(num_bytes[i])
    return [sorted(v) for v in out]


def open_dataset_shared(
    path: str | os.PathLike[str],
    *,
    group: Group | None = None,
    locking: bool | None = None,
    cache_bytes: int = 128 << 20,
    chunk_checksums: bool | None = None,
) -> ShardedDataset:
    """:func:`~hethpc.data.open_dataset` with ``verify=True``, called by every rank of
    ``group`` at once: each rank hashes only its share of the shards (:func:`split_shards`), so
    the job reads the dataset once for its sha256 check instead of once per rank.

    Every rank still makes the cheap checks (manifest, files, sizes, shapes, dtypes, labels).
    The ranks then exchange what they found, and every rank raises the same error, naming
    every damaged file, or none. A collective: every rank of the group must call it.

    Args:
        path: the dataset directory (the same on every rank, e.g. on a shared filesystem).
        group: the ranks that open it together (default: the world).
        locking: see :func:`~hethpc.data.open_dataset`.
        cache_bytes: see :func:`~hethpc.data.open_dataset`.
        chunk_checksums: see :func:`~hethpc.data.open_dataset`; None (default): off, since
            every shard's sha256 was checked.

    Raises:
        CommError: this rank is not in ``group``.
        DatasetError: on every rank, when some rank found no valid manifest.
        ShardError: on every rank, when some rank found a damaged shard.
    """
    g = comm.world() if group is None else group
    if not g.is_member:
        raise comm.CommError(
            f"open_dataset_shared: rank {comm.rank()} is not in the group {list(g.ranks)}; only "
            "its members open the dataset together"
        )
    found: tuple[str, str] | None = None
    ds = None
    try:
        ds = open_dataset(path, verify=False, locking=locking, cache_bytes=cache_bytes)
    except (DatasetError, ShardError) as e:
        found = (type(e).__name__, str(e))
    else:
        mine = split_shards([s.num_bytes for s in ds.manifest.shards], g.size)[g.rank]
        bad = hash_problems(ds.root, ds.manifest, mine)
        if bad:
            found = ("ShardError", f"dataset {ds.root} is damaged:\n  " + "\n  ".join(bad))
    everyone = comm.allgather_object(found, group=g)
    reports = [r for r in everyone if r is not None]
    if reports:
        messages = list(dict.fromkeys(msg for _, msg in reports))  # unique, in rank order
        text = "\n".join(messages)
        if any(kind == "DatasetError" for kind, _ in reports):
            raise DatasetError(text)
        raise ShardError(text)
    assert ds is not None
    ds.chunk_checksums = False if chunk_checksums is None else bool(chunk_checksums)
    return ds
