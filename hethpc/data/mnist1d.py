"""MNIST-1D, generated locally by the ``mnist1d`` package (no download), cached as ``.npz``."""

from __future__ import annotations

import os
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from hethpc.data.arrays import ArrayDataset
from hethpc.data.errors import DatasetError

_KEYS = ("x", "y", "x_test", "y_test")


def _read_cache(path: Path) -> dict[str, Any] | None:
    """The cached arrays, or None when the file is damaged (truncated, not an ``.npz``).

    A damaged cache is generated again and replaced, as a missing one is.
    """
    try:
        with np.load(path) as f:
            arrays = {k: f[k] for k in _KEYS}
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        return None
    return arrays


def _write_cache(path: Path, arrays: dict[str, Any]) -> None:
    """Write the generated arrays to ``path`` under a temporary name, then rename it.

    Concurrent ranks never see half a file.

    Raises:
        DatasetError: the cache directory cannot be created or written.
    """
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".npz.tmp")
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)
    except OSError as e:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise DatasetError(
            f"cannot write the MNIST-1D cache in {path.parent} ({e.strerror or e}); set "
            "cache_dir (--cache-dir, or HETHPC_CACHE) to a writable directory"
        ) from None


def load_mnist1d(
    *, num_samples: int = 50_000, seed: int = 42, cache_dir: str | os.PathLike[str] | None = None
) -> tuple[ArrayDataset, ArrayDataset]:
    """Generate (or load from the cache) MNIST-1D; returns ``(train, test)`` with an 80/20 split.

    Args:
        num_samples: train + test samples to generate.
        seed: the generator's seed; the same seed gives the same data on every rank.
        cache_dir: where to keep ``mnist1d-<n>-<seed>.npz``; None generates without caching.
    """
    if num_samples < 10:
        raise ValueError(f"num_samples must be at least 10, got {num_samples}")
    path = Path(cache_dir) / f"mnist1d-{num_samples}-{seed}.npz" if cache_dir else None
    arrays = _read_cache(path) if path is not None and path.exists() else None
    if arrays is None:
        from mnist1d.data import get_dataset_args, make_dataset

        args = get_dataset_args()
        args.num_samples = num_samples
        args.seed = seed
        d = make_dataset(args)
        arrays = {
            "x": d["x"].astype(np.float32),
            "y": d["y"].astype(np.int64),
            "x_test": d["x_test"].astype(np.float32),
            "y_test": d["y_test"].astype(np.int64),
        }
        if path is not None:
            _write_cache(path, arrays)
    return (
        ArrayDataset(arrays["x"], arrays["y"], 10),
        ArrayDataset(arrays["x_test"], arrays["y_test"], 10),
    )
