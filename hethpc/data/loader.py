"""Per-rank batch loader for variable batch sizes, with exact resume and background prefetch."""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from hethpc.data.errors import LoaderError
from hethpc.data.mnist1d import ArrayDataset
from hethpc.data.order import block_shuffle_windows, rotate_chunks, segment_bounds
from hethpc.data.sharded import ShardedDataset
from hethpc.data.transform import to_inputs, to_targets

MODES = ("iid", "seldp", "partition")
Batch = tuple[torch.Tensor, torch.Tensor]
# "auto" prefetches when the caller spends at least this share of a batch's load time between
# calls: then reading the next batch in the background hides it. Below that there is little
# to overlap and a thread hand-off per batch costs more than it hides (on a busy machine a
# woken thread can wait milliseconds for a core).
_AUTO_MIN_GAP = 0.25
_EWMA = 0.2  # weight of the newest gap / load time in their running means
_KEPT_WINDOWS = 3  # shuffle windows of a sharded dataset kept read (current, next, spare)


def worth_prefetching(gap_s: float | None, load_s: float | None) -> bool:
    """Whether a background read of the next batch can hide anything (``prefetch="auto"``).

    Args:
        gap_s: mean seconds the caller spends between batches (its compute); None: unknown.
        load_s: mean seconds one batch takes to load; None: unknown.

    Returns:
        True until both are known, then whether ``gap_s >= 0.25 * load_s``.
    """
    if gap_s is None or load_s is None:
        return True
    return gap_s >= _AUTO_MIN_GAP * load_s


class Loader:
    """Yields this rank's ``(x, y)`` for per-rank batch sizes that may change every step.

    Modes:
        ``iid``: one seeded permutation of the dataset per epoch (the same on every rank) is
            read as a stream cut into global batches of ``sum(sizes)``; rank ``r`` takes the
            slice ``sizes[:r].sum() .. + sizes[r]`` of each. Every sample is seen exactly once
            per epoch whatever the sizes; a global batch that crosses the end of an epoch
            continues into the next epoch's permutation.
        ``seldp``: every rank walks the whole epoch permutation, cut into ``world_size`` chunks
            and starting at chunk ``rank``, taking ``sizes[rank]`` samples per step.
        ``partition``: the rank cycles through its own ``indices`` (from a partitioner), in a
            new seeded order each epoch, taking ``sizes[rank]`` samples per step.

    Permutations are chunk-aware (:func:`~hethpc.data.order.block_shuffle`) for a
    :class:`ShardedDataset` and uniform for an in-memory :class:`ArrayDataset`. A sharded
    dataset whose reads are direct (:attr:`ShardedDataset.direct_reads`: verified shards,
    uncompressed) is read a batch at a time, gathered in stream order straight from the page
    cache by one copy, like ``numpy.memmap``; otherwise it is read one shuffle window at a
    time through HDF5 (each chunk once per epoch, laid out in stream order; the last three
    windows are kept), and batches come in stream order as slices of it, sharing its memory
    (never served twice). In-memory batches are gathered in storage (index) order; which
    samples form each batch follows the permutation.

    Args:
        dataset: an :class:`ArrayDataset` or a :class:`ShardedDataset`.
        rank: this rank.
        world_size: number of ranks.
        mode: ``"iid"``, ``"seldp"`` or ``"partition"``.
        indices: sample indices this rank uses (required for ``partition``; for ``iid`` and
            ``seldp``, the same subset on every rank; default: all).
        seed: the same on every rank.
        prefetch: read the next batch in a background thread, assuming unchanged sizes (a
            guess that is wrong only on the steps where sizes change: then it reads in line).
            ``True``: always; ``False``: never; ``"auto"`` (default): only while the caller
            spends at least a quarter of a batch's load time between calls (its compute, which
            the read then overlaps); a loop that only reads gains nothing from a thread
            hand-off per batch, so it reads in line.
        shuffle_window: chunks shuffled together for a sharded dataset (memory, when it is
            read through HDF5: about three windows of this many chunks).
        normalize: cast uint8 samples to float32 in ``[0, 1]`` (others are cast to float32).

    Raises:
        LoaderError: an unknown mode or prefetch setting, or ``partition`` without
            ``indices``, or empty indices.
    """

    def __init__(
        self,
        dataset: ArrayDataset | ShardedDataset,
        *,
        rank: int,
        world_size: int,
        mode: str = "iid",
        indices: np.ndarray | None = None,
        seed: int = 0,
        prefetch: bool | str = "auto",
        shuffle_window: int = 16,
        normalize: bool = True,
    ) -> None:
        if mode not in MODES:
            raise LoaderError(f"mode must be one of {MODES}, got {mode!r}")
        if not (isinstance(prefetch, bool) or prefetch == "auto"):
            raise LoaderError(f"prefetch must be True, False or 'auto', got {prefetch!r}")
        if not 0 <= rank < world_size:
            raise LoaderError(f"rank {rank} is outside a world of size {world_size}")
        if mode == "partition" and indices is None:
            raise LoaderError(
                "mode='partition' needs indices=partitioner.indices(labels, world_size, rank, "
                "seed)"
            )
        self.dataset = dataset
        self.rank, self.world_size, self.mode, self.seed = rank, world_size, mode, int(seed)
        n = len(dataset)
        base = np.arange(n, dtype=np.int64) if indices is None else np.asarray(indices, np.int64)
        if len(base) == 0:
            raise LoaderError(f"rank {rank} was given no samples; check the partition")
        self._base = base
        self._chunk = dataset.chunk_samples if isinstance(dataset, ShardedDataset) else 1
        self._window = max(1, int(shuffle_window))
        self._normalize = normalize
        self._pos = 0
        self._step_in_epoch = 0
        self._orders: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._orders_lock = threading.Lock()  # the prefetch thread builds orders too
        # Read shuffle windows of a sharded dataset: (epoch, window) -> (x, y) in stream order.
        self._windows: OrderedDict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = (
            OrderedDict()
        )
        self._windows_lock = threading.Lock()
        self._direct: bool | None = None  # the dataset's direct_reads, asked on the first read
        self._offsets: dict[int, np.ndarray] = {}  # epoch -> its order's places in mapped files
        self.prefetch = prefetch
        self._pool = (
            ThreadPoolExecutor(1, thread_name_prefix="hethpc-prefetch") if prefetch else None
        )
        self._pending: tuple[tuple[int, int], Future[Batch]] | None = None
        self._returned_at: float | None = None  # when next_batch last returned
        self.gap_s: float | None = None  # mean seconds the caller spends between batches
        self.load_s: float | None = None  # mean seconds one batch takes to load

    @property
    def length(self) -> int:
        """Samples in one epoch of this rank's stream."""
        return len(self._base)

    @property
    def epoch(self) -> int:
        """The epoch the next sample comes from (0-based)."""
        return self._pos // self.length

    @property
    def step_in_epoch(self) -> int:
        """Batches served since the current epoch began."""
        return self._step_in_epoch

    def steps_per_epoch(self, global_batch: int) -> int:
        """Steps of ``global_batch`` samples that cover the dataset once: ``ceil(n / B)``."""
        n = len(self._base) if self.mode == "iid" else len(self.dataset)
        return max(1, math.ceil(n / max(1, int(global_batch))))

    def _order(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """The epoch's stream order and the bounds of its shuffle windows (``[0, ..., n]``)."""
        with self._orders_lock:
            got = self._orders.get(epoch)
            if got is None:
                o, w = block_shuffle_windows(
                    self._base, chunk=self._chunk, window=self._window, seed=self.seed,
                    epoch=epoch,
                )
                if self.mode == "seldp":
                    o = rotate_chunks(o, self.world_size, self.rank)
                    w = rotate_chunks(w, self.world_size, self.rank)
                for old in [e for e in self._orders if e < epoch - 1]:
                    del self._orders[old]
                got = self._orders[epoch] = (o, segment_bounds(w))
            return got

    def _stream(self, start: int, count: int) -> np.ndarray:
        n = self.length
        out = []
        while count > 0:
            e, off = divmod(start, n)
            take = min(count, n - off)
            out.append(self._order(e)[0][off : off + take])
            start += take
            count -= take
        if len(out) == 1:
            return out[0]
        return np.concatenate(out) if out else np.empty(0, np.int64)

    def _request(self, sizes: np.ndarray) -> tuple[int, int, int]:
        """(start, count, advance) in the stream for these sizes."""
        b = int(sizes[self.rank])
        if self.mode == "iid":
            total = int(sizes.sum())
            if total > self.length:
                raise LoaderError(
                    f"global batch {total} is larger than the {self.length} samples of the "
                    "dataset; lower the batch size"
                )
            return self._pos + int(sizes[: self.rank].sum()), b, total
        if b > self.length:
            raise LoaderError(
                f"rank {self.rank}: batch size {b} is larger than its {self.mode} share of "
                f"{self.length} samples; lower the batch size or repartition"
            )
        return self._pos, b, b

    def _load(self, start: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        t0 = time.perf_counter()
        out = self._read(start, count)
        self.load_s = _mean(self.load_s, time.perf_counter() - t0)
        return out

    def _read(self, start: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(self.dataset, ShardedDataset):
            if self._direct is None:
                self._direct = self.dataset.direct_reads
            if self._direct:  # one gather from the page cache: a window would add a copy
                x, y = self._read_direct(start, count)
            else:
                x, y = self._read_windows(start, count)
        else:
            # In memory: rows gathered in storage order (kinder to the CPU cache); which
            # samples form the batch follows the permutation, their order inside it does not
            # matter to training.
            idx = np.sort(self._stream(start, count))
            x, y = self.dataset.x[idx], self.dataset.y[idx]
        return to_inputs(x, normalize=self._normalize), to_targets(np.asarray(y))

    def _read_direct(self, start: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """Stream positions ``start .. start+count-1`` gathered from the mapped shard files,
        at places computed once per epoch."""
        assert isinstance(self.dataset, ShardedDataset)
        n = self.length
        e, off = divmod(start, n)
        where = self._offsets.get(e)
        if where is not None and off + count <= n:  # the usual batch: inside one epoch
            order = self._order(e)[0]
            return self.dataset._read_offsets(where[off : off + count], order[off : off + count])
        idx, offs = [], []
        while count > 0:
            e, off = divmod(start, n)
            order = self._order(e)[0]
            with self._orders_lock:
                where = self._offsets.get(e)
                if where is None:
                    where = self.dataset._offsets(order)
                    if where is None:  # no longer direct (checksums turned on)
                        return self.dataset.read_window(self._stream(start, count))
                    for old in [k for k in self._offsets if k < e - 1]:
                        del self._offsets[old]
                    self._offsets[e] = where
            take = min(count, n - off)
            idx.append(order[off : off + take])
            offs.append(where[off : off + take])
            start += take
            count -= take
        if len(idx) != 1:
            idx = [np.concatenate(idx) if idx else self._base[:0]]
            offs = [np.concatenate(offs) if offs else np.empty(0, np.int64)]
        return self.dataset._read_offsets(offs[0], idx[0])

    def _read_windows(self, start: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """Stream positions ``start .. start+count-1`` from the shuffle windows that hold them.

        A window is read whole the first time one of its samples is asked for (each chunk
        once), laid out in stream order, so a batch inside one window is a slice of it (no
        copy) and one that spans windows joins slices.
        """
        assert isinstance(self.dataset, ShardedDataset)
        n = self.length
        xs, ys = [], []
        while count > 0:
            e, off = divmod(start, n)
            order, bounds = self._order(e)
            w = int(np.searchsorted(bounds, off, side="right")) - 1
            a, b = int(bounds[w]), int(bounds[w + 1])
            x, y = self._window_data(e, w, order[a:b])
            take = min(count, b - off)
            xs.append(x[off - a : off - a + take])
            ys.append(y[off - a : off - a + take])
            start += take
            count -= take
        if len(xs) == 1:
            return xs[0], ys[0]
        if not xs:  # a batch of size 0
            return self.dataset.read_window(self._base[:0])
        return np.concatenate(xs), np.concatenate(ys)

    def _window_data(self, epoch: int, w: int, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        with self._windows_lock:  # the prefetch thread reads windows too: each is read once
            got = self._windows.get((epoch, w))
            if got is None:
                assert isinstance(self.dataset, ShardedDataset)
                got = self._windows[(epoch, w)] = self.dataset.read_window(idx)
                while len(self._windows) > _KEPT_WINDOWS:
                    self._windows.popitem(last=False)
            else:
                self._windows.move_to_end((epoch, w))
            return got

    def _check_sizes(self, sizes: Any) -> np.ndarray:
        s = np.asarray(sizes, dtype=np.int64).reshape(-1)
        if len(s) != self.world_size or (s < 0).any():
            raise LoaderError(
                f"sizes must hold {self.world_size} non-negative batch sizes (one per rank), "
                f"got {s.tolist()}"
            )
        return s

    def next_batch(self, sizes: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's next batch.

        Args:
            sizes: per-rank batch sizes, shape ``[world_size]``, the same on every rank.

        Returns:
            ``x`` of shape ``[sizes[rank], *sample_shape]`` (float32) and ``y`` of shape
            ``[sizes[rank]]`` (int64).

        Raises:
            LoaderError: sizes of the wrong length, a global batch larger than the dataset, or
                (partitioned modes) a batch larger than the rank's share.
        """
        if self._returned_at is not None:
            self.gap_s = _mean(self.gap_s, time.perf_counter() - self._returned_at)
        s = self._check_sizes(sizes)
        start, count, advance = self._request(s)
        got = None
        if self._pending is not None:
            key, fut = self._pending
            self._pending = None
            if key == (start, count):
                got = fut.result()
            else:
                fut.cancel()
        if got is None:
            got = self._load(start, count)
        before = self.epoch
        self._pos += advance
        self._step_in_epoch = 0 if self.epoch > before else self._step_in_epoch + 1
        if self._pool is not None and (
            self.prefetch is True or worth_prefetching(self.gap_s, self.load_s)
        ):
            nstart, ncount, _ = self._request(s)
            self._pending = ((nstart, ncount), self._pool.submit(self._load, nstart, ncount))
        self._returned_at = time.perf_counter()
        return got

    @property
    def prefetching(self) -> bool:
        """Whether a background read of the next batch is under way (or done, unclaimed)."""
        return self._pending is not None

    def state_dict(self) -> dict[str, Any]:
        """Position in the stream and settings; restores the exact sequence of batches."""
        return {
            "mode": self.mode,
            "seed": self.seed,
            "world_size": self.world_size,
            "length": self.length,
            "pos": self._pos,
            "step_in_epoch": self._step_in_epoch,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`.

        Raises:
            LoaderError: the state was saved with another mode, seed, world size or data size.
        """
        for k in ("mode", "seed", "world_size", "length"):
            if state.get(k) != getattr(self, k):
                raise LoaderError(
                    f"loader state has {k}={state.get(k)!r}, this loader {getattr(self, k)!r}; "
                    "resume with the same data, mode, seed and world size"
                )
        if self._pending is not None:
            self._pending[1].cancel()
            self._pending = None
        with self._windows_lock:  # batches are slices of windows: never serve one twice
            self._windows.clear()
        self._pos = int(state["pos"])
        self._step_in_epoch = int(state["step_in_epoch"])

    def close(self) -> None:
        """Stop the prefetch thread."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
            self._pending = None

    def __del__(self) -> None:
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


def _mean(old: float | None, new: float) -> float:
    return new if old is None else (1 - _EWMA) * old + _EWMA * new
