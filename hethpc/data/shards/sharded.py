"""Reader of HDF5-sharded datasets: checks on open, lazy per-process file handles, three read paths.

One class: the mapped, cached and by-window reads share its per-process state
(handles, cache, mapping, lock); their mechanics live in ``mapped``, ``chunk_cache`` and
``shard_files``, the checks in ``verify``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
import numpy as np
from h5py import h5z

from hethpc.data.errors import DatasetError, ShardError
from hethpc.data.shards.chunk_cache import ChunkCache
from hethpc.data.shards.files import ShardFiles
from hethpc.data.shards.manifest import MANIFEST_NAME, Manifest, shard_path
from hethpc.data.shards.mapped import MappedShards
from hethpc.data.shards.verify import (  # noqa: F401 (re-exported: their home before verify.py)
    SHARD_SUFFIXES,
    check_dataset,
    check_sites,
    hash_problems,
    sha256_file,
)


class ShardedDataset:
    """A read-only view of a dataset directory; build it with :func:`open_dataset`.

    Labels of every shard are held in memory (``labels``); samples are read on demand in whole
    HDF5 chunks (the unit HDF5 checksums and decompresses), kept in a small LRU cache, so reads
    of indices that share chunks cost one chunk read. File handles are opened lazily in the
    process that reads and reopened after a fork (h5py handles do not survive one), so the
    object may be built before workers are started and pickled to them.

    Without ``chunk_checksums``, chunks stored uncompressed are read as raw bytes, skipping
    HDF5's filter pipeline and its per-chunk Fletcher32 test: the shard files are mapped
    read-only side by side into one address range (:class:`~hethpc.data.shards.mapped.FileRegion`),
    HDF5's chunk index gives each chunk's place in its file, and :meth:`read` and
    :meth:`read_window` gather the requested samples, in request order, straight from the page
    cache into the result: one copy of each byte, as ``numpy.memmap`` of a flat file, and no
    chunk cache. :func:`open_dataset` turns this on only after it has checked every shard's
    sha256, which covers every byte the Fletcher32 tests would. Compressed chunks always go
    through HDF5, and so does every read where the files cannot be mapped (no ``MAP_FIXED``).

    Attributes:
        root: the dataset directory.
        manifest: its parsed manifest.
        labels: every sample's label, shape ``[len(self)]``, int64.
        chunk_checksums: HDF5 tests each chunk's Fletcher32 checksum on every read.
    """

    def __init__(
        self,
        root: Path,
        manifest: Manifest,
        labels: np.ndarray,
        *,
        locking: bool | None = None,
        cache_bytes: int = 128 << 20,
        chunk_checksums: bool = True,
    ) -> None:
        self.root = root
        self.chunk_checksums = bool(chunk_checksums)
        self.manifest = manifest
        self.labels = labels
        self.locking = locking
        self.cache_bytes = int(cache_bytes)
        self._sites: np.ndarray | None = None
        self._paths = [shard_path(root, s.file) for s in manifest.shards]
        counts = np.array([s.num_samples for s in manifest.shards], dtype=np.int64)
        self._starts = np.concatenate([[0], np.cumsum(counts)])
        self._chunk = manifest.chunk_samples
        self._sizes = counts
        self._sample_size = int(np.prod(manifest.sample_shape))
        chunk_bytes = self._chunk * self._sample_size * self.dtype.itemsize
        self._nslots = max(1, self.cache_bytes // max(1, chunk_bytes))
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._h5 = ShardFiles(self.root, self._paths, self.sample_shape, self.locking)
        self._cache = ChunkCache(self._nslots, self._chunk, self.sample_shape, self.dtype,
                                 self._sizes)
        self._buffer: np.ndarray | None = None  # one chunk, for read_window
        self._raw: dict[int, bool] = {}  # shard -> its chunks are read raw from its mapped file
        self._mapped = self._unmapped()
        self._lock = threading.Lock()

    def _unmapped(self) -> MappedShards:
        """The shard files' places in one address range, none mapped yet."""
        return MappedShards(self._sizes, self._chunk, [s.num_bytes for s in self.manifest.shards],
                            self.sample_shape, self.dtype)

    def __getstate__(self) -> dict[str, Any]:
        d = self.__dict__.copy()
        for k in ("_h5", "_cache", "_lock", "_pid", "_buffer", "_raw", "_mapped"):
            d.pop(k, None)
        return d

    def __setstate__(self, d: dict[str, Any]) -> None:
        self.__dict__.update(d)
        self._reset()

    @property
    def sites(self) -> np.ndarray:
        """Every sample's site index into ``manifest.sites``, shape ``[len(self)]``, int64;
        read from the shards' ``site`` column on first use.

        Raises:
            DatasetError: the dataset has no site column (its manifest names no sites).
            ShardError: a shard's column disagrees with the manifest.
        """
        names = self.manifest.sites
        if names is None:
            raise DatasetError(
                f"{self.root} has no site column (its manifest names no sites); a dataset "
                "written by 'hethpc-convert text' has one"
            )
        if self._sites is None:
            kw: dict[str, Any] = {} if self.locking is None else {"locking": self.locking}
            parts = []
            for p, s in zip(self._paths, self.manifest.shards, strict=True):
                try:
                    with h5py.File(p, "r", **kw) as f:
                        parts.append(check_sites(p, f, s, len(names)))
                except OSError as e:
                    raise ShardError(f"shard {p} is not a readable HDF5 file ({e})") from e
            self._sites = np.concatenate(parts)
        return self._sites

    def __len__(self) -> int:
        return int(self._starts[-1])

    @property
    def num_classes(self) -> int:
        """Labels lie in ``0 .. num_classes - 1``."""
        return self.manifest.num_classes

    @property
    def sample_shape(self) -> tuple[int, ...]:
        """Shape of one sample."""
        return self.manifest.sample_shape

    @property
    def dtype(self) -> np.dtype[Any]:
        """Stored dtype of the samples."""
        return np.dtype(self.manifest.dtype)

    @property
    def chunk_samples(self) -> int:
        """Samples per HDF5 chunk: reads of nearby indices share chunks."""
        return self._chunk

    @property
    def direct_reads(self) -> bool:
        """Whether reads gather samples straight from the mapped shard files (one copy, in any
        order, no chunk read twice to gain): checksums are off and every shard's chunks are
        raw. The first call maps every shard."""
        if self.chunk_checksums:
            return False
        if os.getpid() != self._pid:
            self._reset()
        with self._lock:
            return all([self._raw_chunks(s) for s in range(len(self._paths))])

    # The loader's direct path: offsets computed once per epoch, then one gather per batch.
    def _offsets(self, indices: np.ndarray) -> np.ndarray | None:
        """Where the samples at ``indices`` lie in the mapped files, for :meth:`_read_offsets`;
        None unless :attr:`direct_reads`."""
        idx = self._check(indices)
        if not self.direct_reads:
            return None
        with self._lock:
            return self._mapped.offsets(idx)

    def _read_offsets(
        self, offsets: np.ndarray, indices: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`read_window` of ``indices``, given ``offsets = self._offsets(indices)``."""
        if os.getpid() != self._pid or not self._mapped.complete:
            if not self.direct_reads:  # maps every shard again (after a fork or close)
                return self.read_window(indices)
        with self._lock:
            return self._mapped.read(offsets), self.labels[indices]

    def _dataset_x(self, shard: int) -> h5py.Dataset:
        if os.getpid() != self._pid:
            self._reset()  # forked: the parent's handles are not usable here
        return self._h5.x(shard)

    def _raw_chunks(self, shard: int) -> bool:
        """Whether ``shard``'s chunks are read as raw bytes from its mapped file: checksums are
        off, HDF5 stores them unchanged (no filter but Fletcher32, whose 4 bytes follow the
        data), chunked one whole sample at a time, and the file could be mapped."""
        ok = self._raw.get(shard)
        if ok is None:
            x = self._dataset_x(shard)
            ok = not self.chunk_checksums and x.chunks == (self._chunk, *self.sample_shape)
            if ok:
                plist = x.id.get_create_plist()
                filters = {plist.get_filter(i)[0] for i in range(plist.get_nfilters())}
                ok = filters <= {h5z.FILTER_FLETCHER32} and self._mapped.map(
                    shard, x, self._paths[shard]
                )
            self._raw[shard] = ok
        return ok

    def _read_mapped(self, idx: np.ndarray) -> np.ndarray | None:
        """Samples at ``idx`` (checked; any order, repeats allowed), gathered in that order
        straight from the mapped files by one copy; None when a shard they lie in is not raw.
        Call with the lock held."""
        if self.chunk_checksums or not len(idx):
            return None
        return self._mapped.gather(idx, self._raw_chunks)

    def _chunk_rows(self, shard: int, a: int, b: int, buf: np.ndarray) -> np.ndarray:
        """Samples ``a .. b-1`` of ``shard``, all in one chunk, as an array valid until the
        next call: a view of its mapped file when :meth:`_raw_chunks` allows, else
        ``buf[: b - a]`` filled by HDF5."""
        if self._raw_chunks(shard):
            return self._mapped.rows(shard, a, b)
        self._read_into(shard, a, b, buf[: b - a])
        return buf[: b - a]

    def _read_into(self, shard: int, a: int, b: int, dest: np.ndarray) -> None:
        """Samples ``a .. b-1`` of ``shard`` straight into ``dest`` (C-contiguous)."""
        if self._raw_chunks(shard):
            for c0 in range(a - a % self._chunk, b, self._chunk):
                lo, hi = max(a, c0), min(b, c0 + self._chunk)
                dest[lo - a : hi - a] = self._chunk_rows(shard, lo, hi, dest[lo - a : hi - a])
            return
        self._dataset_x(shard)  # reopens handles in a forked process
        self._h5.read_into(shard, a, b, dest)

    def read(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Samples and labels at ``indices``, in that order.

        From mapped files (raw chunks, see the class), samples are gathered in request order
        by one copy. Otherwise chunks are visited in ascending file order, each read once:
        whole chunks covered by the request go straight from the file into the result, partly
        used ones through the chunk cache.

        Args:
            indices: global sample indices, shape ``[k]``.

        Returns:
            ``x`` of shape ``[k, *sample_shape]`` (stored dtype) and ``y`` of shape ``[k]``.

        Raises:
            IndexError: an index is out of range.
            ShardError: a shard cannot be opened or fails its checksum.
        """
        return self._read(indices, self._read_cached)

    def _check(self, indices: np.ndarray) -> np.ndarray:
        """``indices`` as checked int64 indices; reopens handles in a forked process."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        n = len(self)
        if len(idx) and (idx.min() < 0 or idx.max() >= n):
            raise IndexError(f"indices must lie in 0..{n - 1}, got {idx.min()}..{idx.max()}")
        if os.getpid() != self._pid:
            self._reset()  # forked: the parent's handles, cache and lock are not usable here
        return idx

    def _sorted(self, idx: np.ndarray) -> tuple[np.ndarray | None, np.ndarray, np.ndarray]:
        """The permutation sorting ``idx`` (None: already sorted), and the sorted indices'
        shards and rows in them."""
        pos = None
        sidx = idx
        if len(idx) > 1 and not bool((np.diff(idx) >= 0).all()):
            pos = np.argsort(idx, kind="stable")
            sidx = idx[pos]
        shard = np.searchsorted(self._starts, sidx, side="right") - 1
        return pos, shard, sidx - self._starts[shard]

    def read_window(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Samples and labels at ``indices``, in that order, for a request spanning many chunks.

        From mapped files (raw chunks, see the class), samples are gathered in request order
        by one copy, as in :meth:`read`. Otherwise each touched chunk is read once (from its
        first to its last requested row) into one small reusable buffer, and its rows are
        scattered into the result: each sample is copied once, out of a buffer that stays in
        the CPU cache. The chunk cache is neither used nor filled. Meant for reads of whole
        shuffle windows (the loader's); for scattered small requests that revisit chunks,
        :meth:`read` and its cache read less.

        Args:
            indices: global sample indices, shape ``[k]`` (any order, repeats allowed).

        Returns:
            ``x`` of shape ``[k, *sample_shape]`` (stored dtype) and ``y`` of shape ``[k]``.

        Raises:
            IndexError: an index is out of range.
            ShardError: a shard cannot be opened or fails its checksum.
        """
        return self._read(indices, self._read_chunks)

    def _read(
        self, indices: np.ndarray, unmapped: Callable[[np.ndarray], np.ndarray]
    ) -> tuple[np.ndarray, np.ndarray]:
        """Samples and labels at ``indices``: from mapped files, else by ``unmapped`` (called
        with the checked indices, the lock held)."""
        idx = self._check(indices)
        with self._lock:
            out = self._read_mapped(idx)
            if out is None:
                out = unmapped(idx)
        return out, self.labels[idx]

    def _read_cached(self, idx: np.ndarray) -> np.ndarray:
        """:meth:`read` through the chunk cache, in ascending file order; call with the lock
        held."""
        return self._cache.gather(*self._sorted(idx), self._read_into)

    def _read_chunks(self, idx: np.ndarray) -> np.ndarray:
        """:meth:`read_window` by whole chunks through one buffer; call with the lock held."""
        pos, shard, local = self._sorted(idx)
        out = np.empty((len(idx), *self.sample_shape), dtype=self.dtype)
        if not len(idx):
            return out
        key = (shard << 32) | (local // self._chunk)
        gstart = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
        gend = np.r_[gstart[1:], len(idx)]
        if self._buffer is None:
            self._buffer = np.empty((self._chunk, *self.sample_shape), self.dtype)
        for g0, g1 in zip(gstart.tolist(), gend.tolist(), strict=True):
            lo, hi = int(local[g0]), int(local[g1 - 1]) + 1
            src = self._chunk_rows(int(shard[g0]), lo, hi, self._buffer)
            rows = slice(g0, g1) if pos is None else pos[g0:g1]
            if hi - lo == g1 - g0:  # every row of lo..hi-1 once: no gather needed
                out[rows] = src
            else:
                out[rows] = src[local[g0:g1] - lo]
        return out

    def close(self) -> None:
        """Close open files and drop cached chunks (they reopen on the next read)."""
        with self._lock:
            self._h5.close()
            self._cache.clear()
            self._buffer = None
            self._raw.clear()
            self._mapped = self._unmapped()


def split_dirs(root: str | os.PathLike[str]) -> list[str]:
    """The splits (``train``, ``test``, ...) that ``root`` holds as dataset directories, as
    ``data_tools/convert.py`` writes them (``OUT/<split>/manifest.json``), sorted with
    ``train`` first; empty when ``root`` is not such a directory."""
    try:
        found = [p.name for p in Path(root).iterdir() if (p / MANIFEST_NAME).is_file()]
    except OSError:  # not a directory, or not readable: no splits to name
        return []
    return sorted(found, key=lambda name: (name != "train", name))


def open_dataset(
    path: str | os.PathLike[str],
    *,
    verify: bool = True,
    locking: bool | None = None,
    cache_bytes: int = 128 << 20,
    chunk_checksums: bool | None = None,
) -> ShardedDataset:
    """Open a dataset directory written by :class:`~hethpc.data.shards.writer.DatasetWriter`.

    Always checked: the manifest, that shard names stay inside the directory, missing or extra
    shard files, file sizes (truncation), each shard's shapes, dtypes and label histogram.
    ``verify`` also hashes every file against the manifest's sha256 (reads all the data once).

    Args:
        path: the dataset directory.
        verify: check each shard's sha256 (catches any corrupt byte before training starts).
        locking: HDF5 file locking; False for shared filesystems that lack locks (Lustre, NFS,
            GPFS without flock), None for HDF5's default.
        cache_bytes: bytes of decoded chunks kept per process.
        chunk_checksums: let HDF5 test each chunk's Fletcher32 checksum on every read.
            None (default): only when ``verify`` is off. After the sha256 check has covered
            every byte, uncompressed chunks are read as raw bytes, at a third of the CPU time
            (see :class:`ShardedDataset`).

    Raises:
        DatasetError: no manifest, or it is malformed or names a path outside ``path``.
        ShardError: a shard is missing, extra, truncated, corrupt or disagrees with the
            manifest; the message names every such file.
    """
    root = Path(path)
    mpath = root / MANIFEST_NAME
    if not mpath.is_file():
        splits = split_dirs(root)
        if splits:
            raise DatasetError(
                f"{root} is not one dataset: it holds {' and '.join(f'{s}/' for s in splits)}; "
                f"pass {' or '.join(str(root / s) for s in splits)}"
            )
        raise DatasetError(
            f"{root} is not a dataset directory (no {MANIFEST_NAME}); create one with "
            "data_tools/convert.py"
        )
    manifest = Manifest.from_json(mpath.read_text(), where=str(mpath))
    labels = check_dataset(root, manifest, hashes=verify, locking=locking)
    return ShardedDataset(
        root, manifest, labels, locking=locking, cache_bytes=cache_bytes,
        chunk_checksums=not verify if chunk_checksums is None else chunk_checksums,
    )
