"""The high-level entry: train your own model on your own data, every capability a setting."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from hethpc import comm
from hethpc.data import ArrayDataset, DatasetError, as_dataset
from hethpc.data.adapt import in_memory
from hethpc.models import ImportSpecError
from hethpc.train.evaluation import Metric, default_metric
from hethpc.train.losses import LOSSES, Loss, cross_entropy, make_loss, mse, same_shape
from hethpc.train.parts.build import check_outputs, example_inputs, sample_shape
from hethpc.train.run.loop import RunResult, run_training
from hethpc.train.run.start import start_run
from hethpc.train.settings.config import ConfigError, TrainConfig
from hethpc.train.settings.sources import make_config


def _regression(data: Any) -> bool:
    labels = data.y if isinstance(data, ArrayDataset) else getattr(data, "labels", None)
    return labels is not None and np.issubdtype(np.asarray(labels[:1]).dtype, np.floating)


def _data_signature(data: Any) -> tuple[Any, ...]:
    """Length, sample shape, classes and (in memory) a digest of three samples: cheap to compare."""
    sig: tuple[Any, ...] = (len(data), sample_shape(data), int(data.num_classes))
    if isinstance(data, ArrayDataset):
        rows = sorted({0, len(data) // 2, len(data) - 1})
        digest = hashlib.sha256()
        for a in (data.x[rows], data.y[rows]):
            digest.update(np.ascontiguousarray(a).tobytes())
        sig += (digest.hexdigest()[:16],)
    return sig


def _check_same_data(train_set: Any) -> None:
    """Refuse training data that differs between ranks (a collective).

    Every rank takes its share of one permutation of the whole training set: with another
    set on some rank, samples would be trained on twice or never, silently.
    """
    sigs = comm.allgather_object(_data_signature(train_set))
    differ = [r for r, sig in enumerate(sigs) if sig != sigs[0]]
    if differ:

        def show(r: int) -> str:
            n, shape, classes = sigs[r][:3]
            return f"rank {r}: {n} samples of shape {shape}, {classes} classes"

        same = "" if any(sigs[r][:3] != sigs[0][:3] for r in differ) else (
            ", other values: a map-style Dataset is read once into memory, so a random "
            "transform in it must be seeded alike on every rank"
        )
        raise DatasetError(
            f"train_data differs between ranks ({show(0)}; {'; '.join(map(show, differ))}"
            f"{same}); give every rank the whole training set, the same on each: hethpc "
            "gives each rank its share (partition says how)"
        )


def _check_test_data(train_set: Any, test_set: ArrayDataset, regression: bool) -> None:
    """Refuse test data that the trained model cannot be scored on (before training): other
    features, another kind of ``y``, or class labels that train_data does not have."""
    train_shape, test_shape = sample_shape(train_set), tuple(test_set.x.shape[1:])
    if train_shape != test_shape:
        raise DatasetError(
            f"test_data: samples of shape {test_shape}, but train_data's are {train_shape}; "
            "give both the same features"
        )
    if _regression(test_set) != regression:
        kinds = ("floating-point targets", "integer class labels")
        got, want = kinds[::-1] if regression else kinds
        raise DatasetError(
            f"test_data: y are {got}, but train_data's are {want}; give both the same dtype"
        )
    if regression:
        return
    y, classes = np.asarray(test_set.y).reshape(-1), int(train_set.num_classes)
    outside = (y < 0) | (y >= classes)
    if outside.any():
        labels, counts = np.unique(y[outside], return_counts=True)
        listed = ", ".join(
            f"{v} ({n} sample{'s' if n != 1 else ''})"
            for v, n in zip(labels.tolist(), counts.tolist(), strict=True)
        )
        raise DatasetError(
            f"test_data: labels {listed} lie outside train_data's labels 0..{classes - 1} "
            f"({classes} classes), so the model is never trained on them (nor, sized by "
            "train_data, has outputs for them); give test data of train_data's classes, or "
            "train on every class"
        )


def fit(
    model: nn.Module,
    train_data: Any,
    *,
    test_data: Any = None,
    loss: Loss | str | None = None,
    metric: Metric | None = None,
    config: TrainConfig | None = None,
    overwrite: bool = False,
    log: Callable[[str], None] = print,
    **settings: Any,
) -> RunResult:
    """Train ``model`` on ``train_data`` across every rank of the job (call it on every rank).

    The same loop as ``jobs/train.py``: per-rank batch sizes, the sync policy, partitions,
    injection, checkpoints and ``resume``, the guards and the watchdog, progress and per-rank
    metrics in the run directory. Rank 0's initial weights are broadcast, so every rank may
    build the model with its own seed.

    Args:
        model: any ``nn.Module`` (an ``nn.Sequential`` with ``pipeline_stages > 1``); its
            parameters must be the same shapes on every rank.
        train_data: ``(x, y)`` numpy arrays or tensors, a map-style ``torch`` Dataset of
            ``(x, y)`` items, an HDF5 shard directory (``data_tools/convert.py``), or a hethpc
            dataset. Integer ``y`` are class labels, floating-point ``y`` regression targets.
            uint8 samples are scaled to ``[0, 1]``, in training and evaluation alike. A shard
            directory of token windows (``hethpc-convert text``) trains next-token prediction:
            inputs a window's first ``T`` bytes, targets its last ``T``.
        test_data: the same forms; evaluated with ``metric`` (rank 0, at epoch ends as
            ``eval_every`` says, and at the end); None: no evaluation.
        loss: ``loss(model(x), y)`` -> scalar batch mean, or a name as ``--loss`` takes
            (``"mse"``, ``"l1"``, ``"package.module:factory"``); default cross-entropy for
            labels (per position for token windows), mean squared error for regression targets.
            Where only the shapes differ (one output per sample, ``[n, 1]`` against ``[n]``)
            the output is given the targets' shape first, for ``metric`` too.
        metric: ``metric(model(x), y)`` -> batch mean; default accuracy for labels, bits per
            byte for token windows, mean squared error for targets. The summary holds it as
            ``test_<name>`` (``test_acc`` for accuracy, ``test_bpb`` for bits per byte).
        config: the settings; or give them as keywords (``batch_size=256, sync="selsync"``),
            named like :class:`~hethpc.train.TrainConfig`'s fields and validated alike. Its
            ``loss``, when not the default, is used where ``loss`` is not given.
        overwrite: a fresh run may replace an earlier hethpc run in ``run_dir``.
        log: where rank 0's messages go.

    Returns:
        The run's summary, the trained model (replicas averaged) and its run directory.

    Raises:
        ConfigError: an invalid setting (named), or settings that differ across ranks.
        DatasetError: data of an unsupported form, or malformed.
        ModelError: with the default loss, the model's outputs do not fit the labels or
            targets (fewer outputs than classes, or not one value per target).
    """
    if not isinstance(model, nn.Module):
        raise ConfigError(
            f"fit(model=...) must be a torch nn.Module, got a {type(model).__name__}; wrap a "
            "function in an nn.Module whose forward calls it"
        )
    if loss is None and config is not None and config.loss != TrainConfig().loss:
        loss = config.loss  # a loss named in the config, as jobs/train.py would use it
    loss_name = loss if isinstance(loss, str) else None
    if isinstance(loss, str):  # a built-in name or an import path, as --loss takes
        try:
            loss = make_loss(loss)
        except ImportSpecError as e:
            raise ConfigError(f"fit(loss=...): {e}", key="loss") from e
    for what, value, default in (
        ("loss", loss, "cross-entropy for labels, mean squared error for targets"),
        ("metric", metric, "accuracy for labels, bits per byte for token windows, mean "
                           "squared error for targets"),
    ):
        if value is not None and not callable(value):
            raise ConfigError(
                f"fit({what}=...) must be callable as {what}(model(x), y) -> a batch mean, got "
                f"a {type(value).__name__} ({value!r}); leave it out for the default ({default})",
                key=what,
            )
    if config is not None and settings:
        raise ConfigError(
            f"give the settings either as config= or as keywords, not both ({sorted(settings)})"
        )
    ignored = sorted(set(settings) & {"data", "samples", "data_seed", "cache_dir"})
    if ignored:
        raise ConfigError(
            f"fit() got {ignored}: jobs/train.py's settings for the data it loads; fit trains "
            "on train_data (and test_data): pass your arrays, Dataset or HDF5 shard directory "
            "(e.g. fit(model, 'data/x/train', test_data='data/x/test'))",
            key=ignored[0],
        )
    if config is None:
        settings.setdefault("model", f"{type(model).__module__}:{type(model).__qualname__}")
        settings.setdefault("progress", True)
        cfg = make_config(
            settings, {k: f"fit({k}=...)" for k in settings},
            also=("test_data", "loss", "metric", "config", "overwrite", "log"),
        )  # fmt: skip
    else:
        cfg = config
    comm.init(transport=cfg.transport)
    run_dir = start_run(cfg, overwrite=overwrite, log=log)
    train_set = as_dataset(train_data, name="train_data")
    test_set = as_dataset(test_data, name="test_data") if test_data is not None else None
    if test_set is not None and not isinstance(test_set, ArrayDataset):
        test_set = in_memory(test_set)  # as stored, with its task (token windows stay so)
    _check_same_data(train_set)
    regression = _regression(train_set)
    if test_set is not None:
        _check_test_data(train_set, test_set, regression)
    if regression and cfg.partition in ("labels", "dirichlet"):
        raise ConfigError(
            f"partition = {cfg.partition!r} splits by class label, but train_data has "
            "floating-point regression targets; use partition 'iid' or 'seldp'"
        )
    # The user's loss and metric, like the built-in ones, get the output in the targets'
    # shape where only the shapes differ: [n, 1] against [n] would broadcast to [n, n].
    loss_fn = (
        same_shape(loss)
        if loss is not None
        else (LOSSES["mse"]() if regression else cross_entropy)
    )
    chosen = (
        same_shape(metric) if metric is not None
        else mse if regression
        else default_metric(train_set)
    )  # fmt: skip
    if any(isinstance(m, nn.modules.lazy.LazyModuleMixin) for m in model.modules()):
        with torch.no_grad():  # materialise lazy layers before the ranks compare shapes
            model(example_inputs(train_set))
    if loss is None or loss_name is not None:  # a built-in loss: outputs must fit the labels
        check_outputs(
            model, train_set, loss=loss_name or ("mse" if regression else "cross_entropy"),
            what="the model", fix="change the model's last layer",
        )  # fmt: skip
    return run_training(
        cfg, model, train_set, test_set, run_dir=run_dir, loss_fn=loss_fn, metric=chosen,
        log=log,
    )  # fmt: skip
