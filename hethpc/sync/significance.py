"""Significance tracking for SelSync: gradient norms, a windowed EWMA, relative change, the vote."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

import torch

NormKind = Literal["global", "layer_sum"]
NORM_KINDS: tuple[str, ...] = ("global", "layer_sum")
Smoothing = Literal["norm", "delta"]
SMOOTHINGS: tuple[str, ...] = ("norm", "delta")


def gradient_norm(parameters: Iterable[torch.nn.Parameter], *, kind: NormKind = "global") -> float:
    """The L2 norm of the local gradient, as a Python float.

    Args:
        parameters: the model's parameters; those without a gradient are skipped.
        kind: ``"global"``: the L2 norm of all gradients as one vector,
            ``sqrt(sum_l ||g_l||^2)``; ``"layer_sum"``: the sum of per-tensor L2 norms,
            ``sum_l ||g_l||`` (what the published SelSync code computes).

    Returns:
        The norm (0.0 when no parameter has a gradient; ``inf``/``nan`` when a gradient is).

    Raises:
        ValueError: ``kind`` is not one of ``"global"``, ``"layer_sum"``.
    """
    if kind not in NORM_KINDS:
        raise ValueError(f"norm kind must be one of {list(NORM_KINDS)}, got {kind!r}")
    grads = [p.grad.detach() for p in parameters if p.grad is not None]
    if not grads:
        return 0.0
    norms = torch.stack([torch.linalg.vector_norm(g, dtype=torch.float64) for g in grads])
    if kind == "global":
        return float(torch.linalg.vector_norm(norms))
    return float(norms.sum())


@dataclass(frozen=True)
class Significance:
    """One step's outcome of :meth:`SignificanceTracker.update`.

    Attributes:
        norm: the gradient norm that was observed.
        smoothed: the EWMA ``S_t`` after this observation.
        delta: ``|S_t - S_(t-1)| / S_(t-1)``; ``nan`` on the first observation (no ``S_(t-1)``),
            ``inf`` when ``S_(t-1) == 0 < S_t`` or the norm is not finite.
        warmup: whether the window was not yet full (fewer than ``window`` observations).
        vote: whether this rank votes to synchronise: ``warmup or delta >= threshold``.
    """

    norm: float
    smoothed: float
    delta: float
    warmup: bool
    vote: bool


class SignificanceTracker:
    """Decides, from the local gradient norms alone, whether a step is significant.

    The norms ``g_t`` are smoothed by an exponentially weighted moving average whose span is
    ``window`` steps (the pandas ``span`` convention): ``S_1 = g_1`` and
    ``S_t = a * g_t + (1 - a) * S_(t-1)`` with ``a = 2 / (window + 1)``. The relative change is
    ``delta_t = |S_t - S_(t-1)| / S_(t-1)`` and the rank votes to synchronise when
    ``delta_t >= threshold``.

    Specified edge cases:

    - **Warm-up**: while fewer than ``window`` norms have been observed (steps ``1..window``),
      the vote is always yes: early training changes fast, and the EWMA is not yet meaningful.
    - **Zero denominator**: ``S_(t-1) == 0`` gives ``delta = 0`` when ``S_t == 0`` (nothing
      changed) and ``delta = inf`` (vote yes) otherwise.
    - **Non-finite norm** (``inf``/``nan``, e.g. an overflowing gradient): the vote is yes with
      ``delta = inf``, and the norm is NOT folded into the EWMA, so ``S`` stays finite and later
      steps are judged against the last finite history. It does count towards the warm-up.
      ``S`` is therefore always finite, and a non-finite denominator cannot occur.
    - ``threshold == 0`` votes yes on every step (plain synchronous training).

    ``smoothing="delta"`` is the variant of the published SelSync code: the relative change of
    the RAW norms, ``r_t = |g_t - g_(t-1)| / g_(t-1)``, is smoothed instead (``D_t``, same
    EWMA), and the vote is ``warmup or D_t >= threshold``; :attr:`Significance.delta` is then
    ``D_t``. A non-finite ``r_t`` votes yes and is not folded into ``D``.

    Args:
        threshold: the relative change that makes a step significant; finite, ``>= 0``.
            Default 0.3 (the paper uses 0.3 and 0.5).
        window: the EWMA span and the warm-up length, in steps; ``>= 1``. Default 25.
        smoothing: ``"norm"`` (default: the method as specified) or ``"delta"`` (the
            published code).

    Raises:
        ValueError: ``threshold``, ``window`` or ``smoothing`` is out of range.
    """

    def __init__(
        self, *, threshold: float = 0.3, window: int = 25, smoothing: Smoothing = "norm"
    ) -> None:
        if smoothing not in SMOOTHINGS:
            raise ValueError(f"smoothing must be one of {list(SMOOTHINGS)}, got {smoothing!r}")
        threshold = float(threshold)
        if not math.isfinite(threshold) or threshold < 0:
            raise ValueError(f"threshold must be a finite number >= 0, got {threshold}")
        if isinstance(window, bool) or int(window) != window or window < 1:
            raise ValueError(f"window must be an integer >= 1 (steps), got {window!r}")
        self.threshold = threshold
        self.window = int(window)
        self.alpha = 2.0 / (self.window + 1)
        self._count = 0  # observations so far, finite or not
        self._smoothed: float | None = None  # S_t; None before the first finite norm
        self.smoothing: Smoothing = smoothing
        self._last: float | None = None  # g_(t-1), the last finite norm ("delta" smoothing)
        self._delta: float | None = None  # D_t ("delta" smoothing)

    @property
    def count(self) -> int:
        """Number of norms observed so far."""
        return self._count

    @property
    def smoothed(self) -> float:
        """The current EWMA ``S_t`` (``nan`` before the first finite norm)."""
        return math.nan if self._smoothed is None else self._smoothed

    def update(self, norm: float) -> Significance:
        """Fold in this step's gradient norm and return the vote.

        Raises:
            ValueError: ``norm`` is negative.
        """
        norm = float(norm)
        if norm < 0:
            raise ValueError(f"a gradient norm cannot be negative, got {norm}")
        self._count += 1
        warmup = self._count <= self.window
        prev = self._smoothed
        if not math.isfinite(norm):
            return Significance(norm, self.smoothed, math.inf, warmup, True)
        cur = norm if prev is None else self.alpha * norm + (1.0 - self.alpha) * prev
        self._smoothed = cur
        if self.smoothing == "norm":
            delta = relative_change(prev, cur)
            return Significance(norm, cur, delta, warmup, warmup or delta >= self.threshold)
        raw = relative_change(self._last, norm)
        self._last = norm
        if math.isinf(raw):
            return Significance(norm, cur, math.inf, warmup, True)
        if not math.isnan(raw):
            d = self._delta
            self._delta = raw if d is None else self.alpha * raw + (1.0 - self.alpha) * d
        delta = math.nan if self._delta is None else self._delta
        return Significance(norm, cur, delta, warmup, warmup or delta >= self.threshold)

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to decide as the uninterrupted tracker would."""
        return {
            "threshold": self.threshold,
            "window": self.window,
            "count": self._count,
            "smoothed": self._smoothed,
            "smoothing": self.smoothing,
            "last": self._last,
            "delta": self._delta,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict`.

        Raises:
            ValueError: the state was saved with another threshold or window, or is corrupt.
        """
        if (float(state["threshold"]), int(state["window"])) != (self.threshold, self.window):
            raise ValueError(
                f"tracker state was saved with threshold={state['threshold']}, "
                f"window={state['window']}, but this tracker has threshold={self.threshold}, "
                f"window={self.window}; build the tracker with the saved settings"
            )
        count, smoothed = int(state["count"]), state["smoothed"]
        if count < 0 or (smoothed is not None and not (math.isfinite(smoothed) and smoothed >= 0)):
            raise ValueError(f"corrupt tracker state: count={count}, smoothed={smoothed}")
        if state.get("smoothing", "norm") != self.smoothing:
            raise ValueError(
                f"tracker state was saved with smoothing={state.get('smoothing')!r}, but this "
                f"tracker has smoothing={self.smoothing!r}; build it with the saved setting"
            )
        self._count = count
        self._smoothed = None if smoothed is None else float(smoothed)
        self._last = None if state.get("last") is None else float(state["last"])
        self._delta = None if state.get("delta") is None else float(state["delta"])


def relative_change(previous: float | None, current: float) -> float:
    """``|current - previous| / previous`` with the tracker's conventions.

    ``nan`` when there is no previous value; for ``previous == 0``: 0 if ``current == 0``,
    else ``inf``.
    """
    if previous is None:
        return math.nan
    if previous == 0.0:
        return 0.0 if current == 0.0 else math.inf
    return abs(current - previous) / previous
