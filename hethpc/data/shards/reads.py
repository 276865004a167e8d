"""Reading stretches of a sample stream from HDF5 shards: direct gathers or shuffle windows."""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

from hethpc.data.shards.sharded import ShardedDataset
from hethpc.data.shards.stream import SampleStream

_KEPT_WINDOWS = 3  # shuffle windows kept read (current, next, spare)


class ShardStreamReader:
    """Reads stream positions of a :class:`SampleStream` from a :class:`ShardedDataset`.

    A dataset whose reads are direct (:attr:`ShardedDataset.direct_reads`: verified shards,
    uncompressed) is read a batch at a time, gathered in stream order straight from the page
    cache by one copy, like ``numpy.memmap``; otherwise it is read one shuffle window at a
    time through HDF5 (each chunk once per epoch, laid out in stream order; the last three
    windows are kept), and batches are slices of a window, sharing its memory. Safe to use
    from a prefetch thread.

    Args:
        dataset: the shards.
        stream: the order in which positions map to sample indices.
    """

    def __init__(self, dataset: ShardedDataset, stream: SampleStream) -> None:
        self.dataset = dataset
        self.stream = stream
        self.direct: bool | None = None  # the dataset's direct_reads, asked on the first read
        # Read shuffle windows: (epoch, window) -> (x, y) in stream order.
        self._windows: OrderedDict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = (
            OrderedDict()
        )
        self._windows_lock = threading.Lock()
        self._offsets: dict[int, np.ndarray] = {}  # epoch -> its order's places in mapped files
        self._offsets_lock = threading.Lock()

    def read(self, start: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """Samples at stream positions ``start .. start+count-1``, in stream order.

        Returns:
            ``x`` of shape ``[count, *sample_shape]`` and ``y`` of shape ``[count]``, as
            stored.
        """
        if self.direct is None:
            self.direct = self.dataset.direct_reads
        if self.direct:  # one gather from the page cache: a window would add a copy
            return self._read_direct(start, count)
        return self._read_windows(start, count)

    def forget_windows(self) -> None:
        """Drop the windows kept read (batches are slices of them: never serve one twice)."""
        with self._windows_lock:
            self._windows.clear()

    def _read_direct(self, start: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """Gathered from the mapped shard files, at places computed once per epoch."""
        n = self.stream.length
        e, off = divmod(start, n)
        where = self._offsets.get(e)
        if where is not None and off + count <= n:  # the usual batch: inside one epoch
            order = self.stream.order(e)[0]
            return self.dataset._read_offsets(where[off : off + count], order[off : off + count])
        idx, offs = [], []
        while count > 0:
            e, off = divmod(start, n)
            order = self.stream.order(e)[0]
            with self._offsets_lock:
                where = self._offsets.get(e)
                if where is None:
                    where = self.dataset._offsets(order)
                    if where is None:  # no longer direct (checksums turned on)
                        return self.dataset.read_window(self.stream.indices(start, count))
                    for old in [k for k in self._offsets if k < e - 1]:
                        del self._offsets[old]
                    self._offsets[e] = where
            take = min(count, n - off)
            idx.append(order[off : off + take])
            offs.append(where[off : off + take])
            start += take
            count -= take
        if len(idx) != 1:
            idx = [np.concatenate(idx) if idx else self.stream.base[:0]]
            offs = [np.concatenate(offs) if offs else np.empty(0, np.int64)]
        return self.dataset._read_offsets(offs[0], idx[0])

    def _read_windows(self, start: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """From the shuffle windows that hold the positions.

        A window is read whole the first time one of its samples is asked for (each chunk
        once), laid out in stream order, so a batch inside one window is a slice of it (no
        copy) and one that spans windows joins slices.
        """
        n = self.stream.length
        xs, ys = [], []
        while count > 0:
            e, off = divmod(start, n)
            order, bounds = self.stream.order(e)
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
            return self.dataset.read_window(self.stream.base[:0])
        return np.concatenate(xs), np.concatenate(ys)

    def _window_data(self, epoch: int, w: int, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        with self._windows_lock:  # the prefetch thread reads windows too: each is read once
            got = self._windows.get((epoch, w))
            if got is None:
                got = self._windows[(epoch, w)] = self.dataset.read_window(idx)
                while len(self._windows) > _KEPT_WINDOWS:
                    self._windows.popitem(last=False)
            else:
                self._windows.move_to_end((epoch, w))
            return got
