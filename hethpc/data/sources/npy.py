"""numpy's ``.npy`` and ``.npz`` files, read without pickle (object arrays are refused)."""

from __future__ import annotations

import os
import zipfile
import zlib
from typing import IO, Any

import numpy as np

from hethpc.data.errors import SourceError
from hethpc.data.sources.pieces import Pieces, check_pair, pieces_of

_NPY_MAGIC = b"\x93NUMPY"


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
    check_pair(x, y, f"{x_path}: the sample array", f"{y_path}: the label array")
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
    check_pair(x, y, f"{path}: array {x_key!r}", f"{path}: array {y_key!r}")
    return x, y


def npz_pieces(path: str | os.PathLike[str], *, x_key: str = "x", y_key: str = "y") -> Pieces:
    """Pieces of arrays ``x_key`` and ``y_key`` of an ``.npz`` archive (see :func:`read_npz`)."""
    return pieces_of(*read_npz(path, x_key=x_key, y_key=y_key))
