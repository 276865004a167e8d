"""One pipeline stage: its layers on its device, and one micro-batch's forward and backward.

The stage computes and never communicates: :mod:`hethpc.pipeline.runner` walks the schedule,
moves the tensors between neighbours and times the passes. A backward comes in two halves where
the stage can split it (:mod:`hethpc.pipeline.backward`): :meth:`Stage.backward_input` returns
the input's gradient (to be sent at once) and what :meth:`Stage.backward_weights` needs for
the weights' gradients, later.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from hethpc.pipeline.backward import can_split, input_gradient, tapped_forward, weight_gradients
from hethpc.pipeline.rng import RngState, rng_restored

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
Pending = tuple[Any, list[torch.Tensor | None]]  # taps and their output gradients, awaiting W


class Stage:
    """Stage ``index`` of ``stages``: ``module`` on ``device``.

    Args:
        module: this stage's layers (moved to ``device``).
        index: the stage's place in the pipeline, 0-based.
        stages: P, the number of stages.
        device: where the layers run.
        split_backward: split the backward where possible: on stages other than the first,
            when every parametrised layer holds its parameters directly.
    """

    def __init__(
        self,
        module: nn.Sequential,
        *,
        index: int,
        stages: int,
        device: torch.device,
        split_backward: bool,
    ) -> None:
        self.index = index
        self.stages = stages
        self.device = device
        self.module = module.to(device)
        self.split_backward = bool(split_backward) and index > 0 and can_split(self.module)

    @property
    def is_first(self) -> bool:
        """Whether this is the first stage (it reads the inputs; its input needs no gradient)."""
        return self.index == 0

    @property
    def is_last(self) -> bool:
        """Whether this is the last stage (it reads the targets and computes the loss)."""
        return self.index == self.stages - 1

    def forward(
        self, inp: torch.Tensor, target: torch.Tensor | None, n: int, loss_fn: LossFn
    ) -> tuple[torch.Tensor, Any]:
        """The stage's output on one micro-batch ``inp [rows, ...]`` (on the last stage its
        share of the batch's mean loss, ``loss_fn(out, target) * rows / n``), and its layers'
        outputs for the split backward (None when not splitting or without autograd)."""
        taps = None
        if self.split_backward and torch.is_grad_enabled() and inp.requires_grad:
            out, taps = tapped_forward(self.module, inp)
        else:
            out = self.module(inp)
        if not self.is_last:
            return out, taps
        assert target is not None
        return loss_fn(out, target.to(self.device)) * (inp.shape[0] / n), taps

    def recompute(
        self,
        inp: torch.Tensor,
        target: torch.Tensor | None,
        n: int,
        loss_fn: LossFn,
        rng: RngState,
    ) -> tuple[torch.Tensor, Any]:
        """:meth:`forward` again, with the random numbers of the first run (checkpointing)."""
        with rng_restored(self.device, rng):
            return self.forward(inp, target, n, loss_fn)

    def backward_input(
        self, inp: torch.Tensor, out: torch.Tensor, taps: Any, grad: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, Pending | None]:
        """B: the gradient of ``inp`` (None on the first stage), from ``grad``, the gradient
        of ``out`` (None on the last stage, whose ``out`` is its loss).

        Returns:
            The input's gradient, and, when the backward was split, what
            :meth:`backward_weights` needs for the weights' gradients (else None: a plain
            backward has already added them into ``.grad``).
        """
        if taps is not None and out.requires_grad and inp.requires_grad:
            g_in, tap_grads = input_gradient(out, grad, inp, taps)
            return g_in, (taps, tap_grads)
        if out.requires_grad:
            torch.autograd.backward(out, grad)
        if self.is_first:
            return None, None
        return (inp.grad if inp.grad is not None else torch.zeros_like(inp)), None

    def backward_weights(self, pending: Pending) -> None:
        """W: the weights' gradients from :meth:`backward_input`'s pending half, added into
        ``.grad``; frees that micro-batch's graph."""
        weight_gradients(*pending)

    def elapsed(self, t0: float) -> float:
        """Seconds since ``t0`` (``time.perf_counter()``), the device's queued work included."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter() - t0
