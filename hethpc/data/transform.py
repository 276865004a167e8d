"""The one preprocessing step between stored samples and the model, in training and evaluation."""

from __future__ import annotations

import numpy as np
import torch


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
