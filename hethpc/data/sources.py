"""Readers of source formats for the converters; each yields ``(x, y)`` pieces, never writes.

Sources are opened read-only, and large arrays are read a piece at a time (``.npy`` through a
memory map, IDX from its offset), so converting never needs the whole dataset in memory.
"""

from __future__ import annotations

import gzip
import os
import pickle
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np

from hethpc.data.errors import DatasetError

Pieces = Iterator[tuple[np.ndarray, np.ndarray]]
PIECE = 8192  # samples per piece

_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def _open(path: Path) -> IO[bytes]:
    with open(path, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    return gzip.open(path, "rb") if gz else open(path, "rb")  # type: ignore[return-value]


def read_idx(path: str | os.PathLike[str]) -> np.ndarray:
    """An MNIST IDX file (plain or gzipped) as an array of its stored shape.

    Raises:
        DatasetError: not an IDX file (bad magic number) or shorter than its header says.
    """
    p = Path(path)
    with _open(p) as f:
        head = f.read(4)
        if len(head) != 4 or head[:2] != b"\x00\x00" or head[2] not in _IDX_DTYPES:
            raise DatasetError(f"{p} is not an IDX file (magic number {head.hex()})")
        ndim = head[3]
        shape = tuple(int.from_bytes(f.read(4), "big") for _ in range(ndim))
        dtype = np.dtype(_IDX_DTYPES[head[2]])
        data = f.read()
    want = int(np.prod(shape)) * dtype.itemsize
    if len(data) < want:
        raise DatasetError(f"{p} is truncated: {len(data)} data bytes, header says {want}")
    return np.frombuffer(data[:want], dtype=dtype).reshape(shape).astype(dtype.newbyteorder("="))


def pieces_of(x: np.ndarray, y: np.ndarray, *, piece: int = PIECE) -> Pieces:
    """``(x, y)`` in slices of ``piece`` samples (views of memory-mapped arrays stay lazy).

    Raises:
        DatasetError: ``x`` and ``y`` differ in length.
    """
    if len(x) != len(y):
        raise DatasetError(f"x has {len(x)} samples but y has {len(y)} labels")
    for a in range(0, len(y), piece):
        yield np.asarray(x[a : a + piece]), np.asarray(y[a : a + piece]).astype(np.int64)


def idx_pieces(images: str | os.PathLike[str], labels: str | os.PathLike[str]) -> Pieces:
    """Pieces of an MNIST-style pair of IDX files (images ``[n, ...]``, labels ``[n]``)."""
    x, y = read_idx(images), read_idx(labels)
    if y.ndim != 1:
        raise DatasetError(f"{labels} holds shape {y.shape}; a label file is one-dimensional")
    return pieces_of(x, y)


def npy_pieces(x_path: str | os.PathLike[str], y_path: str | os.PathLike[str]) -> Pieces:
    """Pieces of a pair of ``.npy`` files, memory-mapped read-only."""
    return pieces_of(np.load(x_path, mmap_mode="r"), np.load(y_path, mmap_mode="r"))


def npz_pieces(path: str | os.PathLike[str], *, x_key: str = "x", y_key: str = "y") -> Pieces:
    """Pieces of arrays ``x_key`` and ``y_key`` of an ``.npz`` archive.

    Raises:
        DatasetError: a key is missing (the message lists the keys present).
    """
    with np.load(path) as f:
        missing = [k for k in (x_key, y_key) if k not in f.files]
        if missing:
            raise DatasetError(f"{path} has no array {missing}; it holds {f.files}")
        x, y = f[x_key], f[y_key]
    return pieces_of(x, y)


def cifar_pieces(paths: Sequence[str | os.PathLike[str]]) -> tuple[Pieces, int]:
    """Pieces of CIFAR-10/100 python pickle batches, ``x`` uint8 ``[n, 3, 32, 32]``.

    Returns:
        The pieces and the number of classes (10, or 100 for CIFAR-100 fine labels).

    Raises:
        DatasetError: a file is not a CIFAR batch.
    """
    batches: list[tuple[np.ndarray, np.ndarray]] = []
    classes = 10
    for p in paths:
        with open(p, "rb") as f:
            try:
                d: dict[Any, Any] = pickle.load(f, encoding="bytes")  # noqa: S301 (trusted data)
            except Exception as e:
                raise DatasetError(f"{p} is not a CIFAR python batch ({e})") from e
        d = {(k.decode() if isinstance(k, bytes) else k): v for k, v in d.items()}
        key = "fine_labels" if "fine_labels" in d else "labels"
        if "data" not in d or key not in d:
            raise DatasetError(f"{p} is not a CIFAR batch (keys {sorted(d)})")
        classes = 100 if key == "fine_labels" else 10
        x = np.asarray(d["data"], dtype=np.uint8).reshape(-1, 3, 32, 32)
        batches.append((x, np.asarray(d[key], dtype=np.int64)))

    def gen() -> Pieces:
        for x, y in batches:
            yield from pieces_of(x, y)

    return gen(), classes


def synthetic_pieces(
    num_samples: int,
    sample_shape: tuple[int, ...],
    *,
    num_classes: int = 10,
    seed: int = 0,
    piece: int = PIECE,
) -> Pieces:
    """Seeded synthetic data of any shape and size: class prototype plus unit noise, float32.

    Generated a piece at a time, so any size fits in memory.
    """
    rng = np.random.default_rng(seed)
    protos = rng.standard_normal((num_classes, *sample_shape)).astype(np.float32)
    for a in range(0, num_samples, piece):
        n = min(piece, num_samples - a)
        y = rng.integers(0, num_classes, n)
        x = protos[y] + rng.standard_normal((n, *sample_shape), dtype=np.float32)
        yield x, y
