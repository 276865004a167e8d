"""CIFAR-10/100 python pickle batches, through an unpickler that loads only what they name."""

from __future__ import annotations

import io
import os
import pickle
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np

from hethpc.data.errors import SourceError
from hethpc.data.sources.pieces import Pieces, check_pair, pieces_of

_CIFAR_URL = "https://www.cs.toronto.edu/~kriz/cifar.html"


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
    check_pair(x, y, f"{p}: 'data'", f"{p}: {key!r}")
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
