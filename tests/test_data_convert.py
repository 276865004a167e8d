"""Converters and the inspect tool on small files written in the real source formats."""

from __future__ import annotations

import gzip
import pickle
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hethpc.cli import convert, inspect_dataset
from hethpc.data import DatasetError, open_dataset, sources

ROOT = Path(__file__).resolve().parents[1]

RNG = np.random.default_rng(0)
IMAGES = RNG.integers(0, 256, (37, 5, 4), dtype=np.uint8)
LABELS = RNG.integers(0, 10, 37).astype(np.uint8)


def _idx(path: Path, a: np.ndarray, *, gz: bool) -> Path:
    code = {np.dtype(np.uint8): 0x08}[a.dtype]
    raw = bytes([0, 0, code, a.ndim]) + b"".join(struct.pack(">I", s) for s in a.shape)
    raw += a.tobytes()
    path.write_bytes(gzip.compress(raw) if gz else raw)
    return path


def _cifar(path: Path, n: int, fine: bool) -> tuple[np.ndarray, np.ndarray]:
    data = RNG.integers(0, 256, (n, 3072), dtype=np.uint8)
    labels = RNG.integers(0, 100 if fine else 10, n)
    key = b"fine_labels" if fine else b"labels"
    with open(path, "wb") as f:
        pickle.dump({b"data": data, key: labels.tolist(), b"batch_label": b"x"}, f)
    return data.reshape(n, 3, 32, 32), labels


def _check(path: Path, x: np.ndarray, y: np.ndarray) -> None:
    ds = open_dataset(path, verify=True)
    got_x, got_y = ds.read(np.arange(len(ds)))
    np.testing.assert_array_equal(got_x, x)
    np.testing.assert_array_equal(got_y, y)


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_idx(tmp_path: Path, gz: bool) -> None:
    img = _idx(tmp_path / "img", IMAGES, gz=gz)
    lab = _idx(tmp_path / "lab", LABELS, gz=gz)
    before = img.read_bytes()
    assert convert.main(["idx", str(img), str(lab), "--out", str(tmp_path / "o"),
                         "--shard-samples", "10", "--test-fraction", "0"]) == 0
    _check(tmp_path / "o" / "train", IMAGES, LABELS)
    assert len(open_dataset(tmp_path / "o" / "train").manifest.shards) == 4
    assert img.read_bytes() == before, "source data is never modified"


def test_npz_and_npy(tmp_path: Path) -> None:
    x = RNG.standard_normal((50, 3)).astype(np.float32)
    y = RNG.integers(0, 4, 50)
    np.savez(tmp_path / "a.npz", feats=x, target=y)
    assert convert.main(["npz", str(tmp_path / "a.npz"), "--x-key", "feats", "--y-key",
                         "target", "--out", str(tmp_path / "z"), "--test-fraction", "0"]) == 0
    _check(tmp_path / "z" / "train", x, y)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    assert convert.main(["npy", str(tmp_path / "x.npy"), str(tmp_path / "y.npy"), "--split",
                         "val", "--out", str(tmp_path / "n"), "--compression", "gzip"]) == 0
    _check(tmp_path / "n" / "val", x, y)


@pytest.mark.parametrize("fine", [False, True], ids=["cifar10", "cifar100"])
def test_cifar(tmp_path: Path, fine: bool) -> None:
    x1, y1 = _cifar(tmp_path / "data_batch_1", 6, fine)
    x2, y2 = _cifar(tmp_path / "data_batch_2", 5, fine)
    xt, yt = _cifar(tmp_path / "test_batch", 4, fine)
    assert convert.main(["cifar", str(tmp_path / "data_batch_1"), str(tmp_path / "data_batch_2"),
                         "--test", str(tmp_path / "test_batch"), "--out", str(tmp_path / "c")]) == 0
    _check(tmp_path / "c" / "train", np.concatenate([x1, x2]), np.concatenate([y1, y2]))
    _check(tmp_path / "c" / "test", xt, yt)
    assert open_dataset(tmp_path / "c" / "test").num_classes == (100 if fine else 10)


def test_digits_mnist1d_synthetic(tmp_path: Path) -> None:
    assert convert.main(["digits", "--out", str(tmp_path / "d")]) == 0
    tr, te = open_dataset(tmp_path / "d" / "train"), open_dataset(tmp_path / "d" / "test")
    assert (len(tr) + len(te), tr.sample_shape) == (1797, (64,))
    assert convert.main(["mnist1d", "--samples", "100", "--out", str(tmp_path / "m")]) == 0
    assert len(open_dataset(tmp_path / "m" / "train")) == 80
    assert convert.main(["synthetic", "--samples", "300", "--shape", "2", "3", "--classes", "4",
                         "--out", str(tmp_path / "s"), "--split", "train"]) == 0
    s = open_dataset(tmp_path / "s" / "train")
    assert (len(s), s.sample_shape, s.num_classes) == (300, (2, 3), 4)
    a = np.concatenate([x for x, _ in sources.synthetic_pieces(300, (2, 3), num_classes=4)])
    np.testing.assert_array_equal(s.read(np.arange(300))[0], a)


def test_existing_output_is_refused_without_force(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["synthetic", "--samples", "20", "--out", str(tmp_path / "s")]
    assert convert.main(args) == 0
    assert convert.main(args) == 2
    assert "s/train already exists; pass --force to replace it" in capsys.readouterr().err
    assert convert.main([*args, "--force"]) == 0


BAD_SOURCES = [
    ("idx-magic", lambda p: sources.read_idx(_write(p, b"\x01\x02\x03\x04")), "not an IDX file"),
    ("idx-short", lambda p: sources.read_idx(_write(p, bytes([0, 0, 8, 1, 0, 0, 0, 9, 1]))),
     "truncated"),
    ("npz-key", lambda p: sources.npz_pieces(_npz(p)), r"has no array \['x', 'y'\]"),
    ("cifar-not-pickle", lambda p: sources.cifar_pieces([_write(p, b"nope")]), "not a CIFAR"),
]


def _write(p: Path, data: bytes) -> Path:
    (p / "f").write_bytes(data)
    return p / "f"


def _npz(p: Path) -> Path:
    np.savez(p / "a.npz", a=np.zeros(2))
    return p / "a.npz"


@pytest.mark.parametrize(("name", "call", "match"), BAD_SOURCES, ids=[b[0] for b in BAD_SOURCES])
def test_bad_sources(tmp_path: Path, name: str, call: object, match: str) -> None:
    with pytest.raises(DatasetError, match=match):
        call(tmp_path)  # type: ignore[operator]


def test_inspect_verify_partition_and_plot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert convert.main(["synthetic", "--samples", "400", "--out", str(tmp_path / "s")]) == 0
    ds = tmp_path / "s" / "train"
    png = tmp_path / "h.png"
    assert inspect_dataset.main([str(ds), "--verify", "--partition", "labels",
                                 "--labels-per-rank", "5", "--world-size", "2",
                                 "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "verify: OK" in out and "rank 1" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    shard = next(ds.glob("shard-*.h5"))
    shard.write_bytes(shard.read_bytes()[:-100])
    assert inspect_dataset.main([str(ds), "--verify"]) == 2
    assert shard.name in capsys.readouterr().err


@pytest.mark.parametrize("tool", ["convert.py", "inspect_dataset.py"])
def test_tools_have_help(tool: str) -> None:
    r = subprocess.run([sys.executable, str(ROOT / "data_tools" / tool), "--help"],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0 and "usage:" in r.stdout
