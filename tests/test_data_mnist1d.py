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
