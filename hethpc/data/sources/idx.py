"""MNIST's IDX files (plain or gzipped), their headers checked against their length."""

from __future__ import annotations

import gzip
import io
import math
import os
import zlib
from pathlib import Path

import numpy as np

from hethpc.data.errors import SourceError
from hethpc.data.sources.pieces import Pieces, check_pair, pieces_of

_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
_BLOCK = 1 << 20  # bytes per read when measuring a gzipped file


def _read_exact(f: io.BufferedIOBase, buf: np.ndarray) -> int:
    """Fill ``buf`` (uint8) from ``f``; the number of bytes read (fewer only at end of file)."""
    view, got = buf.data, 0
    while got < len(view):
        n = f.readinto(view[got:])
        if not n:
            break
        got += n
    return got


def _measure(f: io.BufferedIOBase, limit: int) -> int:
    """Bytes left in ``f``, counted a block at a time up to ``limit`` (nothing is kept)."""
    block, got = np.empty(min(_BLOCK, max(limit, 1)), np.uint8), 0
    while got < limit:
        n = _read_exact(f, block)
        got += n
        if n < len(block):
            break
    return got


def read_idx(path: str | os.PathLike[str]) -> np.ndarray:
    """An MNIST IDX file (plain or gzipped) as an array of its stored shape.

    The dimensions in the header are checked against the file's length (a gzipped file's
    decompressed length, measured without keeping it) before the array is allocated.

    Raises:
        SourceError: not an IDX file (bad magic number), a corrupt gzip stream, or data shorter
            than the header says.
    """
    p = Path(path)
    with open(p, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    try:
        with gzip.open(p, "rb") if gz else open(p, "rb") as f:
            head = f.read(4)
            if len(head) != 4 or head[:2] != b"\x00\x00" or head[2] not in _IDX_DTYPES:
                raise SourceError(f"{p}: is not an IDX file (magic number {head.hex()}); "
                                  "expected 00 00 <type> <ndim> as in MNIST's files")
            dims = f.read(4 * head[3])
            if len(dims) != 4 * head[3]:
                raise SourceError(f"{p}: is truncated inside its IDX header ({len(dims)} of "
                                  f"{4 * head[3]} bytes of dimensions); download it again")
            shape = tuple(int.from_bytes(dims[i : i + 4], "big") for i in range(0, len(dims), 4))
            dtype = np.dtype(_IDX_DTYPES[head[2]])
            want = math.prod(shape) * dtype.itemsize
            if gz:
                have = _measure(f, want)
                f.seek(4 + len(dims))
            else:
                have = os.fstat(f.fileno()).st_size - 4 - len(dims)
            if have < want:
                raise SourceError(
                    f"{p}: is truncated: its header claims shape {shape} of {dtype.name} "
                    f"({want} data bytes) but it holds {have}{' decompressed' if gz else ''} "
                    "data bytes; expected a complete IDX file: download it again"
                )
            buf = np.empty(want, np.uint8)
            if _read_exact(f, buf) < want:
                raise SourceError(f"{p}: shrank while it was read; convert it again")
    except (EOFError, zlib.error, gzip.BadGzipFile) as e:
        raise SourceError(f"{p}: corrupt gzip stream ({e}); download the file again") from e
    return buf.view(dtype).reshape(shape).astype(dtype.newbyteorder("="), copy=False)


def read_idx_pair(
    images: str | os.PathLike[str], labels: str | os.PathLike[str]
) -> tuple[np.ndarray, np.ndarray]:
    """Images ``[n, ...]`` and labels ``[n]`` of an MNIST-style pair of IDX files.

    Raises:
        SourceError: a file is not IDX, or the two do not make ``n`` labelled samples.
    """
    x, y = read_idx(images), read_idx(labels)
    check_pair(x, y, f"{images}: the image array", f"{labels}: the label array")
    return x, y


def idx_pieces(images: str | os.PathLike[str], labels: str | os.PathLike[str]) -> Pieces:
    """Pieces of an MNIST-style pair of IDX files (images ``[n, ...]``, labels ``[n]``)."""
    return pieces_of(*read_idx_pair(images, labels))
