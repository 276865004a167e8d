"""Model builders: every model is an ``nn.Sequential`` so pipeline stages can cut it."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from torch import nn


def mlp(
    input_shape: Sequence[int], num_classes: int, *, hidden: int = 256, depth: int = 2
) -> nn.Sequential:
    """A multi-layer perceptron over the flattened input.

    Args:
        input_shape: shape of one sample, e.g. ``(40,)`` for MNIST-1D.
        num_classes: number of output logits.
        hidden: width of each hidden layer.
        depth: number of hidden layers.
    """
    layers: list[nn.Module] = [nn.Flatten()]
    width = math.prod(input_shape)
    for _ in range(depth):
        layers += [nn.Linear(width, hidden), nn.ReLU()]
        width = hidden
    layers.append(nn.Linear(width, num_classes))
    return nn.Sequential(*layers)


def cnn1d(
    input_shape: Sequence[int], num_classes: int, *, channels: int = 32
) -> nn.Sequential:
    """A 1-D CNN for sequences such as MNIST-1D; input ``[batch, length]`` or ``[batch, 1, length]``.

    Args:
        input_shape: ``(length,)`` or ``(1, length)``.
        num_classes: number of output logits.
        channels: channels of each convolution.
    """
    length = int(input_shape[-1])
    return nn.Sequential(
        nn.Unflatten(1, (1, length)) if len(input_shape) == 1 else nn.Identity(),
        nn.Conv1d(1, channels, 5, stride=2, padding=1),
        nn.ReLU(),
        nn.Conv1d(channels, channels, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.Conv1d(channels, channels, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.LazyLinear(num_classes),
    )


MODELS: dict[str, Callable[..., nn.Sequential]] = {"mlp": mlp, "cnn1d": cnn1d}


def build_model(name: str, input_shape: Sequence[int], num_classes: int) -> nn.Sequential:
    """Build a built-in model by name.

    Raises:
        ValueError: the name is not one of :data:`MODELS`.
    """
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {sorted(MODELS)}")
    return MODELS[name](input_shape, num_classes)
