"""Building a run's data, model and optimizer from its settings."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from hethpc import comm
from hethpc.data import (
    ArrayDataset,
    ShardedDataset,
    load_mnist1d,
    open_dataset_shared,
)
from hethpc.models import build_model
from hethpc.train.config import TrainConfig


def load_data(cfg: TrainConfig) -> tuple[ArrayDataset | ShardedDataset, ArrayDataset]:
    """``(train, test)`` for ``cfg.data``.

    ``mnist1d`` is generated into the cache (rank 0 first, so the others only read it); any
    other value is a directory holding ``train/`` and ``test/`` HDF5 shard datasets (as written
    by ``data_tools/convert.py``), verified against their manifests before training (each rank
    hashes a share of the shards; every rank raises the same error on damage). The test split is
    read into memory for evaluation.
    """
    if cfg.data != "mnist1d":
        root = Path(cfg.data)
        train = open_dataset_shared(root / "train")  # each rank hashes a share of the shards
        test = open_dataset_shared(root / "test")
        x, y = test.read(np.arange(len(test)))  # as stored: evaluate() scales uint8 as training
        return train, ArrayDataset(np.asarray(x), np.asarray(y), int(test.num_classes))
    cache = cfg.cache_dir or str(Path.home() / ".cache" / "hethpc")
    if comm.rank() == 0:
        load_mnist1d(num_samples=cfg.samples, seed=cfg.data_seed, cache_dir=cache)
    comm.barrier()
    return load_mnist1d(num_samples=cfg.samples, seed=cfg.data_seed, cache_dir=cache)


def sample_shape(train: Any) -> tuple[int, ...]:
    """The shape of one training sample."""
    return tuple(train.sample_shape) if hasattr(train, "sample_shape") else tuple(train.x.shape[1:])


def build(cfg: TrainConfig, train: Any) -> nn.Module:
    """The model, initialised from ``cfg.seed`` (identical on every rank before the broadcast)."""
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model, sample_shape(train), int(train.num_classes))
    with torch.no_grad():
        model(torch.zeros(2, *sample_shape(train)))  # materialise lazy layers
    return model


def make_optimizer(
    cfg: TrainConfig, model: nn.Module, total_steps: int
) -> tuple[torch.optim.Optimizer, Any]:
    """The optimizer and its per-step learning-rate schedule."""
    opt: torch.optim.Optimizer
    if cfg.optimizer == "sgd":
        opt = torch.optim.SGD(
            model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay
        )
    else:
        opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    factor: Callable[[int], float]
    if cfg.lr_schedule == "cosine":
        factor = lambda s: 0.5 * (1 + math.cos(math.pi * min(s, total_steps) / max(total_steps, 1)))  # noqa: E731
    elif cfg.lr_schedule == "step":
        factor = lambda s: 0.1 ** (3 * s // max(total_steps, 1))  # noqa: E731
    else:
        factor = lambda s: 1.0  # noqa: E731
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)
