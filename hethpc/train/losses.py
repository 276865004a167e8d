"""Losses by name (``--loss``): the built-in ones, or the user's by import path."""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from hethpc.models import ImportSpecError
from hethpc.models.factory import import_object

Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def same_shape(loss: Loss) -> Loss:
    """``loss`` with the model's output given the targets' shape where only the shapes differ.

    A model with one output per sample gives ``[n, 1]`` against targets ``[n]``: broadcasting
    would silently compare every pair (an ``[n, n]`` difference), so the output takes the
    targets' shape when the sizes agree. Used for the built-in losses and the user's own loss
    and metric alike; the wrapper keeps ``loss``'s name (the summary key of a metric).
    """

    def call(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if out.shape != y.shape and out.numel() == y.numel():
            out = out.reshape(y.shape)
        return loss(out, y)

    call.__name__ = getattr(loss, "__name__", type(loss).__name__)
    call.__doc__ = getattr(loss, "__doc__", None)
    return call


def cross_entropy(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy with the classes along ``out``'s last axis, the mean over every target:
    ``out`` ``[n, C]`` against labels ``[n]``, or per position for sequences, ``out``
    ``[n, T, V]`` against targets ``[n, T]`` (as ``[n * T, V]`` against ``[n * T]``)."""
    if out.dim() > 2 and out.shape[:-1] == y.shape:
        return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
    return F.cross_entropy(out, y)


LOSSES: dict[str, Callable[[], Loss]] = {
    "cross_entropy": lambda: cross_entropy,
    "mse": lambda: same_shape(nn.MSELoss()),
    "l1": lambda: same_shape(nn.L1Loss()),
    "smooth_l1": lambda: same_shape(nn.SmoothL1Loss()),
}


def make_loss(name: str) -> Loss:
    """A loss by built-in name (:data:`LOSSES`) or ``package.module:factory`` / ``file.py:factory``.

    A factory is called without arguments and returns ``loss(output, target) -> scalar``
    (an ``nn.Module`` such as ``nn.HuberLoss`` works as its own factory); its output is
    given the targets' shape where only the shapes differ (:func:`same_shape`).

    Raises:
        ImportSpecError: the name is neither built in nor an import path that loads.
    """
    if name in LOSSES:
        return LOSSES[name]()
    if ":" not in name:
        raise ImportSpecError(
            f"unknown loss {name!r}; choose one of {sorted(LOSSES)} or give your own as "
            "'package.module:factory'"
        )
    factory = import_object(name, what="loss")
    try:
        inspect.signature(factory).bind()
    except TypeError as e:
        raise ImportSpecError(
            f"loss {name!r} is called without arguments to make the loss (a class such as "
            f"torch.nn:HuberLoss, or a function returning loss(output, target)): {e}"
        ) from e
    except ValueError:  # no signature to read (a builtin): call it and see
        pass
    made = factory()
    if not callable(made):
        raise ImportSpecError(f"loss {name!r} made a {type(made).__name__}, which is not callable")
    return same_shape(made)


def mse(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean squared error, the default metric for regression targets."""
    if out.shape != y.shape and out.numel() == y.numel():
        out = out.reshape(y.shape)
    return torch.mean((out.float() - y.float()) ** 2)
