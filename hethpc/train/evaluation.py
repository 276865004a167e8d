"""Scoring a model on held-out data: the metric, its name in the summary, one process's pass."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from hethpc.data import ArrayDataset
from hethpc.data.transform import to_inputs, to_targets

Metric = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def accuracy(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The fraction of rows of ``out`` ``[n, classes]`` whose largest entry is at label ``y``."""
    return (out.argmax(1) == y).float().mean()


def metric_key(metric: Metric) -> str:
    """The summary key of a metric: ``test_acc`` for :func:`accuracy`, else ``test_<name>``."""
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

    Samples go through :func:`~hethpc.data.transform.to_inputs`, as in training (uint8 scaled
    to [0, 1]). ``tick`` is called after every batch.
    """
    model.eval()
    total = 0.0
    with torch.no_grad():
        device = next(model.parameters()).device
        for i in range(0, len(data), batch):
            if tick is not None:
                tick()
            x = to_inputs(data.x[i : i + batch]).to(device)
            y = to_targets(data.y[i : i + batch]).to(device)
            total += float(metric(model(x), y)) * len(y)
    model.train()
    return total / max(len(data), 1)


