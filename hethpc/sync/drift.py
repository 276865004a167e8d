"""Drift correction for local steps: each replica moves, per step, as the average moved.

Between two parameter averages a replica trained on its own (label-skewed) data drifts toward
its own optimum. The average of a round shows where the replicas went together: a replica that
ended at ``y_k`` when the average was ``x`` moved ``x - y_k`` less than the others over the
round's ``K`` steps. In the next round it adds that drift per step, ``(x - y_k) / K`` plus the
correction it already applied (``y_k`` includes it), to its parameters at every step, so its
own steps plus the correction follow the average's path (the control variates of
SCAFFOLD, Karimireddy et al., ICML 2020, taken in parameter space: any optimizer, no extra
communication). Weighted by the same shares as the average, the corrections sum to zero, so the
averaged model's path is unchanged; only the replicas' spread shrinks.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch


def correction(before: torch.Tensor, after: torch.Tensor, steps: int) -> torch.Tensor:
    """The per-step correction of one tensor: ``(after - before) / steps``.

    Args:
        before: the replica's tensor just before the average (``y_k``).
        after: the averaged tensor (``x``).
        steps: the steps the replica took since the previous average (at least 1).
    """
    if steps < 1:
        raise ValueError(f"a round has at least one step, got {steps}")
    return (after - before) / float(steps)


class DriftCorrection:
    """The per-step corrections of one replica (one tensor per parameter).

    Call :meth:`apply` once per training step, :meth:`begin` just before a parameter average
    (it keeps the replica's parameters) and :meth:`end` just after it, before any outer step.

    Args:
        smoothing: the weight of the newest round in an exponential average of the rounds'
            corrections, in ``(0, 1]``; 1 (default) uses the last round alone.
    """

    def __init__(self, smoothing: float = 1.0) -> None:
        if not 0.0 < smoothing <= 1.0:
            raise ValueError(f"drift smoothing must lie in (0, 1], got {smoothing!r}")
        self.smoothing = float(smoothing)
        self.drift: list[torch.Tensor] | None = None  # added to the parameters every step
        self.steps = 0  # steps since the last average
        self._before: list[torch.Tensor] | None = None

    @torch.no_grad()
    def apply(self, params: Sequence[torch.Tensor]) -> None:
        """Count one step and add the corrections to ``params`` (nothing before the first
        average)."""
        self.steps += 1
        if self.drift is None:
            return
        params = list(params)
        if self.drift[0].device != params[0].device:  # restored from a checkpoint on the CPU
            pairs = zip(self.drift, params, strict=True)
            self.drift = [d.to(device=p.device, dtype=p.dtype) for d, p in pairs]
        torch._foreach_add_(params, self.drift)

    @torch.no_grad()
    def begin(self, params: Iterable[torch.Tensor]) -> None:
        """Keep the replica's parameters before the average."""
        self._before = [p.detach().clone() for p in params]

    @torch.no_grad()
    def end(self, params: Sequence[torch.Tensor]) -> None:
        """Turn the round into the next round's corrections (after the average)."""
        before, self._before = self._before, None
        if before is None or self.steps == 0:
            self.steps = 0
            return
        new = [correction(b, p.detach(), self.steps) for b, p in zip(before, params, strict=True)]
        if self.drift is not None:
            # ``before`` includes this round's corrections: what is left adds to them, so
            # ``new`` is the round's own drift, as if uncorrected.
            torch._foreach_add_(new, self.drift)
        if self.drift is None or self.smoothing == 1.0:
            self.drift = new
        else:
            torch._foreach_lerp_(self.drift, new, self.smoothing)
        self.steps = 0

    def state_dict(self) -> dict[str, Any]:
        """The corrections and the step count, for an exact resume."""
        return {
            "drift": None if self.drift is None else [d.cpu() for d in self.drift],
            "steps": self.steps,
            "smoothing": self.smoothing,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` (moved to the parameters' device at the next step)."""
        drift = state["drift"]
        self.drift = None if drift is None else [d.clone() for d in drift]
        self.steps = int(state["steps"])
