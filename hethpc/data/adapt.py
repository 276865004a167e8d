"""A user's data as a hethpc dataset: arrays, a map-style torch Dataset, or HDF5 shards."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hethpc.data.arrays import ArrayDataset
from hethpc.data.errors import DatasetError
from hethpc.data.shards.sharded import ShardedDataset
from hethpc.data.shards.shared import open_dataset_shared
from hethpc.data.transform import task_of


def _array(value: Any, what: str) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    return np.asarray(value)


def from_arrays(x: Any, y: Any, *, name: str = "data") -> ArrayDataset:
    """Samples ``x`` ``[n, ...]`` and labels or targets ``y`` ``[n, ...]`` (numpy or torch).

    Integer ``y`` are class labels (``num_classes = max + 1``); floating-point ``y`` are
    regression targets (``num_classes = 0``).

    Raises:
        DatasetError: the arrays do not pair up, or hold no samples or non-finite values.
    """
    xa, ya = _array(x, "x"), _array(y, "y")
    if xa.ndim < 1 or ya.ndim < 1 or len(xa) != len(ya):
        raise DatasetError(
            f"{name}: x has shape {xa.shape} and y {ya.shape}; both need the samples along "
            "their first axis, the same number in each"
        )
    if len(xa) == 0:
        raise DatasetError(f"{name}: holds no samples")
    if not (np.issubdtype(xa.dtype, np.number) and np.issubdtype(ya.dtype, np.number)):
        raise DatasetError(f"{name}: x ({xa.dtype}) and y ({ya.dtype}) must be numeric arrays")
    if np.issubdtype(xa.dtype, np.floating) and not np.isfinite(xa).all():
        raise DatasetError(f"{name}: x holds NaN or Inf values")
    if np.issubdtype(ya.dtype, np.floating):
        if not np.isfinite(ya).all():
            raise DatasetError(f"{name}: y holds NaN or Inf values")
        return ArrayDataset(xa if xa.dtype == np.uint8 else xa.astype(np.float32, copy=False),
                            ya.astype(np.float32, copy=False), 0)  # fmt: skip
    if ya.ndim == 2 and ya.shape[1] == 1:  # a column of labels, [n, 1]: one per sample
        ya = ya[:, 0]
    if ya.ndim == 2 and xa.shape == ya.shape and np.issubdtype(xa.dtype, np.integer):
        return _tokens(name, xa, ya)
    if ya.ndim != 1:
        raise DatasetError(
            f"{name}: integer y of shape {ya.shape} are read as class labels, one per sample "
            "(shape [n]); for several targets per sample give floating-point y (regression), "
            "or integer tokens x [n, T] with integer targets y of the same shape (sequences)"
        )
    if ya.min() < 0:
        raise DatasetError(f"{name}: class labels must be 0 or more, found {int(ya.min())}")
    xa = xa if xa.dtype == np.uint8 else xa.astype(np.float32, copy=False)
    counts = np.bincount(ya.astype(np.int64, copy=False))
    empty = np.flatnonzero(counts == 0)
    if len(empty):  # a stray large label makes classes that no sample holds
        held = ", ".join(f"{c} ({counts[c]})" for c in np.flatnonzero(counts))
        warnings.warn(
            f"{name}: the labels run to {len(counts) - 1}, which makes {len(counts)} classes, "
            f"and {len(empty)} of them ({', '.join(map(str, empty[:10]))}"
            f"{', ...' if len(empty) > 10 else ''}) have no sample; labels (samples): {held}. "
            "Map the labels to 0, 1, 2, ... if that is not meant",
            stacklevel=2,
        )
    return ArrayDataset(xa, ya.astype(np.int64, copy=False), len(counts))


def _tokens(name: str, xa: np.ndarray, ya: np.ndarray) -> ArrayDataset:
    """Integer tokens ``[n, T]`` and their integer targets ``[n, T]``: per-position
    cross-entropy over a vocabulary of the largest token or target + 1 (task ``tokens``)."""
    low = int(min(xa.min(), ya.min()))
    if low < 0:
        raise DatasetError(f"{name}: tokens and targets must be 0 or more, found {low}")
    vocab = int(max(xa.max(), ya.max())) + 1
    return ArrayDataset(xa.astype(np.int64, copy=False), ya.astype(np.int64, copy=False), vocab,
                        task="tokens")  # fmt: skip


def from_torch(dataset: Any, *, name: str = "data") -> ArrayDataset:
    """A map-style ``torch.utils.data.Dataset`` of ``(x, y)`` items, read once into memory.

    For data larger than memory, convert it to HDF5 shards (``data_tools/convert.py``) and
    pass the directory instead.

    Raises:
        DatasetError: an item is not an ``(x, y)`` pair of arrays or numbers.
    """
    xs, ys = [], []
    for i in range(len(dataset)):
        item = dataset[i]
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            whole = (
                f" ({name} is a {type(dataset).__name__} of {len(dataset)}: give (x, y))"
                if isinstance(dataset, (tuple, list)) and 2 < len(dataset) <= 4
                else ""
            )
            raise DatasetError(
                f"{name}: item {i} is a {type(item).__name__}, expected an (x, y) pair{whole}"
            )
        xs.append(_array(item[0], "x"))
        ys.append(_array(item[1], "y"))
    if not xs:
        raise DatasetError(f"{name}: holds no samples")
    try:
        return from_arrays(np.stack(xs), np.stack(ys), name=name)
    except ValueError as e:
        if isinstance(e, DatasetError):
            raise
        raise DatasetError(f"{name}: the items' x or y differ in shape ({e})") from e


def in_memory(dataset: ShardedDataset, indices: np.ndarray | None = None) -> ArrayDataset:
    """Samples of ``dataset`` (``indices``, default all) read into memory, as stored (uint8
    stays uint8: evaluation scales it as training does), with the dataset's task."""
    idx = np.arange(len(dataset)) if indices is None else np.asarray(indices, dtype=np.int64)
    x, y = dataset.read(idx)
    return ArrayDataset(np.asarray(x), np.asarray(y), int(dataset.num_classes), task_of(dataset))


def as_dataset(data: Any, *, name: str = "data") -> ArrayDataset | ShardedDataset:
    """Any supported form of data as a dataset the loader reads (a collective for shards).

    Accepts an :class:`ArrayDataset` or :class:`ShardedDataset` (as is), an ``(x, y)`` pair of
    arrays or tensors, a directory of HDF5 shards (``manifest.json``, verified on open, every
    rank hashing a share), or a map-style ``torch.utils.data.Dataset`` of ``(x, y)`` items.

    Raises:
        DatasetError: the data is of none of these forms, naming what it got.
    """
    if isinstance(data, (ArrayDataset, ShardedDataset)):
        return data
    if isinstance(data, (str, os.PathLike)):
        return open_dataset_shared(Path(data))
    if isinstance(data, tuple) and len(data) == 2:
        return from_arrays(*data, name=name)
    if hasattr(data, "__getitem__") and hasattr(data, "__len__"):
        return from_torch(data, name=name)
    raise DatasetError(
        f"{name}: got a {type(data).__name__}; expected (x, y) arrays, a map-style torch "
        "Dataset of (x, y) items, an HDF5 shard directory or a hethpc dataset"
    )
