"""Files mapped side by side into one address range, so one gather copies rows from many files."""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

# MAP_FIXED is not in Python's mmap module; it has this value on Linux, macOS and the BSDs.
_MAP_FIXED = 0x10 if sys.platform.startswith(("linux", "darwin", "freebsd")) else 0
_PAGE = mmap.PAGESIZE
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
        pages = [-(-int(s) // _PAGE) * _PAGE for s in sizes]
        self.sizes = [int(s) for s in sizes]
        self.starts = np.concatenate([[0], np.cumsum(pages)]).astype(np.int64)
        total = max(_PAGE, int(self.starts[-1]))
        self._reserved = mmap.mmap(-1, total, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ)
        self.data = np.frombuffer(self._reserved, dtype=np.uint8)
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
