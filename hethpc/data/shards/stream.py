"""A rank's endless sample stream: one seeded order per epoch, cut into shuffle windows."""

from __future__ import annotations

import threading

import numpy as np

from hethpc.data.shards.order import block_shuffle_windows, rotate_chunks, segment_bounds


class SampleStream:
    """The epochs of a rank's samples laid end to end; position ``p`` is sample
    ``order(p // length)[0][p % length]``.

    Each epoch's order is chunk-aware (:func:`~hethpc.data.shards.order.block_shuffle_windows`),
    rotated by ``rank`` chunks of ``length / world_size`` for SelDP; built on first use and
    kept for the current and the previous epoch. Safe to use from a prefetch thread.

    Args:
        base: the sample indices of one epoch, shape ``[length]``, int64.
        chunk: samples per storage chunk (1 for in-memory data: a uniform permutation).
        window: chunks shuffled together (>= 1).
        seed: the same on every rank.
        rotate: rotate each epoch's order by ``rank`` of ``world_size`` chunks (SelDP).
        rank: this rank.
        world_size: number of ranks.
    """

    def __init__(
        self,
        base: np.ndarray,
        *,
        chunk: int,
        window: int,
        seed: int,
        rotate: bool,
        rank: int,
        world_size: int,
    ) -> None:
        self.base = base
        self._chunk, self._window, self._seed = chunk, window, seed
        self._rotate, self._rank, self._world_size = rotate, rank, world_size
        self._orders: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._lock = threading.Lock()  # the prefetch thread builds orders too

    @property
    def length(self) -> int:
        """Samples in one epoch."""
        return len(self.base)

    def order(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """The epoch's stream order and the bounds of its shuffle windows (``[0, ..., n]``)."""
        with self._lock:
            got = self._orders.get(epoch)
            if got is None:
                o, w = block_shuffle_windows(
                    self.base, chunk=self._chunk, window=self._window, seed=self._seed,
                    epoch=epoch,
                )
                if self._rotate:
                    o = rotate_chunks(o, self._world_size, self._rank)
                    w = rotate_chunks(w, self._world_size, self._rank)
                for old in [e for e in self._orders if e < epoch - 1]:
                    del self._orders[old]
                got = self._orders[epoch] = (o, segment_bounds(w))
            return got

    def indices(self, start: int, count: int) -> np.ndarray:
        """Sample indices at stream positions ``start .. start+count-1``, shape ``[count]``."""
        n = self.length
        out = []
        while count > 0:
            e, off = divmod(start, n)
            take = min(count, n - off)
            out.append(self.order(e)[0][off : off + take])
            start += take
            count -= take
        if len(out) == 1:
            return out[0]
        return np.concatenate(out) if out else np.empty(0, np.int64)
