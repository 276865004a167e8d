"""The one preprocessing step between stored samples and the model, in training and evaluation."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

#: Tasks whose targets are sequences: ``next-byte``, a manifest's token windows (the model
#: reads a window's first tokens and predicts each one's next; ``hethpc-convert text`` writes
#: it), and ``tokens``, in-memory integer inputs ``[n, T]`` with their own integer targets
#: ``[n, T]`` (``fit((x, y))``).
SEQUENCE_TASKS = frozenset({"next-byte", "tokens"})


def task_of(dataset: Any) -> str | None:
    """The task a dataset declares: its manifest's ``meta.task`` (a
    :class:`~hethpc.data.ShardedDataset`) or its ``task`` (an
    :class:`~hethpc.data.ArrayDataset`); None when it declares none."""
    manifest = getattr(dataset, "manifest", None)
    if manifest is not None:
        task = manifest.meta.get("task")
        return task if isinstance(task, str) else None
    return getattr(dataset, "task", None)


def is_sequence(dataset: Any) -> bool:
    """Whether ``dataset``'s samples are token windows with sequence targets (a task in
    :data:`SEQUENCE_TASKS`), rather than samples with one label each. Decides, for training
    and evaluation alike, what :func:`to_batch` makes of them."""
    return task_of(dataset) in SEQUENCE_TASKS


def to_inputs(x: np.ndarray, *, normalize: bool = True) -> torch.Tensor:
    """Samples as the model's float32 input: uint8 scaled to ``[0, 1]`` (when ``normalize``).

    The loader and evaluation both call this, so a model sees the same scale in both.
    """
    if x.dtype == np.uint8 and normalize:
        return torch.from_numpy(np.ascontiguousarray(x)).to(torch.float32).div_(255.0)
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))


def to_targets(y: np.ndarray) -> torch.Tensor:
    """Labels as int64 (classes) or targets as float32 (regression: floating-point ``y``)."""
    if y.dtype.kind == "f":  # floating point (faster than np.issubdtype, per batch)
        return torch.from_numpy(np.ascontiguousarray(y, dtype=np.float32))
    return torch.from_numpy(np.ascontiguousarray(y, dtype=np.int64))


def next_tokens(x: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """Windows of ``T + 1`` tokens as ``(inputs, targets)``: int64 ``[n, T]`` each, the
    inputs a window's first ``T`` tokens (unscaled, for an embedding), the targets its last
    ``T`` (each input token's next)."""
    w = torch.from_numpy(np.ascontiguousarray(x)).to(torch.int64)
    return w[:, :-1].contiguous(), w[:, 1:].contiguous()


def to_batch(
    x: np.ndarray, y: np.ndarray, *, sequence: bool = False, normalize: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stored samples and labels as the model's ``(inputs, targets)``.

    Args:
        x: samples ``[n, *sample_shape]`` as stored.
        y: their labels ``[n]`` (or regression targets).
        sequence: the samples are tokens with sequence targets (:func:`is_sequence`): with
            ``y`` of ``x``'s shape (task ``tokens``) the int64 tokens and targets as they are,
            else windows whose inputs and targets both come from ``x`` (:func:`next_tokens`;
            ``y`` is not used).
        normalize: scale uint8 samples to ``[0, 1]`` (not tokens).
    """
    if sequence:
        y = np.asarray(y)
        if y.shape == x.shape:
            as_int = (torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64)) for a in (x, y))
            return next(as_int), next(as_int)
        return next_tokens(x)
    return to_inputs(x, normalize=normalize), to_targets(np.asarray(y))
