"""The chunk cache: decoded HDF5 chunks in one slab of slots (LRU), and gathers through it."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

from hethpc.data.errors import ShardError

# Reads samples ``a .. b-1`` of a shard into ``dest``: ``read_into(shard, a, b, dest)``.
ReadInto = Callable[[int, int, int, np.ndarray], None]


class ChunkCache:
    """Decoded chunks of a dataset's shards, kept in a slab of equal slots (allocated on first
    use) and evicted least recently used first.

    Args:
        nslots: chunks kept (>= 1).
        chunk: samples per chunk.
        sample_shape: shape of one sample.
        dtype: dtype of the samples.
        sizes: samples in each shard (its last chunk may be partial).
    """

    def __init__(
        self, nslots: int, chunk: int, sample_shape: tuple[int, ...], dtype: np.dtype[Any],
        sizes: np.ndarray,
    ) -> None:
        self.nslots, self.chunk = int(nslots), int(chunk)
        self.sample_shape, self.dtype, self.sizes = sample_shape, dtype, sizes
        self.slab: np.ndarray | None = None
        self.lru: OrderedDict[int, int] = OrderedDict()  # key -> slot, least recent first
        self.free = list(range(self.nslots))[::-1]

    def __contains__(self, key: int) -> bool:
        return key in self.lru

    def clear(self) -> None:
        """Drop every chunk and the slab."""
        self.lru.clear()
        self.slab = None
        self.free = list(range(self.nslots))[::-1]

    def slots(self, keys: list[int], read_into: ReadInto) -> np.ndarray:
        """Slots holding chunks ``keys`` (``shard << 32 | chunk``), reading missing ones with
        ``read_into`` (a slot whose read fails with ShardError is freed again).

        At most :attr:`nslots` keys; none of them is evicted by the others.
        """
        if self.slab is None:
            self.slab = np.empty((self.nslots, self.chunk, *self.sample_shape), self.dtype)
        slots = np.empty(len(keys), dtype=np.int64)
        missing = []
        for i, k in enumerate(keys):
            slot = self.lru.get(k)
            if slot is None:
                missing.append(i)
            else:
                self.lru.move_to_end(k)  # used now: evict others first
                slots[i] = slot
        for i in missing:
            k = keys[i]
            shard, chunk = k >> 32, k & 0xFFFFFFFF
            slot = self.free.pop() if self.free else self.lru.popitem(last=False)[1]
            a = chunk * self.chunk
            b = min(a + self.chunk, int(self.sizes[shard]))
            try:
                read_into(shard, a, b, self.slab[slot, : b - a])
            except ShardError:
                self.free.append(slot)
                raise
            self.lru[k] = slot
            slots[i] = slot
        return slots

    def gather(
        self, pos: np.ndarray | None, shard: np.ndarray, local: np.ndarray, read_into: ReadInto
    ) -> np.ndarray:
        """Samples ``(shard, local)``, sorted by storage position, as rows of a new array.

        ``pos[i]`` is the result's row for the i-th sample (``None``: row ``i``). Whole
        chunks requested in storage order (and not cached) are read from the file straight
        into the result, neighbouring ones in one HDF5 call; the other samples are copied from
        chunks in the cache, a slab of chunk slots, by one fancy-indexing copy for all of them
        (no Python loop over samples or chunks, bar one read per missing chunk). When the
        cache serves the whole request (the usual case for shuffled batches), that copy makes
        the result itself: each sample is copied once.
        """
        m = len(local)
        out = np.empty((m, *self.sample_shape), dtype=self.dtype)
        if m == 0:
            return out
        c_len = self.chunk
        chunk = local // c_len
        key = (shard << 32) | chunk
        first = np.r_[True, key[1:] != key[:-1]]
        gstart = np.flatnonzero(first)
        gend = np.r_[gstart[1:], m]
        gkey, gshard, gchunk = key[gstart], shard[gstart], chunk[gstart]
        direct = np.zeros(len(gstart), dtype=bool)
        if pos is None:
            clen = np.minimum(c_len, self.sizes[gshard] - gchunk * c_len)
            dup = np.r_[False, local[1:] == local[:-1]] & ~first
            ndup = np.add.reduceat(dup.astype(np.int64), gstart)
            direct = (
                (gend - gstart == clen) & (local[gstart] == gchunk * c_len) & (ndup == 0)
            )
            for g in np.flatnonzero(direct):
                if int(gkey[g]) in self.lru:
                    direct[g] = False
            dg = np.flatnonzero(direct)
            i = 0
            while i < len(dg):
                j = i + 1
                while (
                    j < len(dg)
                    and dg[j] == dg[j - 1] + 1
                    and gshard[dg[j]] == gshard[dg[i]]
                    and gchunk[dg[j]] == gchunk[dg[j - 1]] + 1
                ):
                    j += 1
                a, b = int(gstart[dg[i]]), int(gend[dg[j - 1]])
                la = int(local[a])
                read_into(int(gshard[dg[i]]), la, la + (b - a), out[a:b])
                i = j
        rest = np.flatnonzero(~direct)
        if not len(rest):
            return out
        group = np.cumsum(first) - 1  # each sample's group
        for s0 in range(0, len(rest), self.nslots):
            groups = rest[s0 : s0 + self.nslots]
            slot_of = np.zeros(len(gstart), dtype=np.int64)
            slot_of[groups] = self.slots(gkey[groups].tolist(), read_into)
            flat = self.slab.reshape(-1, *self.sample_shape)  # type: ignore[union-attr]
            if len(groups) == len(gstart):
                # The cache holds every sample: gather them in result order, one copy.
                src_row = slot_of[group] * c_len + (local - chunk * c_len)
                if pos is not None:
                    src_row[pos] = src_row.copy()
                return flat[src_row]
            else:
                keep = np.zeros(len(gstart), dtype=bool)
                keep[groups] = True
                rows = np.flatnonzero(keep[group])
                sg, sl = group[rows], local[rows] - chunk[rows] * c_len
            src = flat[slot_of[sg] * c_len + sl]
            if pos is None:
                out[rows] = src
            else:
                out[pos[rows]] = src
        return out
