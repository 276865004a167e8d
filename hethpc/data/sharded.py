"""Reader of HDF5-sharded datasets: checks on open, lazy per-process file handles, chunk reads."""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

import h5py
import numpy as np
from h5py import h5s, h5z

from hethpc.data.errors import DatasetError, ShardError
from hethpc.data.manifest import MANIFEST_NAME, Manifest, ShardInfo, shard_path
from hethpc.data.mapped import FileRegion
from hethpc.data.writer import sha256_file

SHARD_SUFFIXES = (".h5", ".hdf5")


class ShardedDataset:
    """A read-only view of a dataset directory; build it with :func:`open_dataset`.

    Labels of every shard are held in memory (``labels``); samples are read on demand in whole
    HDF5 chunks (the unit HDF5 checksums and decompresses), kept in a small LRU cache, so reads
    of indices that share chunks cost one chunk read. File handles are opened lazily in the
    process that reads and reopened after a fork (h5py handles do not survive one), so the
    object may be built before workers are started and pickled to them.

    Without ``chunk_checksums``, chunks stored uncompressed are read as raw bytes, skipping
    HDF5's filter pipeline and its per-chunk Fletcher32 test: the shard files are mapped
    read-only side by side into one address range (:class:`~hethpc.data.mapped.FileRegion`),
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
        self._paths = [shard_path(root, s.file) for s in manifest.shards]
        counts = np.array([s.num_samples for s in manifest.shards], dtype=np.int64)
        self._starts = np.concatenate([[0], np.cumsum(counts)])
        self._chunk = manifest.chunk_samples
        self._sizes = counts
        self._sample_size = int(np.prod(manifest.sample_shape))
        self._dtype = self.dtype
        self._row_bytes = self._sample_size * self._dtype.itemsize
        chunk_bytes = self._chunk * self._row_bytes
        # Every chunk, numbered across shards: its shard and its first sample's global index.
        nchunks = -(-counts // self._chunk)
        self._chunk_base = np.concatenate([[0], np.cumsum(nchunks)]).astype(np.int64)
        self._chunk_shard = np.repeat(np.arange(len(counts), dtype=np.int64), nchunks)
        self._chunk_first = (
            self._starts[self._chunk_shard]
            + (np.arange(len(self._chunk_shard)) - self._chunk_base[self._chunk_shard])
            * self._chunk
        )
        # Every shard but the last holds whole chunks: chunk ``i`` starts at sample ``i * chunk``.
        self._even_chunks = bool((counts[:-1] % self._chunk == 0).all())
        self._nslots = max(1, self.cache_bytes // max(1, chunk_bytes))
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._files: dict[int, h5py.File] = {}
        self._x: dict[int, h5py.Dataset] = {}
        self._spaces: dict[int, h5s.SpaceID] = {}  # file dataspace per shard, reselected
        self._mspaces: dict[int, h5s.SpaceID] = {}  # memory dataspace per sample count
        # Decoded chunks: a slab of slots, allocated on first use; LRU map key -> slot.
        self._slab: np.ndarray | None = None
        self._cache: OrderedDict[int, int] = OrderedDict()
        self._free = list(range(self._nslots))[::-1]
        self._buffer: np.ndarray | None = None  # one chunk, for read_window
        self._raw: dict[int, bool] = {}  # shard -> its chunks are read raw from its mapped file
        self._region: FileRegion | None = None  # the shard files, mapped on demand
        # Each chunk's first sample's byte offset in the region; -1: its shard is not mapped.
        self._chunk_at = np.full(len(self._chunk_shard), -1, dtype=np.int64)
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        d = self.__dict__.copy()
        for k in ("_files", "_x", "_spaces", "_mspaces", "_slab", "_cache", "_lock", "_pid",
                  "_free", "_buffer", "_raw", "_region", "_chunk_at"):
            d.pop(k, None)
        return d

    def __setstate__(self, d: dict[str, Any]) -> None:
        self.__dict__.update(d)
        self._reset()

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

    def _shape(self, m: int) -> tuple[int, ...]:
        """The shape of ``m`` samples."""
        return (m, *self.manifest.sample_shape)

    def _file(self, shard: int) -> h5py.File:
        if os.getpid() != self._pid:
            self._reset()  # forked: the parent's handles are not usable here
        f = self._files.get(shard)
        if f is None:
            kw: dict[str, Any] = {} if self.locking is None else {"locking": self.locking}
            try:
                f = h5py.File(self._paths[shard], "r", **kw)
            except OSError as e:
                raise ShardError(
                    f"cannot open shard {self._paths[shard]}: {e}; run "
                    f"'python data_tools/inspect_dataset.py {self.root} --verify'"
                ) from e
            self._files[shard] = f
        return f

    def _dataset_x(self, shard: int) -> h5py.Dataset:
        x = self._x.get(shard)
        if x is None:
            x = self._x[shard] = self._file(shard)["x"]
        return x

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
                ok = filters <= {h5z.FILTER_FLETCHER32} and self._map_shard(shard, x)
            self._raw[shard] = ok
        return ok

    def _map_shard(self, shard: int, x: h5py.Dataset) -> bool:
        """Map ``shard``'s file and note where its chunks lie; False (HDF5 reads it) when a
        chunk is missing or not stored as plain bytes, or the file cannot be mapped."""
        chunk_bytes = self._chunk * self._row_bytes
        first = self._chunk_base[shard]
        nchunks = int(self._chunk_base[shard + 1] - first)
        where = np.full(nchunks, -1, dtype=np.int64)
        size = self.manifest.shards[shard].num_bytes

        def note(info: Any) -> None:
            c, rest = divmod(int(info.chunk_offset[0]), self._chunk)
            off = int(info.byte_offset)
            if (not rest and c < nchunks and info.size in (chunk_bytes, chunk_bytes + 4)
                    and 0 <= off and off + chunk_bytes <= size):
                where[c] = off  # Fletcher32's 4 bytes, if any, follow the data

        try:
            if hasattr(x.id, "chunk_iter"):
                x.id.chunk_iter(note)
            else:  # older HDF5: one lookup per chunk
                for i in range(x.id.get_num_chunks()):
                    note(x.id.get_chunk_info(i))
            if nchunks and where.min() < 0:
                return False
            if self._region is None:
                self._region = FileRegion([s.num_bytes for s in self.manifest.shards])
            self._region.map(shard, self._paths[shard])
        except (OSError, ValueError, KeyError, RuntimeError):
            return False
        self._chunk_at[first : first + nchunks] = where + self._region.starts[shard]
        return True

    def _mapped_rows(self, shard: int, a: int, b: int) -> np.ndarray:
        """Samples ``a .. b-1`` of a raw ``shard``, all in one chunk: a read-only view of its
        mapped file."""
        c = a // self._chunk
        at = int(self._chunk_at[self._chunk_base[shard] + c]) + (a - c * self._chunk) * (
            self._row_bytes
        )
        assert self._region is not None
        rows = self._region.data[at : at + (b - a) * self._row_bytes]
        return rows.view(self.dtype).reshape(b - a, *self.sample_shape)

    def _read_mapped(self, idx: np.ndarray) -> np.ndarray | None:
        """Samples at ``idx`` (checked; any order, repeats allowed), gathered in that order
        straight from the mapped files by one copy; None when a shard they lie in is not raw.
        Call with the lock held."""
        if self.chunk_checksums or not len(idx):
            return None
        if self._even_chunks:
            gc = idx // self._chunk
        else:
            gc = np.searchsorted(self._chunk_first, idx, side="right") - 1
        at = self._chunk_at[gc]
        if at.min() < 0:  # a shard not mapped yet, or not raw
            for s in np.unique(self._chunk_shard[gc[at < 0]]).tolist():
                if not self._raw_chunks(s):
                    return None
            at = self._chunk_at[gc]
        assert self._region is not None
        at += (idx - self._chunk_first[gc]) * self._row_bytes
        rows = self._region.rows(self._row_bytes)[at]
        return rows.view(self._dtype).reshape(self._shape(len(idx)))

    def _chunk_rows(self, shard: int, a: int, b: int, buf: np.ndarray) -> np.ndarray:
        """Samples ``a .. b-1`` of ``shard``, all in one chunk, as an array valid until the
        next call: a view of its mapped file when :meth:`_raw_chunks` allows, else
        ``buf[: b - a]`` filled by HDF5."""
        if self._raw_chunks(shard):
            return self._mapped_rows(shard, a, b)
        self._read_into(shard, a, b, buf[: b - a])
        return buf[: b - a]

    def _read_into(self, shard: int, a: int, b: int, dest: np.ndarray) -> None:
        """Samples ``a .. b-1`` of ``shard`` straight into ``dest`` (C-contiguous)."""
        if self._raw_chunks(shard):
            for c0 in range(a - a % self._chunk, b, self._chunk):
                lo, hi = max(a, c0), min(b, c0 + self._chunk)
                dest[lo - a : hi - a] = self._chunk_rows(shard, lo, hi, dest[lo - a : hi - a])
            return
        try:
            # h5py's low-level read: read_direct's selection objects cost ~0.1 ms a call.
            did = self._dataset_x(shard).id
            fspace = self._spaces.get(shard)
            if fspace is None:
                fspace = self._spaces[shard] = did.get_space()
            rest = self.sample_shape
            fspace.select_hyperslab((a, *(0 for _ in rest)), (b - a, *rest))
            mspace = self._mspaces.get(b - a)
            if mspace is None:
                mspace = self._mspaces[b - a] = h5s.create_simple((b - a, *rest))
            did.read(mspace, fspace, dest)
        except OSError as e:
            raise ShardError(
                f"shard {self._paths[shard]} is corrupt (samples {a}..{b - 1} fail their HDF5 "
                f"checksum: {e}); restore or re-convert it, and verify the dataset "
                "(open_dataset(..., verify=True))"
            ) from e

    def _slots(self, keys: list[int]) -> np.ndarray:
        """Cache slots holding chunks ``keys`` (``shard << 32 | chunk``), reading missing ones.

        At most ``len(self._slab)`` keys; none of them is evicted by the others.
        """
        if self._slab is None:
            self._slab = np.empty((self._nslots, self._chunk, *self.sample_shape), self.dtype)
        slots = np.empty(len(keys), dtype=np.int64)
        missing = []
        for i, k in enumerate(keys):
            slot = self._cache.get(k)
            if slot is None:
                missing.append(i)
            else:
                self._cache.move_to_end(k)  # used now: evict others first
                slots[i] = slot
        for i in missing:
            k = keys[i]
            shard, chunk = k >> 32, k & 0xFFFFFFFF
            slot = self._free.pop() if self._free else self._cache.popitem(last=False)[1]
            a = chunk * self._chunk
            b = min(a + self._chunk, int(self._sizes[shard]))
            try:
                self._read_into(shard, a, b, self._slab[slot, : b - a])
            except ShardError:
                self._free.append(slot)
                raise
            self._cache[k] = slot
            slots[i] = slot
        return slots

    def _gather(
        self, pos: np.ndarray | None, shard: np.ndarray, local: np.ndarray
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
        c_len = self._chunk
        chunk = local // c_len
        key = (shard << 32) | chunk
        first = np.r_[True, key[1:] != key[:-1]]
        gstart = np.flatnonzero(first)
        gend = np.r_[gstart[1:], m]
        gkey, gshard, gchunk = key[gstart], shard[gstart], chunk[gstart]
        direct = np.zeros(len(gstart), dtype=bool)
        if pos is None:
            clen = np.minimum(c_len, self._sizes[gshard] - gchunk * c_len)
            dup = np.r_[False, local[1:] == local[:-1]] & ~first
            ndup = np.add.reduceat(dup.astype(np.int64), gstart)
            direct = (
                (gend - gstart == clen) & (local[gstart] == gchunk * c_len) & (ndup == 0)
            )
            for g in np.flatnonzero(direct):
                if int(gkey[g]) in self._cache:
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
                self._read_into(int(gshard[dg[i]]), la, la + (b - a), out[a:b])
                i = j
        rest = np.flatnonzero(~direct)
        if not len(rest):
            return out
        group = np.cumsum(first) - 1  # each sample's group
        for s0 in range(0, len(rest), self._nslots):
            groups = rest[s0 : s0 + self._nslots]
            slot_of = np.zeros(len(gstart), dtype=np.int64)
            slot_of[groups] = self._slots(gkey[groups].tolist())
            flat = self._slab.reshape(-1, *self.sample_shape)  # type: ignore[union-attr]
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
        idx = self._check(indices)
        with self._lock:
            out = self._read_mapped(idx)
            if out is None:
                out = self._gather(*self._sorted(idx))
        return out, self.labels[idx]

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
        idx = self._check(indices)
        with self._lock:
            out = self._read_mapped(idx)
            if out is None:
                out = self._read_chunks(idx)
        return out, self.labels[idx]

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
            for f in self._files.values():
                f.close()
            self._files.clear()
            self._x.clear()
            self._spaces.clear()
            self._cache.clear()
            self._slab = None
            self._buffer = None
            self._raw.clear()
            self._region = None
            self._chunk_at[:] = -1
            self._free = list(range(self._nslots))[::-1]


def hash_problems(root: Path, manifest: Manifest, shards: list[int]) -> list[str]:
    """A message for each of the shards (indices into ``manifest.shards``) whose file's sha256
    differs from the manifest's."""
    problems = []
    for i in shards:
        s = manifest.shards[i]
        p = shard_path(root, s.file)
        if sha256_file(p) != s.sha256:
            problems.append(
                f"shard {p} fails its sha256 checksum (corrupt or modified; restore it or "
                "convert the dataset again)"
            )
    return problems


def _problem_files(root: Path, manifest: Manifest) -> list[str]:
    problems = []
    listed = {s.file for s in manifest.shards}
    for s in manifest.shards:
        p = shard_path(root, s.file)
        if not p.is_file():
            problems.append(f"missing shard file {p} (restore it or convert the dataset again)")
        elif p.stat().st_size != s.num_bytes:
            problems.append(
                f"shard {p} is {p.stat().st_size} bytes, the manifest says {s.num_bytes} "
                "(truncated or replaced; restore it or convert the dataset again)"
            )
    for p in sorted(root.iterdir()):
        if p.suffix in SHARD_SUFFIXES and p.name not in listed:
            problems.append(
                f"extra shard file {p} is not in {MANIFEST_NAME} (remove it, or convert again "
                "so that the manifest lists it)"
            )
    return problems


def _check_shard(p: Path, s: ShardInfo, m: Manifest, locking: bool | None) -> np.ndarray:
    kw: dict[str, Any] = {} if locking is None else {"locking": locking}
    try:
        with h5py.File(p, "r", **kw) as f:
            if "x" not in f or "y" not in f:
                raise ShardError(f"shard {p} lacks dataset 'x' or 'y'; convert the data again")
            x, y = f["x"], f["y"]
            want = (s.num_samples, *m.sample_shape)
            if x.shape != want or y.shape != (s.num_samples,):
                raise ShardError(
                    f"shard {p} holds x{x.shape}, y{y.shape}; the manifest says x{want}, "
                    f"y({s.num_samples},); shards disagree: convert the dataset again"
                )
            if x.dtype != np.dtype(m.dtype) or y.dtype != np.dtype(m.label_dtype):
                raise ShardError(
                    f"shard {p} has dtypes x {x.dtype}, y {y.dtype}; the manifest says "
                    f"{m.dtype}, {m.label_dtype}; convert the dataset again"
                )
            labels = y[:].astype(np.int64)
    except OSError as e:
        raise ShardError(f"shard {p} is not a readable HDF5 file ({e}); restore it") from e
    if len(labels) and (labels.min() < 0 or labels.max() >= m.num_classes):
        raise ShardError(f"shard {p} has labels outside 0..{m.num_classes - 1}")
    hist = np.bincount(labels, minlength=m.num_classes).tolist()
    if hist != list(s.label_counts):
        raise ShardError(f"shard {p}: label histogram {hist} differs from the manifest's")
    return labels


def open_dataset(
    path: str | os.PathLike[str],
    *,
    verify: bool = True,
    locking: bool | None = None,
    cache_bytes: int = 128 << 20,
    chunk_checksums: bool | None = None,
) -> ShardedDataset:
    """Open a dataset directory written by :class:`~hethpc.data.DatasetWriter`.

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
        raise DatasetError(
            f"{root} is not a dataset directory (no {MANIFEST_NAME}); create one with "
            "data_tools/convert.py"
        )
    manifest = Manifest.from_json(mpath.read_text(), where=str(mpath))
    problems = _problem_files(root, manifest)
    labels: list[np.ndarray] = []
    if not problems:
        for i, s in enumerate(manifest.shards):
            p = shard_path(root, s.file)
            bad = hash_problems(root, manifest, [i]) if verify else []
            if bad:
                problems += bad
                continue
            try:
                labels.append(_check_shard(p, s, manifest, locking))
            except ShardError as e:
                problems.append(str(e))
    if problems:
        raise ShardError(f"dataset {root} is damaged:\n  " + "\n  ".join(problems))
    return ShardedDataset(
        root, manifest, np.concatenate(labels), locking=locking, cache_bytes=cache_bytes,
        chunk_checksums=not verify if chunk_checksums is None else chunk_checksums,
    )
