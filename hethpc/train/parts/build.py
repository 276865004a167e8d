"""Building a run's data and model from its settings."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from hethpc import comm
from hethpc.data import ArrayDataset, DatasetError, ShardedDataset, load_mnist1d
from hethpc.data.adapt import in_memory
from hethpc.data.shards.manifest import MANIFEST_NAME
from hethpc.data.shards.sharded import split_dirs
from hethpc.data.shards.shared import open_dataset_shared
from hethpc.data.transform import is_sequence, to_batch
from hethpc.models import ModelError, build_model
from hethpc.train.settings.config import ConfigError, TrainConfig


def load_data(
    cfg: TrainConfig,
) -> tuple[ArrayDataset | ShardedDataset, ArrayDataset, ArrayDataset | None]:
    """``(train, test, val)`` for ``cfg.data``; ``val`` is None without a ``val/`` split.

    ``mnist1d`` is generated into the cache (rank 0 first, so the others only read it); any
    other value is a directory holding ``train/`` and ``test/`` HDF5 shard datasets (as written
    by ``hethpc-convert``), and maybe ``val/`` (``hethpc-convert text`` writes one), or one of
    them (see :func:`data_root`), verified against their manifests before training (each rank
    hashes a share of the shards; every rank raises the same error on damage). The test and
    validation splits are read into memory for evaluation.

    Raises:
        ConfigError: the directory holds a ``val/`` split and ``cfg.val_fraction`` asks for
            another.
    """
    if cfg.data != "mnist1d":
        root = data_root(cfg.data)
        held = root / "val" if "val" in split_dirs(root) else None
        if held is not None and cfg.val_fraction:
            raise ConfigError(
                f"--data {cfg.data} holds a validation split, {held}, which the evaluations "
                f"during training score; --val-fraction {cfg.val_fraction:g} would hold out "
                "another from train/: leave --val-fraction out (0), or convert without val/ "
                "(hethpc-convert text --val-fraction 0)",
                key="val_fraction",
            )
        train = open_dataset_shared(root / "train")  # each rank hashes a share of the shards
        test = in_memory(open_dataset_shared(root / "test"))  # as stored: scaled as training
        val = in_memory(open_dataset_shared(held)) if held is not None else None
        return train, test, val
    cache = cfg.cache_dir or str(Path.home() / ".cache" / "hethpc")
    if comm.rank() == 0:
        load_mnist1d(num_samples=cfg.samples, seed=cfg.data_seed, cache_dir=cache)
    comm.barrier()
    return (*load_mnist1d(num_samples=cfg.samples, seed=cfg.data_seed, cache_dir=cache), None)


def data_root(data: str) -> Path:
    """The directory holding ``train/`` and ``test/`` that ``--data`` names: that directory
    itself, or one of its splits (``OUT/train``, the form ``hethpc-inspect`` takes).

    Raises:
        DatasetError: ``data`` is a single dataset without a ``train/`` and ``test/`` beside
            it, or a directory that holds some splits but not both.
    """
    root = Path(data)
    if (root / MANIFEST_NAME).is_file():
        if {"train", "test"} <= set(split_dirs(root.parent)):
            return root.parent
        raise DatasetError(
            f"--data {data} is a single dataset; --data takes a directory that holds train/ "
            "and test/ (as hethpc-convert writes them): convert with a test split, or train "
            "on it with hethpc.fit(model, train_data, test_data=...)"
        )
    splits = split_dirs(root)
    if splits and not {"train", "test"} <= set(splits):
        raise DatasetError(
            f"--data {data} holds {' and '.join(f'{s}/' for s in splits)}, but training needs "
            "train/ and test/; write both with hethpc-convert --out DIR"
        )
    return root


def sample_shape(train: Any) -> tuple[int, ...]:
    """The shape of one training sample, as stored."""
    return tuple(train.sample_shape) if hasattr(train, "sample_shape") else tuple(train.x.shape[1:])


def input_shape(train: Any) -> tuple[int, ...]:
    """The shape of the model's input for one sample: the stored shape, or for token windows of
    ``T + 1`` tokens ``(T,)`` (the model reads a window's first ``T``)."""
    shape = sample_shape(train)
    return (*shape[:-1], shape[-1] - 1) if is_sequence(train) else shape


def example_inputs(train: Any, n: int = 2) -> torch.Tensor:
    """A batch of ``n`` zero inputs of :func:`input_shape` (int64 tokens for token windows),
    for a first forward pass that materialises lazy layers."""
    dtype = torch.int64 if is_sequence(train) else torch.float32
    return torch.zeros(n, *input_shape(train), dtype=dtype)


def check_outputs(model: nn.Module, train: Any, *, loss: str, what: str, fix: str) -> None:
    """Refuse a model whose outputs do not fit the data's labels or targets under ``loss``.

    One forward pass of two training samples (in eval mode, without gradients): for
    ``"cross_entropy"`` the output must be ``[n, C]`` with ``C`` at least the data's classes
    (for token windows ``[n, T, V]``, one row per position, ``V`` at least the vocabulary);
    for the built-in regression losses (``"mse"``, ``"l1"``, ``"smooth_l1"``) each sample's
    output must hold as many values as its target. Other (the user's own) losses are not
    checked. ``what`` names the model, ``fix`` says how to give it other outputs.

    Raises:
        ModelError: the forward pass fails (named, with the exception), or the outputs do
            not fit: naming the output and label shapes and the fix.
    """
    if loss not in ("cross_entropy", "mse", "l1", "smooth_l1"):
        return
    if isinstance(train, ArrayDataset):
        x, y = train.x[:2], train.y[:2]
    else:
        x, y = train.read(np.arange(min(2, len(train))))
    param = next(iter(model.parameters()), None)
    modes = {m: m.training for m in model.modules()}
    sequence = is_sequence(train)
    inputs, targets = to_batch(np.asarray(x), np.asarray(y), sequence=sequence)
    model.eval()
    try:
        with torch.no_grad():
            out = model(inputs.to(param.device) if param is not None else inputs)
    except Exception as e:
        raise ModelError(
            f"{what} fails on a batch of the training samples, shape {tuple(inputs.shape)}: "
            f"{type(e).__name__}: {e}; size its first layer by the sample shape "
            f"{tuple(inputs.shape[1:])}"
        ) from e
    finally:
        for m, training in modes.items():
            m.train(training)
    if not isinstance(out, torch.Tensor):
        raise ModelError(f"{what} returned a {type(out).__name__}, expected a tensor")
    classes = int(train.num_classes)
    shape = tuple(out.shape[1:])
    if loss == "cross_entropy":
        if classes == 0:
            raise ModelError(
                "the training targets are floating-point (regression), but the loss is "
                "cross-entropy over class labels; give integer labels, or a regression loss "
                "(mse, l1, smooth_l1)"
            )
        if sequence:
            positions = tuple(targets.shape[1:])
            if shape[:-1] != positions or shape[-1] < classes:
                raise ModelError(
                    f"{what} gives outputs of shape {shape} per sample, but the training data "
                    f"are token windows with {positions[0]} next-token targets each over a "
                    f"vocabulary of {classes}, and cross-entropy needs one output per token at "
                    f"each position: shape ({positions[0]}, {classes}); {fix}"
                )
            return
        if len(shape) != 1 or shape[0] < classes:
            raise ModelError(
                f"{what} gives outputs of shape {shape} per sample, but the training labels "
                f"go up to {classes - 1} ({classes} classes) and cross-entropy needs one "
                f"output per class: shape ({classes},); {fix}"
            )
        return
    target = tuple(np.asarray(y).shape[1:])
    if math.prod(shape) != math.prod(target):
        per_sample = "one value per sample" if not target else f"shape {target} per sample"
        kind = "integer class labels" if classes else "floating-point regression targets"
        hint = (
            "; for class labels use the cross_entropy loss"
            if classes
            else "; if y are class labels, give them an integer dtype (y.astype(int))"
        )
        raise ModelError(
            f"{what} gives outputs of shape {shape} per sample, but the training data has "
            f"{kind}, {per_sample}, for the {loss} loss; {fix}{hint}"
        )


def build(cfg: TrainConfig, train: Any) -> nn.Module:
    """The model, initialised from ``cfg.seed`` (identical on every rank before the broadcast).

    Raises:
        ImportSpecError: ``cfg.model`` is neither built in nor an import path that loads.
        ModelError: the factory raises, or the model's forward fails on a batch of the data's
            sample shape (the message names the factory's call and the exception).

    The factory is called as ``factory(input_shape, num_classes)``: for token windows of
    ``T + 1`` bytes, ``(T,)`` and the vocabulary (256 for bytes).
    """
    torch.manual_seed(cfg.seed)
    shape, classes = input_shape(train), int(train.num_classes)
    model = build_model(cfg.model, shape, classes)
    try:
        with torch.no_grad():
            model(example_inputs(train))  # materialise lazy layers
    except Exception as e:
        call = f"{cfg.model.rpartition(':')[2]}({shape!r}, {classes})"
        raise ModelError(
            f"--model {cfg.model}: the model built as {call} fails on a batch of shape "
            f"{(2, *shape)}: {type(e).__name__}: {e}; size its first layer by input_shape "
            f"{shape}"
        ) from e
    return model
