"""The outer optimizer of parameter averaging: DiLoCo's outer step on the averaged pseudo-gradient.

Between synchronisations each replica takes inner (local) steps from the common start
parameters ``theta_0``. At a synchronisation the replicas average their parameters to
``theta_bar``; the pseudo-gradient is ``delta = theta_0 - theta_bar`` and an outer optimizer
steps from ``theta_0`` with it (Douillard et al., DiLoCo, arXiv 2311.08105: Nesterov momentum,
outer lr 0.7, momentum 0.9). Outer SGD at lr 1 without momentum gives ``theta_bar`` itself: plain
averaging. The math is in :func:`outer_update`, tested without MPI; :class:`OuterOptimizer` keeps
the start parameters and the momentum of one replica.
"""

from __future__ import annotations

import math
from typing import Any

import torch

OUTER_KINDS: tuple[str, ...] = ("sgd", "nesterov")


def check_outer(kind: str, lr: float, momentum: float) -> None:
    """Raise ValueError naming the setting when the outer optimizer's settings are unusable."""
    if kind not in OUTER_KINDS:
        raise ValueError(f"outer_optimizer must be one of {list(OUTER_KINDS)}, got {kind!r}")
    if isinstance(lr, bool) or not isinstance(lr, int | float) or not math.isfinite(lr) or lr <= 0:
        raise ValueError(f"outer_lr must be a finite number > 0, got {lr!r}")
    if (
        isinstance(momentum, bool)
        or not isinstance(momentum, int | float)
        or not 0.0 <= momentum < 1.0
    ):
        raise ValueError(f"outer_momentum must be in [0, 1), got {momentum!r}")


def outer_update(
    start: list[torch.Tensor],
    averaged: list[torch.Tensor],
    momentum_buf: list[torch.Tensor] | None,
    *,
    lr: float,
    momentum: float,
    nesterov: bool,
) -> list[torch.Tensor]:
    """One outer step: the new parameters, from the start and averaged ones.

    With ``delta = start - averaged``: ``buf = momentum * buf + delta`` (when ``momentum`` > 0),
    the step direction is ``delta + momentum * buf`` (Nesterov) or ``buf``, and the result is
    ``start - lr * direction``, computed as ``averaged + (delta - lr * direction)`` so that lr 1
    without momentum returns ``averaged`` exactly. ``momentum_buf`` (same shapes) is updated in
    place; pass None when ``momentum`` is 0.
    """
    out = []
    for i, (s, a) in enumerate(zip(start, averaged, strict=True)):
        delta = s - a
        if momentum > 0.0:
            assert momentum_buf is not None
            buf = momentum_buf[i]
            buf.mul_(momentum).add_(delta)
            direction = delta + momentum * buf if nesterov else buf.clone()
        else:
            direction = delta
        if lr == 1.0 and momentum == 0.0:
            out.append(a.clone())  # exactly the average, not start - (start - average)
        else:
            out.append(a + (delta - lr * direction))
    return out


class OuterOptimizer:
    """The outer step of one replica, applied after every parameter average.

    Args:
        kind: ``"nesterov"`` (DiLoCo) or ``"sgd"`` (momentum without look-ahead; momentum 0 and
            lr 1 is plain averaging).
        lr: outer learning rate, finite and > 0; DiLoCo uses 0.7.
        momentum: outer momentum in [0, 1); default 0.5. DiLoCo uses 0.9 with rounds of 500
            inner steps; with rounds of 25 steps (MNIST-1D, 2 ranks) 0.9 ended 1.8 points
            below BSP and 0.5 0.5 points above (``benchmarks/bench_tta.py``).

    The parameters at the first :meth:`start` (equal on every rank) are the first start point;
    every :meth:`apply` moves the averaged parameters to the outer step's result, which becomes
    the next start point. Every rank computes the same result from the same averages.

    Raises:
        ValueError: a setting is out of range, naming it.
    """

    def __init__(self, kind: str = "nesterov", *, lr: float = 0.7, momentum: float = 0.5) -> None:
        check_outer(kind, lr, momentum)
        self.kind = kind
        self.lr = float(lr)
        self.momentum = float(momentum)
        self._start: list[torch.Tensor] | None = None
        self._buf: list[torch.Tensor] | None = None

    @staticmethod
    def _params(model: torch.nn.Module) -> list[torch.Tensor]:
        return [p.data for p in model.parameters()]

    def place(self, model: torch.nn.Module) -> None:
        """Move the held state to ``model``'s device (a checkpoint is loaded on the CPU, and a
        GPU run's outer step would otherwise mix devices)."""
        device = next(model.parameters()).device
        if self._start and self._start[0].device != device:
            self._start = [t.to(device) for t in self._start]
        if self._buf and self._buf[0].device != device:
            self._buf = [t.to(device) for t in self._buf]

    def start(self, model: torch.nn.Module) -> None:
        """Take ``model``'s parameters as the start point, unless one is held already."""
        self.place(model)
        if self._start is None:
            self._start = [t.detach().clone() for t in self._params(model)]
            if self.momentum > 0.0:
                self._buf = [torch.zeros_like(t) for t in self._start]

    @property
    def start_point(self) -> list[torch.Tensor] | None:
        """The parameters of the last outer step (the first: of the first :meth:`start`), the
        same on every rank; None before the first."""
        return self._start

    def apply(self, model: torch.nn.Module) -> None:
        """Replace ``model``'s just-averaged parameters by the outer step's result."""
        params = self._params(model)
        if self._start is None:
            self.start(model)
            return
        self.place(model)
        new = outer_update(
            self._start, params, self._buf, lr=self.lr, momentum=self.momentum,
            nesterov=self.kind == "nesterov",
        )  # fmt: skip
        with torch.no_grad():
            for p, n in zip(params, new, strict=True):
                p.copy_(n)
        self._start = [n.detach().clone() for n in new]

    def state_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "lr": self.lr,
            "momentum": self.momentum,
            "start": self._start,
            "buf": self._buf,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if (state["kind"], state["momentum"]) != (self.kind, self.momentum):
            raise ValueError(
                f"outer optimizer state was saved as {state['kind']} with momentum "
                f"{state['momentum']}, but this run uses {self.kind} with momentum "
                f"{self.momentum}; resume with the saved settings"
            )
        self._start = state["start"]
        self._buf = state["buf"]
