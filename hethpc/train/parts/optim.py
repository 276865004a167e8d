"""The optimizer a run steps: its parameter groups, its learning-rate schedule and clipping.

The schedule's factors are plain functions of the global step, so a resumed run takes the same
rates; :func:`make_optimizer` is the one place a run's optimizer is built.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from hethpc.train.settings.config import TrainConfig

__all__ = ["GradientClip", "lr_factor", "make_optimizer", "param_groups", "wsd_factor"]

WSD_DECAY = 0.2


def param_groups(
    model: nn.Module, weight_decay: float, *, decay_norms_biases: bool = False
) -> list[dict[str, Any]]:
    """``model``'s trainable parameters as optimizer groups: those of two or more dimensions
    (weight matrices, kernels, embeddings) with ``weight_decay``, the others (biases, the
    scales and shifts of norm layers) without it, as is usual for AdamW; with
    ``decay_norms_biases`` one group, all decayed. Empty groups are left out.

    Use: ``torch.optim.AdamW(param_groups(model, 0.1), lr=3e-4)``.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    if decay_norms_biases:
        return [{"params": params, "weight_decay": weight_decay}]
    decay = [p for p in params if p.ndim >= 2]
    keep = [p for p in params if p.ndim < 2]
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {"params": keep, "weight_decay": 0.0},
    ]
    return [g for g in groups if g["params"]]


def wsd_factor(step: int, total_steps: int, decay: float = WSD_DECAY) -> float:
    """The ``wsd`` schedule's learning-rate factor at ``step``: 1 until the last ``decay`` of
    the steps, then down in a straight line to 0 at ``total_steps`` (warmup-stable-decay,
    without the warmup). The final weights are then taken at a small rate, so the run's last
    accuracy stops moving by a point with the noise of its last steps."""
    start = (1.0 - decay) * total_steps
    if step <= start or total_steps <= 0:
        return 1.0
    return max(0.0, (total_steps - step) / max(total_steps - start, 1.0))


def schedule_factor(schedule: str, step: int, total_steps: int) -> float:
    """The factor of ``schedule`` (``constant``, ``cosine``, ``step``, ``wsd``) at ``step`` of
    ``total_steps``."""
    if schedule == "cosine":
        return 0.5 * (1 + math.cos(math.pi * min(step, total_steps) / max(total_steps, 1)))
    if schedule == "wsd":
        return wsd_factor(step, total_steps)
    if schedule == "step":
        return float(0.1 ** (3 * step // max(total_steps, 1)))
    return 1.0


def lr_factor(schedule: str, step: int, total_steps: int, *, warmup: int = 0) -> float:
    """The learning rate's factor at global step ``step`` (from 0) of ``total_steps``.

    The first ``warmup`` steps rise in a straight line, step ``s`` at ``(s + 1) / warmup``
    (the last of them at the full rate); then ``schedule`` runs over the steps that remain,
    from its start: a cosine decays over ``total_steps - warmup`` steps, not over all of them.
    """
    if step < warmup:
        return (step + 1) / warmup
    return schedule_factor(schedule, step - warmup, max(total_steps - warmup, 0))


def make_optimizer(
    cfg: TrainConfig, model: nn.Module, total_steps: int
) -> tuple[torch.optim.Optimizer, Any]:
    """The optimizer ``cfg.optimizer`` over ``model``'s parameters, and its per-step
    learning-rate schedule (:func:`lr_factor` with ``cfg.warmup_steps``).

    ``weight_decay`` is L2 (added to the gradient) with ``sgd`` and ``adam`` and on every
    parameter; with ``adamw`` it is decoupled (the weights shrink by ``lr * weight_decay`` each
    step) and, unless ``decay_norms_biases``, biases and norm parameters are not decayed
    (:func:`param_groups`).
    """
    opt: torch.optim.Optimizer
    if cfg.optimizer == "sgd":
        opt = torch.optim.SGD(
            model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay
        )
    elif cfg.optimizer == "adamw":
        groups = param_groups(
            model, cfg.weight_decay, decay_norms_biases=cfg.decay_norms_biases
        )
        opt = torch.optim.AdamW(groups, lr=cfg.lr)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    schedule, warmup = cfg.lr_schedule, cfg.warmup_steps

    def factor(step: int) -> float:
        return lr_factor(schedule, step, total_steps, warmup=warmup)

    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)


class GradientClip:
    """Clips the gradients of every step of ``optimizer`` to a global L2 norm of at most
    ``max_norm`` (``torch.nn.utils.clip_grad_norm_``, in a step pre-hook).

    The hook runs inside ``optimizer.step()``, so it clips the gradient the optimizer steps
    on: under BSP the weighted average of every rank's gradient, after the allreduce, the same
    bytes on every rank (so every rank scales them alike and the replicas stay identical); on a
    local step (SelSync between syncs, FedAvg, local, SSP) this rank's own gradient.

    Args:
        optimizer: the optimizer whose steps are clipped.
        max_norm: the largest global norm of a step's gradients (positive).

    Attributes:
        norm: the last step's gradient norm before clipping (a 0-d tensor; ``nan`` before
            any step).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, max_norm: float) -> None:
        if not max_norm > 0:
            raise ValueError(f"max_norm must be positive, got {max_norm!r}")
        self.max_norm = float(max_norm)
        self.norm = torch.tensor(float("nan"))
        self._handle = optimizer.register_step_pre_hook(self._clip)

    def _clip(self, optimizer: torch.optim.Optimizer, *_: object) -> None:
        self.norm = clip_(
            (p for g in optimizer.param_groups for p in g["params"]), self.max_norm
        )

    def remove(self) -> None:
        """Detach the hook."""
        self._handle.remove()


def clip_(params: Iterable[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Scale the gradients of ``params`` in place so that their global L2 norm is at most
    ``max_norm``; returns the norm before (a 0-d tensor, no host sync)."""
    grads = [p for p in params if p.grad is not None]
    if not grads:
        return torch.tensor(0.0)
    return torch.nn.utils.clip_grad_norm_(grads, max_norm).detach()

