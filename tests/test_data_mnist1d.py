"""MNIST-1D's cache: a cache directory that cannot be written or a damaged cached file."""

from __future__ import annotations

from pathlib import Path

import pytest

from hethpc.data import DatasetError
from hethpc.data.mnist1d import load_mnist1d


def test_unwritable_cache_dir_is_named_with_the_fix(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(DatasetError, match=f"cache in {blocker}/sub .*--cache-dir"):
        load_mnist1d(num_samples=100, cache_dir=blocker / "sub")
    assert blocker.read_text() == "not a directory"


def test_damaged_cache_file_is_generated_again(tmp_path: Path) -> None:
    train, test = load_mnist1d(num_samples=100, cache_dir=tmp_path)
    cached = tmp_path / "mnist1d-100-42.npz"
    cached.write_bytes(cached.read_bytes()[:1000])  # a copy cut short (a full disk, a kill)
    train2, test2 = load_mnist1d(num_samples=100, cache_dir=tmp_path)
    assert (train2.x == train.x).all() and (test2.y == test.y).all()
    train3, _ = load_mnist1d(num_samples=100, cache_dir=tmp_path)  # the replaced file reads
    assert (train3.x == train.x).all()
