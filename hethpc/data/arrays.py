"""A labelled data set held in memory as two numpy arrays."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ArrayDataset:
    """A labelled data set held in memory.

    Attributes:
        x: samples, shape ``[n, *sample_shape]``, float32.
        y: labels, shape ``[n]``, int64.
        num_classes: number of distinct labels (the vocabulary for token windows).
        task: what the samples are for, as a manifest's ``meta.task`` says it (``next-byte``:
            token windows, see :func:`~hethpc.data.transform.is_sequence`); None: one label
            (or target) per sample.
    """

    x: np.ndarray
    y: np.ndarray
    num_classes: int
    task: str | None = None

    def __len__(self) -> int:
        return len(self.y)
