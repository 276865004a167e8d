"""Shard files mapped side by side into one address range: one gather copies rows from many."""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from hethpc.comm.buffers import HUGE_PAGE

# MAP_FIXED is not in Python's mmap module; it has this value on Linux, macOS and the BSDs.
_MAP_FIXED = 0x10 if sys.platform.startswith(("linux", "darwin", "freebsd")) else 0
_PAGE = mmap.PAGESIZE
# Each file starts on a 2 MiB boundary of the range (the PMD size of x86-64 and arm64 with 4 KiB
# pages), as ``numpy.memmap``'s own mapping does: a file offset and its address then agree
# modulo 2 MiB, which lets the kernel map a large page-cache folio with one fault (a PMD entry)
# instead of one fault per 64 KiB or less. Address space only; no memory is committed.
_FILE_ALIGN = max(_PAGE, HUGE_PAGE)
_mmap_fn: Any = None


def _libc_mmap() -> Any:
    """libc's ``mmap``, typed for ctypes (looked up once)."""
    global _mmap_fn
    if _mmap_fn is None:
        fn = ctypes.CDLL(None, use_errno=True).mmap
        fn.restype = ctypes.c_void_p
        fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_int64]
        _mmap_fn = fn
    return _mmap_fn


class FileRegion:
    """Read-only files mapped, each at its own page-aligned offset, into one reserved range.

    One array, :attr:`data`, then spans every file, so one fancy-indexing gather copies rows
    that lie in different files straight from the page cache into its result: each byte is
    copied once, as with ``numpy.memmap`` of a single file. The range is reserved when the
    object is built (address space only: a read-only anonymous mapping commits no memory);
    files are mapped into it on demand (:meth:`map`). It is released, with every file mapped
    in it, when the object and every view of its data are gone.

    A file truncated while it is mapped makes reads of its lost pages fail with SIGBUS, as
    with any memory map (shards are replaced by renaming, which leaves a mapped file intact).

    Args:
        sizes: each file's size in bytes.

    Raises:
        OSError: the platform has no ``MAP_FIXED`` or the range cannot be reserved.
    """

    def __init__(self, sizes: Sequence[int]) -> None:
        if not _MAP_FIXED:
            raise OSError(f"no MAP_FIXED on {sys.platform}: files cannot share a range")
        spans = [-(-int(s) // _FILE_ALIGN) * _FILE_ALIGN for s in sizes]
        self.sizes = [int(s) for s in sizes]
        self.starts = np.concatenate([[0], np.cumsum(spans)]).astype(np.int64)
        total = max(_PAGE, int(self.starts[-1]))
        self._reserved = mmap.mmap(-1, total + _FILE_ALIGN, flags=mmap.MAP_PRIVATE,
                                   prot=mmap.PROT_READ)
        whole = np.frombuffer(self._reserved, dtype=np.uint8)
        skip = -whole.ctypes.data % _FILE_ALIGN
        self.data = whole[skip : skip + total]
        self.mapped = [False] * len(self.sizes)
        self._rows: dict[int, np.ndarray] = {}

    def map(self, i: int, path: str | os.PathLike[str]) -> None:
        """Map file ``i`` (read-only, shared with the page cache) at ``starts[i]``.

        Raises:
            OSError: the file cannot be opened or mapped, or its size is not ``sizes[i]``.
        """
        if self.mapped[i]:
            return
        fd = os.open(Path(path), os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            if size != self.sizes[i]:
                raise OSError(f"{path} is {size} bytes, expected {self.sizes[i]}")
            if size:
                at = self.data.ctypes.data + int(self.starts[i])
                got = _libc_mmap()(at, size, mmap.PROT_READ, mmap.MAP_SHARED | _MAP_FIXED, fd, 0)
                if got != at:
                    err = ctypes.get_errno()
                    raise OSError(err, f"cannot map {path}: {os.strerror(err)}")
        finally:
            os.close(fd)
        self.mapped[i] = True

    def rows(self, row_bytes: int) -> np.ndarray:
        """:attr:`data` as overlapping rows of ``row_bytes`` bytes, one starting at every byte
        (shape ``[len(data) - row_bytes + 1, row_bytes]``, read-only): ``rows[offsets]`` gathers
        the rows that start at those byte offsets, each by one contiguous copy."""
        got = self._rows.get(row_bytes)
        if got is None:
            n = max(0, len(self.data) - row_bytes + 1)
            got = as_strided(self.data, shape=(n, row_bytes), strides=(1, 1), writeable=False)
            self._rows[row_bytes] = got
        return got


class MappedShards:
    """Where each chunk of a dataset's shards lies once their files are mapped into one
    :class:`FileRegion`, and gathers of samples from there.

    Chunks are numbered across shards in storage order; a shard's chunks are noted when its
    file is mapped (:meth:`map`), after checking that HDF5 stores every one as plain bytes.

    Args:
        counts: samples in each shard.
        chunk: samples per chunk.
        file_sizes: each shard file's size in bytes.
        sample_shape: shape of one sample.
        dtype: dtype of the samples.
    """

    def __init__(
        self, counts: np.ndarray, chunk: int, file_sizes: Sequence[int],
        sample_shape: tuple[int, ...], dtype: np.dtype[Any],
    ) -> None:
        self.chunk, self.file_sizes = int(chunk), list(file_sizes)
        self.sample_shape, self.dtype = sample_shape, dtype
        self.row_bytes = int(np.prod(sample_shape)) * dtype.itemsize
        starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        nchunks = -(-np.asarray(counts, dtype=np.int64) // self.chunk)
        self.base = np.concatenate([[0], np.cumsum(nchunks)]).astype(np.int64)
        self.shard_of = np.repeat(np.arange(len(nchunks), dtype=np.int64), nchunks)
        self.first = starts[self.shard_of] + (
            np.arange(len(self.shard_of)) - self.base[self.shard_of]) * self.chunk
        # Every shard but the last holds whole chunks: chunk ``i`` starts at sample ``i * chunk``.
        self.even = bool((np.asarray(counts)[:-1] % self.chunk == 0).all())
        self.region: FileRegion | None = None
        self.at = np.full(len(self.shard_of), -1, dtype=np.int64)  # -1: shard not mapped
        self.complete = not len(self.file_sizes)  # every shard file is mapped
        # Every chunk starts at a multiple of a sample's bytes in the region (page-aligned chunks
        # of page-sized samples, as the writer lays them out): gathers then index whole rows
        # of a typed view with ``np.take``, as ``numpy.memmap`` does.
        self._typed: np.ndarray | None = None

    def map(self, shard: int, x: Any, path: str | os.PathLike[str]) -> bool:
        """Map ``shard``'s file, whose HDF5 dataset of samples is ``x``, and note where its
        chunks lie. False (leave it to HDF5) when a chunk is missing or not stored as plain
        bytes, or the file cannot be mapped."""
        chunk_bytes = self.chunk * self.row_bytes
        first = int(self.base[shard])
        nchunks = int(self.base[shard + 1]) - first
        where = np.full(nchunks, -1, dtype=np.int64)
        size = self.file_sizes[shard]

        def note(info: Any) -> None:
            c, rest = divmod(int(info.chunk_offset[0]), self.chunk)
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
            if self.region is None:
                self.region = FileRegion(self.file_sizes)
            self.region.map(shard, path)
        except (OSError, ValueError, KeyError, RuntimeError):
            return False
        self.at[first : first + nchunks] = where + self.region.starts[shard]
        self.complete = all(self.region.mapped)
        self._typed = None
        if self.complete and self.row_bytes and not (self.at % self.row_bytes).any():
            data = self.region.data
            whole = len(data) // self.row_bytes * self.row_bytes
            self._typed = data[:whole].view(self.dtype).reshape(-1, *self.sample_shape)
        return True

    def rows(self, shard: int, a: int, b: int) -> np.ndarray:
        """Samples ``a .. b-1`` of a mapped ``shard``, all in one chunk: a read-only view."""
        c = a // self.chunk
        at = int(self.at[self.base[shard] + c]) + (a - c * self.chunk) * self.row_bytes
        assert self.region is not None
        rows = self.region.data[at : at + (b - a) * self.row_bytes]
        return rows.view(self.dtype).reshape(b - a, *self.sample_shape)

    def offsets(self, idx: np.ndarray) -> np.ndarray | None:
        """Byte offsets in the region of the samples at global indices ``idx`` (checked), for
        :meth:`read`; None when one lies in a shard not mapped."""
        if self.even:
            gc = idx // self.chunk
        else:
            gc = np.searchsorted(self.first, idx, side="right") - 1
        at = self.at[gc]
        if len(at) and at.min() < 0:
            return None
        at += (idx - self.first[gc]) * self.row_bytes
        return at

    def read(self, offsets: np.ndarray) -> np.ndarray:
        """The samples at ``offsets`` (from :meth:`offsets`; every shard mapped:
        ``complete``), in that order, by one gather."""
        if self._typed is not None:
            return self._typed.take(offsets // self.row_bytes, axis=0)
        assert self.region is not None
        rows = self.region.rows(self.row_bytes)[offsets]
        return rows.view(self.dtype).reshape(len(offsets), *self.sample_shape)

    def gather(self, idx: np.ndarray, map_shard: Callable[[int], bool]) -> np.ndarray | None:
        """Samples at global indices ``idx`` (checked, non-empty; any order, repeats allowed),
        copied in that order from the mapped files by one gather. Shards not mapped yet are
        offered to ``map_shard``; None when it declines one."""
        if self.even:
            gc = idx // self.chunk
        else:
            gc = np.searchsorted(self.first, idx, side="right") - 1
        at = self.at[gc]
        if at.min() < 0:  # a shard not mapped yet, or not raw
            for s in np.unique(self.shard_of[gc[at < 0]]).tolist():
                if not map_shard(s):
                    return None
            at = self.at[gc]
        assert self.region is not None
        at += (idx - self.first[gc]) * self.row_bytes
        rows = self.region.rows(self.row_bytes)[at]
        return rows.view(self.dtype).reshape(len(idx), *self.sample_shape)
