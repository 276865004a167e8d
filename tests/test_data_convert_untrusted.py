"""Source readers on hostile files: pickles that run code, object arrays, lying IDX headers."""

from __future__ import annotations

import builtins
import gzip
import os
import pickle
import pickletools
import re
import struct
import subprocess
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hethpc.data import DatasetError, sources
from hethpc.data.sources import SourceError

RNG = np.random.default_rng(1)


class Evil:
    """Pickles as a call of ``fn(*args)``, which an unrestricted unpickler makes while loading."""

    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        self.fn, self.args = fn, args

    def __reduce__(self) -> tuple[Any, ...]:
        return self.fn, self.args


def _global(fn: Callable[..., Any]) -> str:
    """The global a pickle of ``fn`` names, as ``module.name``."""
    return f"{fn.__module__}.{fn.__qualname__}"


def _batch(n: int = 3, *, fine: bool = False) -> dict[bytes, Any]:
    """A CIFAR python batch as the real files hold it: bytes keys, uint8 data, a list of ints."""
    return {
        b"batch_label": b"training batch 1 of 5",
        b"fine_labels" if fine else b"labels": RNG.integers(0, 100 if fine else 10, n).tolist(),
        b"data": RNG.integers(0, 256, (n, 3072), dtype=np.uint8),
        b"filenames": [b"a_%d.png" % i for i in range(n)],
        b"empty": b"",
    }


class Recorder(pickle.Unpickler):
    """Records every global a pickle names (and loads it, trusting it: the test's own file)."""

    def __init__(self, raw: bytes) -> None:
        import io

        super().__init__(io.BytesIO(raw), encoding="bytes")
        self.seen: set[str] = set()

    def find_class(self, module: str, name: str) -> Any:
        self.seen.add(f"{module}.{name}")
        return super().find_class(module, name)


PROTOCOLS = list(range(pickle.HIGHEST_PROTOCOL + 1))
# What pickle.dump of a batch names, by protocol: 0-2 numpy.dtype, numpy.ndarray, _reconstruct
# and, for bytes, _codecs.encode (b"" as bytes()); 3-4 only the numpy three; 5 numpy.dtype and
# _frombuffer. numpy 1 (and Python 2, which wrote the real files) names numpy.core, numpy 2
# numpy._core.
CIFAR_GLOBALS = {
    "numpy.ndarray",
    "numpy.dtype",
    "numpy.core.multiarray._reconstruct",
    "numpy._core.multiarray._reconstruct",
    "numpy.core.numeric._frombuffer",
    "numpy._core.numeric._frombuffer",
    "_codecs.encode",
    "__builtin__.bytes",
    "builtins.bytes",
}


# Protocols 0-2 name globals in text, so a file as numpy 1 wrote it is made by renaming them.
WRITERS = [(p, False) for p in PROTOCOLS] + [(p, True) for p in PROTOCOLS if p <= 2]


@pytest.mark.parametrize(("protocol", "numpy1"), WRITERS,
                         ids=[f"protocol{p}{'-numpy1' if old else ''}" for p, old in WRITERS])
def test_cifar_batch_loads_with_only_the_globals_it_needs(
    tmp_path: Path, protocol: int, numpy1: bool
) -> None:
    d = _batch(5)
    raw = pickle.dumps(d, protocol=protocol)
    if numpy1:
        raw = raw.replace(b"numpy._core.", b"numpy.core.")
    rec = Recorder(raw)
    rec.load()
    assert rec.seen, "an array batch names numpy's reconstructors"
    assert rec.seen <= CIFAR_GLOBALS, rec.seen - CIFAR_GLOBALS
    (tmp_path / "data_batch_1").write_bytes(raw)
    x, y, classes = sources.read_cifar([tmp_path / "data_batch_1"])
    np.testing.assert_array_equal(x, d[b"data"].reshape(5, 3, 32, 32))
    np.testing.assert_array_equal(y, d[b"labels"])
    assert (x.dtype, y.dtype, classes) == (np.uint8, np.int64, 10)


def _marker_payloads(marker: Path) -> list[tuple[str, Evil, str]]:
    return [
        ("os.system", Evil(os.system, f"touch {marker}"), _global(os.system)),
        ("exec", Evil(builtins.exec, f"open({str(marker)!r}, 'w').close()"), "builtins.exec"),
        ("open", Evil(builtins.open, str(marker), "w"), _global(builtins.open)),
        ("subprocess", Evil(subprocess.call, ["touch", str(marker)]), "subprocess.call"),
        ("numpy.save", Evil(np.save, str(marker), np.zeros(1)), "numpy.save"),
    ]


EVIL_IDS = ["os.system", "exec", "open", "subprocess", "numpy.save"]


@pytest.mark.parametrize("which", EVIL_IDS)
@pytest.mark.parametrize("protocol", [2, pickle.DEFAULT_PROTOCOL], ids=["protocol2", "default"])
def test_cifar_pickle_that_runs_code_is_refused_before_it_runs(
    tmp_path: Path, which: str, protocol: int
) -> None:
    marker = tmp_path / "marker.npy"  # np.save would add ".npy" to any other name
    _, evil, name = dict((p[0], p) for p in _marker_payloads(marker))[which]
    batch = tmp_path / "data_batch_1"
    # Hidden inside an otherwise genuine batch, after its real arrays.
    raw = pickle.dumps({**_batch(2), b"zz": evil}, protocol=protocol)
    if protocol <= 2:
        # Protocols 0-2 write Python 2's names (builtins.exec as __builtin__.exec).
        named = [str(a) for op, a, _ in pickletools.genops(raw) if op.name == "GLOBAL"]
        name = named[-1].replace(" ", ".")
    batch.write_bytes(raw)
    message = f"{batch}: names the forbidden global {name} "
    with pytest.raises(SourceError, match=re.escape(message)):
        sources.cifar_pieces([batch])
    assert not marker.exists(), "the payload ran"
    with pytest.raises(SourceError, match=re.escape(message)):
        sources.read_cifar([batch])
    assert not marker.exists(), "the payload ran"


NOT_CIFAR = [
    ("list", lambda: pickle.dumps([1, 2]), "it holds a list"),
    ("no-labels", lambda: pickle.dumps({b"data": np.zeros((1, 3072), np.uint8)}),
     r"keys \['data'\]"),
    ("float-data", lambda: pickle.dumps({b"data": np.zeros((1, 3072)), b"labels": [0]}),
     r"'data' is float64 \[1, 3072\]; expected uint8 \[n, 3072\]"),
    ("short-rows", lambda: pickle.dumps({b"data": np.zeros((2, 30), np.uint8), b"labels": [0, 1]}),
     r"'data' is uint8 \[2, 30\]"),
    ("label-count", lambda: pickle.dumps({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0]}),
     "holds 2 samples but .* holds 1 labels"),
    ("text-labels", lambda: pickle.dumps({b"data": np.zeros((1, 3072), np.uint8),
                                          b"labels": ["cat"]}), "expected class labels"),
    ("truncated", lambda: pickle.dumps(_batch(2))[:-40], "is not a CIFAR python batch"),
    ("huge-array", lambda: pickle.dumps(_batch(1), protocol=2).replace(
        b"K\x00\x85", b"J\x00\x00\x00\x7f\x85"), "is not a CIFAR python batch"),
]


@pytest.mark.parametrize(("name", "make", "match"), NOT_CIFAR, ids=[c[0] for c in NOT_CIFAR])
def test_not_a_cifar_batch(
    tmp_path: Path, name: str, make: Callable[[], bytes], match: str
) -> None:
    batch = tmp_path / "data_batch_1"
    batch.write_bytes(make())
    with pytest.raises(SourceError, match=f"^{re.escape(str(batch))}: .*{match}"):
        sources.read_cifar([batch])


def _save(path: Path, a: np.ndarray) -> Path:
    np.save(path, a, allow_pickle=True)
    return path


def _savez(path: Path, **arrays: np.ndarray) -> Path:
    np.savez(path, **arrays)  # type: ignore[arg-type]
    return path


BAD_NUMPY = [
    ("npy-garbage", lambda p: sources.read_npy(_raw(p / "x.npy", b"not numpy at all")),
     "x.npy: has no .npy header; expected an array saved by numpy.save"),
    ("npy-objects", lambda p: sources.read_npy(_save(p / "x.npy", np.array([1, "a"], object))),
     r"x.npy: holds Python objects \(dtype object\), refused"),
    ("npy-pickle", lambda p: sources.read_npy(_raw(p / "x.npy", pickle.dumps(
        Evil(os.system, f"touch {p / 'marker'}")))), "x.npy: has no .npy header"),
    ("npy-truncated", lambda p: sources.read_npy(_raw(p / "x.npy", _npy_bytes(p)[:-8])),
     "x.npy: unreadable .npy file"),
    ("npy-pair-length", lambda p: sources.read_npy_pair(_save(p / "x.npy", np.zeros((3, 2))),
                                                        _save(p / "y.npy", np.zeros(2, int))),
     "x.npy: the sample array holds 3 samples but .*y.npy: the label array holds 2 labels"),
    ("npy-labels-2d", lambda p: sources.npy_pieces(_save(p / "x.npy", np.zeros((3, 2))),
                                                   _save(p / "y.npy", np.zeros((3, 1), int))),
     r"y.npy: the label array has shape \(3, 1\); expected labels of shape \[n\]"),
    ("npz-garbage", lambda p: sources.read_npz(_raw(p / "a.npz", b"PK not a zip")),
     r"a.npz: is not an .npz \(zip\) archive; expected an archive saved by numpy.savez"),
    ("npz-is-npy", lambda p: sources.read_npz(_save(p / "a.npy", np.zeros(3))),
     "a.npy: is a .npy file, not an .npz archive"),
    ("npz-objects", lambda p: sources.read_npz(_savez(p / "a.npz", x=np.array([[1, None]], object),
                                                      y=np.zeros(1, int))),
     r"a.npz: array 'x' holds Python objects \(dtype object\), refused"),
    ("npz-float-labels", lambda p: sources.npz_pieces(_savez(p / "a.npz", x=np.zeros((2, 1)),
                                                             y=np.array([0.5, 1.0]))),
     "a.npz: array 'y' has dtype float64 .*; expected class labels"),
]


def _raw(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _npy_bytes(p: Path) -> bytes:
    np.save(p / "whole.npy", np.zeros((10, 10)))
    return (p / "whole.npy").read_bytes()


@pytest.mark.parametrize(("name", "call", "match"), BAD_NUMPY, ids=[b[0] for b in BAD_NUMPY])
def test_bad_numpy_files(
    tmp_path: Path, name: str, call: Callable[[Path], object], match: str
) -> None:
    with pytest.raises(SourceError, match=f"^{re.escape(str(tmp_path))}/{match}") as e:
        call(tmp_path)
    assert isinstance(e.value, DatasetError), "callers catching DatasetError still catch it"
    assert not (tmp_path / "marker").exists()


def _idx_header(code: int, shape: tuple[int, ...]) -> bytes:
    return bytes([0, 0, code, len(shape)]) + b"".join(struct.pack(">I", s) for s in shape)


HUGE = (100_000, 1000, 1000)  # 100 GB claimed
LYING_IDX = [
    ("plain", lambda: _idx_header(0x08, HUGE) + bytes(16), False,
     r"\(100000, 1000, 1000\) of uint8 \(100000000000 data bytes\) but it holds 16 data bytes"),
    ("gzip", lambda: gzip.compress(_idx_header(0x08, HUGE) + bytes(8 << 20)), True,
     r"\(100000, 1000, 1000\) .* but it holds 8388608 decompressed data bytes"),
    ("overflow", lambda: _idx_header(0x0E, (2**32 - 1,) * 3) + bytes(8), False,
     r"\(4294967295, 4294967295, 4294967295\) of float64"),
    ("dims-cut", lambda: _idx_header(0x08, (60_000, 28, 28))[:8], False,
     "is truncated inside its IDX header"),
    ("gzip-cut", lambda: gzip.compress(_idx_header(0x08, (50, 50)) + RNG.bytes(2500))[:-30], True,
     "corrupt gzip stream"),
]


@pytest.mark.parametrize(("name", "make", "gz", "match"), LYING_IDX, ids=[c[0] for c in LYING_IDX])
def test_idx_header_is_checked_before_allocating(
    tmp_path: Path, name: str, make: Callable[[], bytes], gz: bool, match: str
) -> None:
    path = _raw(tmp_path / ("images.gz" if gz else "images"), make())
    tracemalloc.start()
    try:
        with pytest.raises(SourceError, match=f"^{re.escape(str(path))}: .*{match}"):
            sources.read_idx(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 32 << 20, f"read_idx allocated {peak} bytes for a file it refused"
