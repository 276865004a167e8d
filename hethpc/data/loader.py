"""Per-rank batch loader for variable batch sizes, with exact resume and background prefetch."""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import torch

from hethpc.data.arrays import ArrayDataset
from hethpc.data.errors import LoaderError
from hethpc.data.prefetch import Prefetcher, running_mean, worth_prefetching
from hethpc.data.shards.reads import ShardStreamReader
from hethpc.data.shards.sharded import ShardedDataset
from hethpc.data.shards.stream import SampleStream
from hethpc.data.transform import is_sequence, to_batch

__all__ = ["MODES", "Batch", "Loader", "worth_prefetching"]

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

    Permutations are chunk-aware (:func:`~hethpc.data.shards.order.block_shuffle`) for a
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
            Token windows (:func:`~hethpc.data.transform.is_sequence`) are never scaled: each
            batch is their first tokens and, as targets, their next ones.

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
        self._normalize = normalize
        self._sequence = is_sequence(dataset)
        self._pos = 0
        self._step_in_epoch = 0
        # The last sizes asked for and their (offset, count, advance): a loop whose sizes
        # change rarely pays their checks and sums once per change, not per batch.
        self._planned: tuple[tuple[int, ...], tuple[int, int, int]] | None = None
        self._stream = SampleStream(
            base, chunk=self._chunk, window=max(1, int(shuffle_window)), seed=self.seed,
            rotate=mode == "seldp", rank=rank, world_size=world_size,
        )
        self._reader = (
            ShardStreamReader(dataset, self._stream) if isinstance(dataset, ShardedDataset)
            else None
        )
        self.prefetch = prefetch
        self._prefetcher: Prefetcher[Batch] | None = Prefetcher() if prefetch else None
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

    @property
    def _direct(self) -> bool | None:
        """Whether the shards are read by direct gathers (None: not yet read, or in memory)."""
        return None if self._reader is None else self._reader.direct

    def steps_per_epoch(self, global_batch: int) -> int:
        """Steps of ``global_batch`` samples that cover the dataset once: ``ceil(n / B)``."""
        n = len(self._base) if self.mode == "iid" else len(self.dataset)
        return max(1, math.ceil(n / max(1, int(global_batch))))

    def _plan(self, sizes: Any) -> tuple[int, int, int]:
        """(offset from the current position, count, advance) in the stream for these sizes:
        checked and summed once, then reused while the sizes stay the same."""
        try:
            key = tuple(int(v) for v in sizes)
        except (TypeError, ValueError):
            key = None  # not a flat sequence of numbers: the check below says what is wrong
        if key is not None and self._planned is not None and self._planned[0] == key:
            return self._planned[1]
        s = self._check_sizes(sizes)
        b = int(s[self.rank])
        if self.mode == "iid":
            total = int(s.sum())
            if total > self.length:
                raise LoaderError(
                    f"global batch {total} is larger than the {self.length} samples of the "
                    "dataset; lower the batch size"
                )
            plan = (int(s[: self.rank].sum()), b, total)
        else:
            if b > self.length:
                raise LoaderError(
                    f"rank {self.rank}: batch size {b} is larger than its {self.mode} share "
                    f"of {self.length} samples; lower the batch size or repartition"
                )
            plan = (0, b, b)
        self._planned = (tuple(s.tolist()), plan)
        return plan

    def _load(self, start: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        t0 = time.perf_counter()
        out = self._read(start, count)
        self.load_s = running_mean(self.load_s, time.perf_counter() - t0)
        return out

    def _read(self, start: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(self.dataset, ShardedDataset):
            assert self._reader is not None  # built for every sharded dataset
            x, y = self._reader.read(start, count)
        else:
            # In memory: rows gathered in storage order (kinder to the CPU cache); which
            # samples form the batch follows the permutation, their order inside it does not
            # matter to training.
            idx = np.sort(self._stream.indices(start, count))
            x, y = self.dataset.x[idx], self.dataset.y[idx]
        return to_batch(x, y, sequence=self._sequence, normalize=self._normalize)

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
            ``[sizes[rank]]`` (int64); for token windows of ``T + 1`` tokens, ``x`` and ``y``
            both int64 ``[sizes[rank], T]`` (:func:`~hethpc.data.transform.next_tokens`).

        Raises:
            LoaderError: sizes of the wrong length, a global batch larger than the dataset, or
                (partitioned modes) a batch larger than the rank's share.
        """
        if self._returned_at is not None:
            self.gap_s = running_mean(self.gap_s, time.perf_counter() - self._returned_at)
        rel, count, advance = self._plan(sizes)
        start = self._pos + rel
        got = None if self._prefetcher is None else self._prefetcher.take((start, count))
        if got is None:
            got = self._load(start, count)
        n = self.length
        new_epoch = (self._pos + advance) // n > self._pos // n
        self._pos += advance
        self._step_in_epoch = 0 if new_epoch else self._step_in_epoch + 1
        if self._prefetcher is not None and (
            self.prefetch is True or worth_prefetching(self.gap_s, self.load_s)
        ):
            nstart = self._pos + rel
            self._prefetcher.start((nstart, count), self._load, nstart, count)
        self._returned_at = time.perf_counter()
        return got

    @property
    def prefetching(self) -> bool:
        """Whether a background read of the next batch is under way (or done, unclaimed)."""
        return self._prefetcher is not None and self._prefetcher.pending

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
        if self._prefetcher is not None:
            self._prefetcher.cancel()
        if self._reader is not None:
            self._reader.forget_windows()
        self._pos = int(state["pos"])
        self._step_in_epoch = int(state["step_in_epoch"])

    def close(self) -> None:
        """Stop the prefetch thread."""
        if self._prefetcher is not None:
            self._prefetcher.close()
            self._prefetcher = None

    def __del__(self) -> None:
        prefetcher = getattr(self, "_prefetcher", None)
        if prefetcher is not None:
            prefetcher.close(wait=False)
