"""Readers of source formats for the converters; each yields ``(x, y)`` pieces, never writes.

Sources are opened read-only, and large arrays are read a piece at a time (``.npy`` through a
memory map), so converting never needs the whole dataset in memory. Source files come from the
internet, so nothing in them is trusted: pickles may name only the globals a CIFAR batch needs,
``.npy``/``.npz`` files are read without pickle, and IDX headers are checked against the file's
length before anything is allocated.
"""

from __future__ import annotations

import gzip
import io
import math
import os
import pickle
import zipfile
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np

from hethpc.data.errors import DatasetError, SourceError

Pieces = Iterator[tuple[np.ndarray, np.ndarray]]
PIECE = 8192  # samples per piece

_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
_NPY_MAGIC = b"\x93NUMPY"
_BLOCK = 1 << 20  # bytes per read when measuring a gzipped file
_CIFAR_URL = "https://www.cs.toronto.edu/~kriz/cifar.html"


def holdout(
    num_samples: int, *, test_fraction: float, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """A seeded split of ``range(num_samples)`` into train and test indices.

    ``round(num_samples * (1 - test_fraction))`` samples of a ``default_rng(seed)`` permutation
    go to train, the rest to test; each side is sorted, so reads stay in source order.

    Returns:
        Train and test indices, int64 ``[k]`` and ``[num_samples - k]``.

    Raises:
        ValueError: ``test_fraction`` is not finite and in ``[0, 1)``.
    """
    if not (math.isfinite(test_fraction) and 0 <= test_fraction < 1):
        raise ValueError(f"test_fraction must be finite and in [0, 1), got {test_fraction}")
    perm = np.random.default_rng(seed).permutation(num_samples)
    k = int(round(num_samples * (1 - test_fraction)))
    return np.sort(perm[:k]), np.sort(perm[k:])


def pieces_of(
    x: np.ndarray, y: np.ndarray, *, piece: int = PIECE, index: np.ndarray | None = None
) -> Pieces:
    """``(x, y)`` in slices of ``piece`` samples (views of memory-mapped arrays stay lazy).

    Args:
        x: samples ``[n, ...]``.
        y: labels ``[n]``.
        piece: samples per piece.
        index: if given, only these samples (in this order), read ``piece`` at a time.

    Raises:
        DatasetError: ``x`` and ``y`` differ in length.
    """
    if len(x) != len(y):
        raise DatasetError(f"x has {len(x)} samples but y has {len(y)} labels")
    if index is None:
        for a in range(0, len(y), piece):
            yield np.asarray(x[a : a + piece]), np.asarray(y[a : a + piece]).astype(np.int64)
        return
    for a in range(0, len(index), piece):
        i = index[a : a + piece]
        yield np.asarray(x[i]), np.asarray(y[i]).astype(np.int64)


def _check_pair(x: np.ndarray, y: np.ndarray, xs: str, ys: str) -> None:
    """Refuse samples ``x`` and labels ``y`` unfit for a dataset; ``xs``, ``ys`` name them."""
    if x.ndim < 1:
        raise SourceError(f"{xs} has shape (); expected samples of shape [n, ...]")
    if y.ndim != 1:
        raise SourceError(f"{ys} has shape {y.shape}; expected labels of shape [n]")
    whole = y.dtype.kind in "biu" or (y.dtype.kind == "f" and bool(np.all(np.mod(y, 1) == 0)))
    if not whole:
        raise SourceError(f"{ys} has dtype {y.dtype} (not whole numbers); expected class labels")
    if len(x) != len(y):
        raise SourceError(f"{xs} holds {len(x)} samples but {ys} holds {len(y)} labels; "
                          "expected one label per sample")
    if len(y) == 0:
        raise SourceError(f"{ys} holds no samples; expected at least one")


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
    _check_pair(x, y, f"{images}: the image array", f"{labels}: the label array")
    return x, y


def idx_pieces(images: str | os.PathLike[str], labels: str | os.PathLike[str]) -> Pieces:
    """Pieces of an MNIST-style pair of IDX files (images ``[n, ...]``, labels ``[n]``)."""
    return pieces_of(*read_idx_pair(images, labels))


def _npy_dtype(fp: IO[bytes]) -> np.dtype[Any] | None:
    """The dtype in the ``.npy`` header at ``fp``, or None where ``fp`` holds no such header."""
    fmt = np.lib.format
    try:
        version = fmt.read_magic(fp)
        # Version 3 differs from 2 only in the header's text encoding, so 2's reader reads it.
        read = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
        dtype: np.dtype[Any] = read(fp)[2]
    except (ValueError, EOFError, SyntaxError):
        return None
    return dtype


def _refuse_objects(dtype: np.dtype[Any] | None, where: str, saver: str) -> None:
    if dtype is None:
        raise SourceError(f"{where} has no .npy header; expected an array saved by {saver}")
    if dtype.hasobject:
        raise SourceError(f"{where} holds Python objects (dtype {dtype}), refused: loading them "
                          f"could run code; expected a numeric array saved by {saver}")


def read_npy(path: str | os.PathLike[str]) -> np.ndarray:
    """A ``.npy`` array, memory-mapped read-only, never unpickled.

    Raises:
        SourceError: not a ``.npy`` file, an object array, or truncated.
    """
    with open(path, "rb") as f:
        _refuse_objects(_npy_dtype(f), f"{path}:", "numpy.save")
    try:
        a: np.ndarray = np.load(path, mmap_mode="r", allow_pickle=False)
    except ValueError as e:
        raise SourceError(f"{path}: unreadable .npy file ({e}); expected an array saved by "
                          "numpy.save: save it again") from e
    return a


def read_npy_pair(
    x_path: str | os.PathLike[str], y_path: str | os.PathLike[str]
) -> tuple[np.ndarray, np.ndarray]:
    """Samples ``[n, ...]`` and labels ``[n]`` of a pair of ``.npy`` files, memory-mapped.

    Raises:
        SourceError: a file is not a numeric ``.npy`` array, or the two do not pair up.
    """
    x, y = read_npy(x_path), read_npy(y_path)
    _check_pair(x, y, f"{x_path}: the sample array", f"{y_path}: the label array")
    return x, y


def npy_pieces(x_path: str | os.PathLike[str], y_path: str | os.PathLike[str]) -> Pieces:
    """Pieces of a pair of ``.npy`` files, memory-mapped read-only."""
    return pieces_of(*read_npy_pair(x_path, y_path))


def read_npz(
    path: str | os.PathLike[str], *, x_key: str = "x", y_key: str = "y"
) -> tuple[np.ndarray, np.ndarray]:
    """Arrays ``x_key`` (samples ``[n, ...]``) and ``y_key`` (labels ``[n]``) of an ``.npz``.

    Raises:
        SourceError: not an ``.npz`` archive, a key is missing (the message lists the keys
            present), an array holds Python objects or is corrupt, or the two do not pair up.
    """
    if not zipfile.is_zipfile(path):
        with open(path, "rb") as f:
            npy = f.read(len(_NPY_MAGIC)) == _NPY_MAGIC
        what = "a .npy file, not an .npz archive" if npy else "not an .npz (zip) archive"
        raise SourceError(f"{path}: is {what}; expected an archive saved by numpy.savez "
                          "(a .npy pair converts with the npy converter)")
    try:
        with np.load(path, allow_pickle=False) as f:
            missing = [k for k in (x_key, y_key) if k not in f.files]
            if missing:
                raise SourceError(f"{path}: has no array {missing}; it holds {f.files}: "
                                  "choose others with x_key, y_key (--x-key, --y-key)")
            names = f.zip.namelist()
            for key in (x_key, y_key):
                with f.zip.open(key if key in names else key + ".npy") as m:
                    _refuse_objects(_npy_dtype(m), f"{path}: array {key!r}", "numpy.savez")
            x, y = f[x_key], f[y_key]
    except SourceError:
        raise
    except (ValueError, EOFError, zipfile.BadZipFile, zlib.error) as e:
        raise SourceError(f"{path}: corrupt .npz archive ({e}); expected an archive saved by "
                          "numpy.savez: save it again") from e
    _check_pair(x, y, f"{path}: array {x_key!r}", f"{path}: array {y_key!r}")
    return x, y


def npz_pieces(path: str | os.PathLike[str], *, x_key: str = "x", y_key: str = "y") -> Pieces:
    """Pieces of arrays ``x_key`` and ``y_key`` of an ``.npz`` archive (see :func:`read_npz`)."""
    return pieces_of(*read_npz(path, x_key=x_key, y_key=y_key))


class _NdarrayToken:
    """Stands for ``numpy.ndarray`` inside a batch, so that only ``_reconstruct`` makes arrays."""


# numpy's own reconstructors, taken from an array's reduction: their modules moved in numpy 2.
_NP_RECONSTRUCT: Any = np.empty(0).__reduce__()[0]
_NP_FROMBUFFER: Any = np.empty(0).__reduce_ex__(5)[0]


def _reconstruct(subtype: object, shape: object, typecode: object) -> np.ndarray:
    # numpy pickles every array as an empty one that BUILD then fills from the file's bytes;
    # any other shape would allocate memory the file does not hold.
    if subtype is not _NdarrayToken or shape != (0,):
        raise pickle.UnpicklingError(f"unexpected array reconstruction {shape!r}")
    a: np.ndarray = _NP_RECONSTRUCT(np.ndarray, (0,), typecode)
    return a


def _empty_bytes(*args: object) -> bytes:
    # Protocols 0-2 write b"" as bytes(); bytes(n) would allocate n.
    if args:
        raise pickle.UnpicklingError("bytes() called with arguments")
    return b""


def _latin1(text: object, encoding: object = "latin1") -> bytes:
    # Protocols 0-2 write bytes as _codecs.encode(text, "latin1"); no other codec is needed.
    if not isinstance(text, str) or encoding != "latin1":
        raise pickle.UnpicklingError(f"unexpected encode({type(text).__name__}, {encoding!r})")
    return text.encode("latin1")


# Every global a CIFAR python batch (a dict of bytes, lists of ints and uint8 arrays) names,
# as written by Python 2 or 3 at any protocol and by numpy 1 or 2; nothing else is loaded.
_CIFAR_GLOBALS: dict[tuple[str, str], object] = {
    ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy.core.numeric", "_frombuffer"): _NP_FROMBUFFER,
    ("numpy._core.numeric", "_frombuffer"): _NP_FROMBUFFER,
    ("numpy", "ndarray"): _NdarrayToken,
    ("numpy", "dtype"): np.dtype,
    ("__builtin__", "bytes"): _empty_bytes,
    ("builtins", "bytes"): _empty_bytes,
    ("_codecs", "encode"): _latin1,
}


class _CifarUnpickler(pickle.Unpickler):
    """Loads a CIFAR batch; refuses every global outside ``_CIFAR_GLOBALS`` before it runs."""

    def __init__(self, file: IO[bytes], path: str | os.PathLike[str]) -> None:
        super().__init__(file, encoding="bytes")
        self._path = path

    def find_class(self, module: str, name: str) -> Any:
        try:
            return _CIFAR_GLOBALS[(module, name)]
        except KeyError:
            raise SourceError(
                f"{self._path}: names the forbidden global {module}.{name} (loading it could run "
                "code); expected a CIFAR python batch, which holds only numpy arrays, lists and "
                f"bytes: download it again from {_CIFAR_URL}"
            ) from None


def _load_cifar_batch(p: str | os.PathLike[str]) -> tuple[np.ndarray, np.ndarray, int]:
    """Images uint8 ``[n, 3, 32, 32]``, labels ``[n]`` and class count of one batch file."""
    # Unpickled from memory, so a length in the file can never ask for more than it holds.
    raw = Path(p).read_bytes()
    try:
        d = _CifarUnpickler(io.BytesIO(raw), p).load()
    except SourceError:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, KeyError, IndexError,
            AttributeError, OverflowError) as e:
        raise SourceError(f"{p}: is not a CIFAR python batch ({type(e).__name__}: {e}); "
                          f"expected a batch of the python version from {_CIFAR_URL}") from e
    if not isinstance(d, dict):
        raise SourceError(f"{p}: is not a CIFAR batch (it holds a {type(d).__name__}); "
                          "expected a dict with 'data' and 'labels' or 'fine_labels'")
    d = {(k.decode("latin1") if isinstance(k, bytes) else k): v for k, v in d.items()}
    key = "fine_labels" if "fine_labels" in d else "labels"
    if "data" not in d or key not in d:
        raise SourceError(f"{p}: is not a CIFAR batch (keys {sorted(d, key=str)}); "
                          "expected 'data' and 'labels' or 'fine_labels'")
    data = d["data"]
    if not (isinstance(data, np.ndarray) and data.dtype == np.uint8 and data.ndim == 2
            and data.shape[1] == 3 * 32 * 32):
        got = f"{data.dtype} {list(data.shape)}" if isinstance(data, np.ndarray) else type(data)
        raise SourceError(f"{p}: 'data' is {got}; expected uint8 [n, 3072] (n 3x32x32 images)")
    try:
        y = np.asarray(d[key])
    except ValueError as e:
        raise SourceError(f"{p}: {key!r} is not a list of labels ({e})") from e
    x = data.reshape(-1, 3, 32, 32)
    _check_pair(x, y, f"{p}: 'data'", f"{p}: {key!r}")
    return x, y.astype(np.int64), 100 if key == "fine_labels" else 10


def read_cifar(paths: Sequence[str | os.PathLike[str]]) -> tuple[np.ndarray, np.ndarray, int]:
    """The images and labels of CIFAR-10/100 python pickle batches, concatenated.

    Batches are unpickled with only the globals a genuine batch names (numpy's array and dtype
    reconstructors); a file naming any other is refused before anything in it runs.

    Returns:
        Images uint8 ``[n, 3, 32, 32]``, labels int64 ``[n]`` and the number of classes (10, or
        100 for CIFAR-100 fine labels).

    Raises:
        SourceError: a file is not a CIFAR batch, or names a forbidden global.
    """
    if not paths:
        raise SourceError("no CIFAR batch files given; expected at least one")
    batches = [_load_cifar_batch(p) for p in paths]
    x = np.concatenate([b[0] for b in batches])
    y = np.concatenate([b[1] for b in batches])
    return x, y, batches[-1][2]


def cifar_pieces(paths: Sequence[str | os.PathLike[str]]) -> tuple[Pieces, int]:
    """Pieces of CIFAR-10/100 python pickle batches (see :func:`read_cifar`).

    Returns:
        The pieces, ``x`` uint8 ``[n, 3, 32, 32]``, and the number of classes.

    Raises:
        SourceError: a file is not a CIFAR batch, or names a forbidden global.
    """
    x, y, classes = read_cifar(paths)
    return pieces_of(x, y), classes


def synthetic_pieces(
    num_samples: int,
    sample_shape: tuple[int, ...],
    *,
    num_classes: int = 10,
    seed: int = 0,
    piece: int = PIECE,
    index: np.ndarray | None = None,
) -> Pieces:
    """Seeded synthetic data of any shape and size: class prototype plus unit noise, float32.

    Generated a piece at a time, so any size fits in memory.

    Args:
        index: if given, sorted indices of the samples to keep (the others are generated and
            dropped, so a sample is the same whichever subset it is drawn in).
    """
    rng = np.random.default_rng(seed)
    protos = rng.standard_normal((num_classes, *sample_shape)).astype(np.float32)
    for a in range(0, num_samples, piece):
        n = min(piece, num_samples - a)
        y = rng.integers(0, num_classes, n)
        x = protos[y] + rng.standard_normal((n, *sample_shape), dtype=np.float32)
        if index is not None:
            keep = index[np.searchsorted(index, a) : np.searchsorted(index, a + n)] - a
            if not len(keep):
                continue
            x, y = x[keep], y[keep]
        yield x, y
