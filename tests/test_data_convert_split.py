"""Held-out test splits: converters without a test split write OUT/train and OUT/test."""

from __future__ import annotations

import gzip
import math
import pickle
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from hethpc.cli import convert
from hethpc.data import open_dataset, sources

RNG = np.random.default_rng(3)
N = 41


HOLDOUTS = [
    # (num_samples, test_fraction, train size, test size)
    (10, 0.2, 8, 2),
    (41, 0.2, 33, 8),
    (41, 0.5, 20, 21),  # round(20.5) == 20
    (7, 0.0, 7, 0),
    (1, 0.9, 0, 1),
]


@pytest.mark.parametrize(("n", "f", "k", "t"), HOLDOUTS, ids=[f"{h[0]}x{h[1]}" for h in HOLDOUTS])
def test_holdout(n: int, f: float, k: int, t: int) -> None:
    train, test = sources.holdout(n, test_fraction=f, seed=5)
    assert (len(train), len(test)) == (k, t)
    np.testing.assert_array_equal(np.sort(np.concatenate([train, test])), np.arange(n))
    assert np.all(np.diff(train) > 0) and np.all(np.diff(test) > 0), "sorted, no repeats"
    again = sources.holdout(n, test_fraction=f, seed=5)
    np.testing.assert_array_equal(again[1], test)


def test_holdout_depends_on_the_seed() -> None:
    a = sources.holdout(100, test_fraction=0.2, seed=0)[1]
    b = sources.holdout(100, test_fraction=0.2, seed=1)[1]
    assert not np.array_equal(a, b)


@pytest.mark.parametrize("f", [1.0, -0.1, math.nan, math.inf], ids=["one", "neg", "nan", "inf"])
def test_holdout_refuses_bad_fraction(f: float) -> None:
    with pytest.raises(ValueError, match=r"test_fraction must be finite and in \[0, 1\)"):
        sources.holdout(10, test_fraction=f)


def test_synthetic_index_keeps_the_samples_of_the_whole_stream() -> None:
    # Pieces of 16 samples, so that the index spans several pieces and skips some.
    whole = list(sources.synthetic_pieces(100, (2,), num_classes=3, seed=4, piece=16))
    x, y = np.concatenate([p[0] for p in whole]), np.concatenate([p[1] for p in whole])
    index = np.array([3, 4, 15, 16, 50, 99])
    got = list(sources.synthetic_pieces(100, (2,), num_classes=3, seed=4, piece=16, index=index))
    assert [len(p[1]) for p in got] == [3, 1, 1, 1]
    np.testing.assert_array_equal(np.concatenate([p[0] for p in got]), x[index])
    np.testing.assert_array_equal(np.concatenate([p[1] for p in got]), y[index])


def _npz(d: Path, seed: int) -> tuple[list[str], np.ndarray, np.ndarray]:
    x, y = RNG.standard_normal((N, 3)).astype(np.float32), RNG.integers(0, 5, N)
    np.savez(d / "a.npz", x=x, y=y)
    return ["npz", str(d / "a.npz")], x, y


def _npy(d: Path, seed: int) -> tuple[list[str], np.ndarray, np.ndarray]:
    x, y = RNG.integers(0, 9, (N, 2, 2)).astype(np.int16), RNG.integers(0, 3, N)
    np.save(d / "x.npy", x)
    np.save(d / "y.npy", y)
    return ["npy", str(d / "x.npy"), str(d / "y.npy")], x, y


def _idx(d: Path, seed: int) -> tuple[list[str], np.ndarray, np.ndarray]:
    x, y = RNG.integers(0, 256, (N, 4, 3), dtype=np.uint8), RNG.integers(0, 10, N, dtype=np.uint8)
    for name, a in (("imgs", x), ("labs", y)):
        raw = bytes([0, 0, 8, a.ndim]) + b"".join(struct.pack(">I", s) for s in a.shape)
        (d / name).write_bytes(gzip.compress(raw + a.tobytes()))
    return ["idx", str(d / "imgs"), str(d / "labs")], x, y


def _cifar(d: Path, seed: int) -> tuple[list[str], np.ndarray, np.ndarray]:
    x, y = RNG.integers(0, 256, (N, 3072), dtype=np.uint8), RNG.integers(0, 10, N)
    with open(d / "data_batch_1", "wb") as f:
        pickle.dump({b"data": x[:20], b"labels": y[:20].tolist()}, f)
    with open(d / "data_batch_2", "wb") as f:
        pickle.dump({b"data": x[20:], b"labels": y[20:].tolist()}, f)
    return ["cifar", str(d / "data_batch_1"), str(d / "data_batch_2")], x.reshape(N, 3, 32, 32), y


def _synthetic(d: Path, seed: int) -> tuple[list[str], np.ndarray, np.ndarray]:
    pieces = list(sources.synthetic_pieces(N, (2,), num_classes=3, seed=seed))
    x, y = np.concatenate([p[0] for p in pieces]), np.concatenate([p[1] for p in pieces])
    return ["synthetic", "--samples", str(N), "--shape", "2", "--classes", "3"], x, y


Source = Callable[[Path, int], tuple[list[str], np.ndarray, np.ndarray]]
SOURCES: list[tuple[str, Source]] = [
    ("npz", _npz), ("npy", _npy), ("idx", _idx), ("cifar", _cifar), ("synthetic", _synthetic),
]
IDS = [s[0] for s in SOURCES]
HELD_OUT = [
    # (extra options, test fraction, seed)
    ([], 0.2, 0),
    (["--test-fraction", "0.3"], 0.3, 0),
    (["--seed", "7"], 0.2, 7),
]


def _read(path: Path) -> tuple[np.ndarray, np.ndarray]:
    ds = open_dataset(path, verify=True)
    return ds.read(np.arange(len(ds)))


@pytest.mark.parametrize(("name", "make"), SOURCES, ids=IDS)
@pytest.mark.parametrize(("extra", "f", "seed"), HELD_OUT, ids=["default", "fraction", "seed"])
def test_source_without_test_split_holds_one_out(
    tmp_path: Path, name: str, make: Source, extra: list[str], f: float, seed: int
) -> None:
    argv, x, y = make(tmp_path, seed)
    out = tmp_path / "out"
    assert convert.main([*argv, *extra, "--out", str(out), "--shard-samples", "9"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["test", "train"]
    train, test = sources.holdout(N, test_fraction=f, seed=seed)
    for split, index in (("train", train), ("test", test)):
        got_x, got_y = _read(out / split)
        np.testing.assert_array_equal(got_x, x[index])
        np.testing.assert_array_equal(got_y, y[index])
    classes = {open_dataset(out / s).num_classes for s in ("train", "test")}
    assert len(classes) == 1, "both splits agree on the number of classes"


ONE_SPLIT = [
    # (source, options, the one split written); cifar has no --split
    (name, make, options, split)
    for name, make in SOURCES
    for options, split in ((["--test-fraction", "0"], "train"),
                           (["--split", "val", "--test-fraction", "0"], "val"))
    if not (name == "cifar" and split == "val")
]


@pytest.mark.parametrize(("name", "make", "options", "split"), ONE_SPLIT,
                         ids=[f"{c[0]}-{c[3]}" for c in ONE_SPLIT])
def test_fraction_zero_writes_one_split(
    tmp_path: Path, name: str, make: Source, options: list[str], split: str
) -> None:
    argv, x, y = make(tmp_path, 0)
    out = tmp_path / "out"
    assert convert.main([*argv, *options, "--out", str(out)]) == 0
    assert [p.name for p in out.iterdir()] == [split]
    got_x, got_y = _read(out / split)
    np.testing.assert_array_equal(got_x, x)
    np.testing.assert_array_equal(got_y, y)
