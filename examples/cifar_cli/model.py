"""A small CNN for 32x32 colour images: ``--model examples/cifar_cli/model.py:make``.

hethpc calls ``make(input_shape, num_classes)`` with the shape of one sample (``(3, 32, 32)``
for CIFAR) and the number of classes from the dataset's manifest.
"""

from __future__ import annotations

from torch import nn


def make(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    channels = input_shape[0]
    return nn.Sequential(
        nn.Conv2d(channels, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(32, num_classes),
    )  # fmt: skip
