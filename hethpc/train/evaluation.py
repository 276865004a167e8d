"""Scoring a model on held-out data: the metric, its name in the summary, one process's pass."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import nn

from hethpc.data import ArrayDataset
from hethpc.data.transform import is_sequence, to_batch
from hethpc.train.losses import cross_entropy

Metric = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def accuracy(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The fraction of targets ``y`` at which ``out`` has its largest entry (classes along the
    last axis): per sample for ``out`` ``[n, classes]`` and labels ``[n]``, per position for
    sequences, ``out`` ``[n, T, V]`` and targets ``[n, T]``."""
    return (out.argmax(-1) == y).float().mean()


def bits_per_byte(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The mean cross-entropy over every position of ``out`` ``[n, T, V]`` against byte
    targets ``y`` ``[n, T]``, in bits (nats / ln 2): the metric of byte-level language
    models, lower is better (8 for a uniform guess over 256 bytes)."""
    return cross_entropy(out, y) / math.log(2)


bits_per_byte.__name__ = "bpb"  # its summary key: test_bpb, val_bpb


def default_metric(data: object) -> Metric:
    """The metric for ``data``'s targets: :func:`bits_per_byte` for token windows
    (:func:`~hethpc.data.transform.is_sequence`), else :func:`accuracy`."""
    return bits_per_byte if is_sequence(data) else accuracy


#: Metrics scored beside a run's metric, in the same pass over the data, each under its own key
#: beside the metric's: accuracy per position beside bits per byte (``val_acc`` by ``val_bpb``).
COMPANIONS: dict[Metric, tuple[Metric, ...]] = {bits_per_byte: (accuracy,)}


def scored(metric: Metric) -> tuple[Metric, ...]:
    """``metric`` and its companions (:data:`COMPANIONS`), in the order their scores are
    recorded."""
    return (metric, *COMPANIONS.get(metric, ()))


def metric_key(metric: Metric) -> str:
    """The summary key of a metric: ``test_acc`` for :func:`accuracy`, else ``test_<name>``
    (``test_bpb`` for :func:`bits_per_byte`)."""
    if metric is accuracy:
        return "test_acc"
    return "test_" + getattr(metric, "__name__", type(metric).__name__).lower()


def evaluate(
    model: nn.Module,
    data: ArrayDataset,
    *,
    metric: Metric = accuracy,
    batch: int = 2048,
    tick: Callable[[], None] | None = None,
) -> float:
    """``metric`` of ``model`` on all of ``data`` (batch means weighted by batch size).

    Samples go through :func:`~hethpc.data.transform.to_batch`, as in training (uint8 scaled
    to [0, 1]; token windows split into inputs and next-token targets). ``tick`` is called
    after every batch.
    """
    return evaluate_all(model, data, (metric,), batch=batch, tick=tick)[0]


def evaluate_all(
    model: nn.Module,
    data: ArrayDataset,
    metrics: Sequence[Metric],
    *,
    batch: int = 2048,
    tick: Callable[[], None] | None = None,
) -> list[float]:
    """Each of ``metrics`` of ``model`` on all of ``data``, in one pass (see :func:`evaluate`)."""
    model.eval()
    totals = [0.0] * len(metrics)
    sequence = is_sequence(data)
    with torch.no_grad():
        device = next(model.parameters()).device
        for i in range(0, len(data), batch):
            if tick is not None:
                tick()
            x, y = to_batch(data.x[i : i + batch], data.y[i : i + batch], sequence=sequence)
            x, y = x.to(device), y.to(device)
            out = model(x)
            for j, metric in enumerate(metrics):
                totals[j] += float(metric(out, y)) * len(y)
    model.train()
    return [t / max(len(data), 1) for t in totals]
