"""Per-rank batch loader for variable batch sizes, with exact resume and background prefetch."""

from __future__ import annotations

import math
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from hethpc.data.errors import LoaderError
from hethpc.data.mnist1d import ArrayDataset
from hethpc.data.order import block_shuffle, rotate_chunks
from hethpc.data.sharded import ShardedDataset

MODES = ("iid", "seldp", "partition")
Batch = tuple[torch.Tensor, torch.Tensor]


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

    Samples inside a batch come in storage (index) order; which samples form each batch
    follows the permutation. Permutations are chunk-aware
    (:func:`~hethpc.data.order.block_shuffle`) for a :class:`ShardedDataset` and uniform for
    an in-memory :class:`ArrayDataset`.

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
        shuffle_window: chunks shuffled together for a sharded dataset (memory: this many
            chunks; the dataset's chunk cache must hold them).
        normalize: cast uint8 samples to float32 in ``[0, 1]`` (others are cast to float32).

    Raises:
        LoaderError: an unknown mode, or ``partition`` without ``indices``, or empty indices.
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
        prefetch: bool = True,
        shuffle_window: int = 16,
        normalize: bool = True,
    ) -> None:
        if mode not in MODES:
            raise LoaderError(f"mode must be one of {MODES}, got {mode!r}")
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
        self._orders: dict[int, np.ndarray] = {}
        self._orders_lock = threading.Lock()  # the prefetch thread builds orders too
        self._pool = (
            ThreadPoolExecutor(1, thread_name_prefix="hethpc-prefetch") if prefetch else None
        )
        self._pending: tuple[tuple[int, int], Future[Batch]] | None = None

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

    def _order(self, epoch: int) -> np.ndarray:
        with self._orders_lock:
            return self._order_locked(epoch)

    def _order_locked(self, epoch: int) -> np.ndarray:
        o = self._orders.get(epoch)
        if o is None:
            o = block_shuffle(
                self._base, chunk=self._chunk, window=self._window, seed=self.seed, epoch=epoch
            )
            if self.mode == "seldp":
                o = rotate_chunks(o, self.world_size, self.rank)
            for old in [e for e in self._orders if e < epoch - 1]:
                del self._orders[old]
            self._orders[epoch] = o
        return o

    def _stream(self, start: int, count: int) -> np.ndarray:
        n = self.length
        out = []
        while count > 0:
            e, off = divmod(start, n)
            take = min(count, n - off)
            out.append(self._order(e)[off : off + take])
            start += take
            count -= take
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
        # Storage order inside a batch: one copy per chunk. Which samples form the batch
        # follows the permutation; their order inside it does not matter to training.
        idx = np.sort(self._stream(start, count))
        if isinstance(self.dataset, ShardedDataset):
            x, y = self.dataset.read(idx)
        else:
            x, y = self.dataset.x[idx], self.dataset.y[idx]
        if x.dtype == np.uint8 and self._normalize:
            xt = torch.from_numpy(x).to(torch.float32).div_(255.0)
        else:
            xt = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
        return xt, torch.from_numpy(np.asarray(y, dtype=np.int64))

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
        if self._pool is not None:
            nstart, ncount, _ = self._request(s)
            self._pending = ((nstart, ncount), self._pool.submit(self._load, nstart, ncount))
        return got

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
