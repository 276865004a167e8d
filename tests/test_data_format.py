"""The shard format: round trips, atomic writes, and every damage caught before training."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

from hethpc.data import DatasetError, DatasetWriter, ShardError, open_dataset, write_dataset
from hethpc.data.shards.verify import sha256_file


def _data(n: int = 500, shape: tuple[int, ...] = (6,), classes: int = 5) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(0)
    return rng.standard_normal((n, *shape)).astype(np.float32), rng.integers(0, classes, n)


@pytest.fixture
def ds_path(tmp_path: Path) -> Path:
    x, y = _data()
    write_dataset(tmp_path / "ds", [(x, y)], num_classes=5, shard_samples=200, chunk_samples=32)
    return tmp_path / "ds"


@pytest.mark.parametrize("compression", [None, "gzip", "lzf"], ids=["raw", "gzip", "lzf"])
def test_round_trip_streams_into_shards(tmp_path: Path, compression: str | None) -> None:
    x, y = _data(shape=(2, 3))
    pieces = [(x[a : a + 70], y[a : a + 70]) for a in range(0, len(y), 70)]
    m = write_dataset(tmp_path / "d", pieces, num_classes=5, shard_samples=200,
                      chunk_samples=16, compression=compression)
    assert [s.num_samples for s in m.shards] == [200, 200, 100]
    ds = open_dataset(tmp_path / "d")
    assert (len(ds), ds.sample_shape, ds.num_classes) == (500, (2, 3), 5)
    np.testing.assert_array_equal(ds.labels, y)
    idx = np.array([499, 0, 250, 199, 200, 3, 3])
    got_x, got_y = ds.read(idx)
    np.testing.assert_array_equal(got_x, x[idx])
    np.testing.assert_array_equal(got_y, y[idx])
    with h5py.File(tmp_path / "d" / m.shards[0].file) as f:
        assert f["x"].chunks == (16, 2, 3) and f["x"].fletcher32
        assert f["x"].compression == compression
    manifest = json.loads((tmp_path / "d" / "manifest.json").read_text())
    assert manifest["shards"][0]["label_counts"] == np.bincount(y[:200], minlength=5).tolist()


@pytest.mark.parametrize("size", [0, 1, 4095, 4096, 4097, 3 * 4096 + 5])
def test_sha256_file_is_the_files_digest(tmp_path: Path, size: int) -> None:
    # Read through a memory map in blocks: empty files, partial and whole last blocks.
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    p = tmp_path / "f"
    p.write_bytes(data)
    want = hashlib.sha256(data).hexdigest()
    assert sha256_file(p, block=4096) == want == sha256_file(p)


def test_locking_off_reads(ds_path: Path) -> None:
    ds = open_dataset(ds_path, locking=False)
    np.testing.assert_array_equal(ds.read(np.arange(3))[1], ds.labels[:3])


def test_existing_dataset_needs_force(ds_path: Path) -> None:
    x, y = _data(100)
    with pytest.raises(DatasetError, match="already exists.*force"):
        write_dataset(ds_path, [(x, y)], num_classes=5)
    write_dataset(ds_path, [(x, y)], num_classes=5, force=True)
    assert len(open_dataset(ds_path)) == 100
    assert sorted(p.name for p in ds_path.parent.iterdir()) == ["ds"], "no temporary left behind"


def test_force_never_replaces_a_non_dataset(tmp_path: Path) -> None:
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    x, y = _data(10)
    with pytest.raises(DatasetError, match="not a hethpc dataset"):
        write_dataset(tmp_path / "mine", [(x, y)], num_classes=5, force=True)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


def test_failed_write_leaves_nothing(tmp_path: Path) -> None:
    x, y = _data(10)
    with pytest.raises(DatasetError, match="labels must lie in 0..2, got labels up to 4; set "
                       "num_classes to 5 or more"):  # fmt: skip
        write_dataset(tmp_path / "d", [(x, y)], num_classes=3)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(DatasetError, match=r"got 2 negative \(down to -2\); class labels count "
                       "from 0, and no num_classes covers a negative one"):  # fmt: skip
        write_dataset(tmp_path / "d", [(x, np.where(y == 0, -2, y))], num_classes=5)
    assert list(tmp_path.iterdir()) == []


def test_writer_rejects_wrong_shapes(tmp_path: Path) -> None:
    with DatasetWriter(tmp_path / "d", sample_shape=(6,), num_classes=5) as w:
        with pytest.raises(DatasetError, match=r"expected \[n, 6\]"):
            w.write(np.zeros((3, 7), np.float32), np.zeros(3, np.int64))
        w.write(*_data(10))


def _flip_byte_in_x(path: Path) -> None:
    with h5py.File(path, "r") as f:
        offset = f["x"].id.get_chunk_info(0).byte_offset
    with open(path, "r+b") as fh:
        fh.seek(offset + 5)
        b = fh.read(1)
        fh.seek(offset + 5)
        fh.write(bytes([b[0] ^ 0xFF]))


def _rehash(manifest: dict[str, Any], shard: Path) -> None:
    # A shard from another conversion: consistent with itself, not with its neighbours.
    manifest["shards"][1]["num_bytes"] = shard.stat().st_size
    manifest["shards"][1]["sha256"] = sha256_file(shard)


def _damage(kind: str, root: Path) -> None:
    shard = root / "shard-00001.h5"
    manifest = json.loads((root / "manifest.json").read_text())
    if kind == "missing":
        shard.unlink()
    elif kind == "extra":
        (root / "shard-00009.h5").write_bytes(shard.read_bytes())
    elif kind == "truncated":
        os.truncate(shard, shard.stat().st_size // 2)
    elif kind == "corrupt":
        _flip_byte_in_x(shard)
    elif kind == "checksum":
        manifest["shards"][1]["sha256"] = "0" * 64
    elif kind == "shape":
        with h5py.File(shard, "r+") as f:
            f["x"].resize(f["x"].shape[0] - 1, axis=0)
        _rehash(manifest, shard)
    elif kind == "dtype":
        with h5py.File(shard, "r+") as f:
            y = f["y"][:]
            del f["y"]
            f.create_dataset("y", data=y.astype(np.int32))
        _rehash(manifest, shard)
    elif kind == "absolute":
        manifest["shards"][1]["file"] = str(shard.resolve())
    elif kind == "dotdot":
        manifest["shards"][1]["file"] = "../shard-00001.h5"
    elif kind == "symlink":
        outside = root.parent / "elsewhere.h5"
        shard.rename(outside)
        shard.symlink_to(outside)
    (root / "manifest.json").write_text(json.dumps(manifest))


DAMAGE = [
    ("missing", ShardError, "missing shard file .*shard-00001.h5"),
    ("extra", ShardError, "extra shard file .*shard-00009.h5"),
    ("truncated", ShardError, "shard-00001.h5 is .* bytes.*truncated"),
    ("corrupt", ShardError, "shard-00001.h5 fails its sha256"),
    ("checksum", ShardError, "shard-00001.h5 fails its sha256"),
    ("shape", ShardError, r"shard-00001.h5 holds x\(199, 6\)"),
    ("dtype", ShardError, "shard-00001.h5 has dtypes x float32, y int32"),
    ("absolute", DatasetError, "not a plain file name"),
    ("dotdot", DatasetError, "not a plain file name"),
    ("symlink", DatasetError, "outside the dataset directory"),
]


@pytest.mark.parametrize(("kind", "error", "match"), DAMAGE, ids=[d[0] for d in DAMAGE])
def test_damage_is_named_before_training(
    ds_path: Path, kind: str, error: type[Exception], match: str
) -> None:
    open_dataset(ds_path, verify=True)  # intact first, so the damage is what fails
    _damage(kind, ds_path)
    with pytest.raises(error, match=match):
        if kind == "checksum":
            # Only the manifest's digest changed: the files themselves are intact.
            open_dataset(ds_path, verify=False).read(np.arange(500))
        open_dataset(ds_path, verify=True)


def test_corrupt_chunk_without_verify_fails_on_read_naming_the_shard(ds_path: Path) -> None:
    _flip_byte_in_x(ds_path / "shard-00001.h5")
    ds = open_dataset(ds_path, verify=False)
    ds.read(np.arange(0, 200))  # the intact shard reads fine
    with pytest.raises(ShardError, match="shard-00001.h5 is corrupt.*checksum"):
        ds.read(np.array([200]))


def test_not_a_dataset(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="no manifest.json.*convert.py"):
        open_dataset(tmp_path)
    (tmp_path / "manifest.json").write_text("{")
    with pytest.raises(DatasetError, match="not valid JSON"):
        open_dataset(tmp_path)


def test_handles_reopen_after_fork(ds_path: Path) -> None:
    import multiprocessing as mp

    ds = open_dataset(ds_path)
    ds.read(np.arange(10))  # the parent holds open handles
    ctx = mp.get_context("fork")
    with ctx.Pool(1) as pool:
        got = pool.apply(_read_sum, (ds, np.arange(300, 310)))
    assert got == pytest.approx(float(ds.read(np.arange(300, 310))[0].sum()), rel=1e-6)


def _read_sum(ds: object, idx: np.ndarray) -> float:
    return float(ds.read(idx)[0].sum())  # type: ignore[attr-defined]


EDITS = [
    ("dtype", "blah", "dtype = 'blah': expected a numpy dtype name"),
    ("label_dtype", "float32", "label_dtype = 'float32': expected an integer dtype"),
    ("chunk_samples", -1, "chunk_samples = -1: expected an integer >= 1"),
    ("num_classes", 0, "num_classes = 0: expected an integer >= 1"),
    ("sample_shape", [0], r"sample_shape = \[0\]: expected positive sizes"),
    ("compression", "zstd", "compression = 'zstd': expected null, 'gzip' or 'lzf'"),
    ("num_bytes", -3, "num_bytes = -3: expected an integer >= 1"),
    ("label_counts", ["a"] * 5, r"label_counts = \['a'.*expected a list of counts"),
]


@pytest.mark.parametrize(("field", "value", "match"), EDITS, ids=[e[0] for e in EDITS])
def test_hand_edited_manifest_field_is_named(
    ds_path: Path, field: str, value: Any, match: str
) -> None:
    # A value that parses but cannot describe a dataset: one DatasetError naming the field and
    # the fix, not a numpy traceback from deep in the reader.
    manifest = json.loads((ds_path / "manifest.json").read_text())
    target = manifest["shards"][0] if field in ("num_bytes", "label_counts") else manifest
    target[field] = value
    (ds_path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DatasetError, match=f"{match}.*convert the dataset again"):
        open_dataset(ds_path, verify=False)
