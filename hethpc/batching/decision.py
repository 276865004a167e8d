"""One control decision: new sizes from the gathered per-sample times, and the dead-band."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from hethpc.batching.allocation import Bound, allocate, max_relative_change


@dataclass(frozen=True)
class Adjustment:
    """One control decision, taken identically on every rank.

    Attributes:
        step: the step after which the decision was taken.
        times: per-rank smoothed compute seconds per step at the sizes in force (NaN where a rank
            had no valid measurement).
        throughputs: per-rank samples per second (``old_sizes[k] / times[k]``).
        old_sizes: the sizes in force during the interval.
        new_sizes: the sizes proposed by :func:`allocate` (equal to ``old_sizes`` when no
            proposal could be made).
        change: the largest relative change between ``old_sizes`` and ``new_sizes``.
        applied: whether ``new_sizes`` were adopted.
        reason: ``"adopted"``, ``"probe"`` (first sizes after the probe, adopted whatever the
            change), ``"dead-band"`` (held: change too small, relatively or in samples),
            ``"unchanged"``, or
            ``"invalid time: ..."`` (held: some rank reported no finite positive time).
    """

    step: int
    times: tuple[float, ...]
    throughputs: tuple[float, ...]
    old_sizes: tuple[int, ...]
    new_sizes: tuple[int, ...]
    change: float
    applied: bool
    reason: str

    def as_dict(self) -> dict[str, Any]:
        """A plain dict (lists, floats) for JSON metrics and checkpoints."""
        d = asdict(self)
        for k in ("times", "throughputs", "old_sizes", "new_sizes"):
            d[k] = list(d[k])
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Adjustment:
        """The inverse of :meth:`as_dict`."""
        return cls(
            step=int(d["step"]),
            times=tuple(float(v) for v in d["times"]),
            throughputs=tuple(float(v) for v in d["throughputs"]),
            old_sizes=tuple(int(v) for v in d["old_sizes"]),
            new_sizes=tuple(int(v) for v in d["new_sizes"]),
            change=float(d["change"]),
            applied=bool(d["applied"]),
            reason=str(d["reason"]),
        )


def decide(
    step: int,
    old_sizes: Sequence[int] | np.ndarray,
    per_sample_s: Sequence[float] | np.ndarray,
    *,
    global_batch: int,
    deadband: float = 0.05,
    b_min: Bound = 1,
    b_max: Bound = None,
    min_change: int = 1,
    force: bool = False,
) -> Adjustment:
    """The decision every rank takes from the same gathered measurements (no communication).

    Args:
        step: the step after which the decision is taken.
        old_sizes: the per-rank sizes in force.
        per_sample_s: per-rank smoothed compute seconds per sample (NaN: no measurement).
        global_batch: B.
        deadband: adopt only when the largest relative change exceeds this.
        b_min: lower bound(s) for :func:`allocate`.
        b_max: upper bound(s) for :func:`allocate`.
        min_change: also hold unless some rank's size moves by more than this many samples:
            a one-sample move is rounding noise, yet on a rank holding 15 samples it is 6.7 %,
            outside a 5 % dead-band, and would make small ranks oscillate. 0 disables it.
        force: adopt the proposal whatever its change (the decision after a probe).

    Returns:
        The record; ``applied`` says whether ``new_sizes`` replace ``old_sizes``. When a rank's
        time is not finite and positive the sizes are kept (a safe fallback, the same on every
        rank) and ``reason`` names the rank.
    """
    old = tuple(int(v) for v in np.asarray(old_sizes).reshape(-1))
    per = [float(v) for v in np.asarray(per_sample_s, dtype=np.float64).reshape(-1)]
    if len(per) != len(old):
        raise ValueError(f"got {len(per)} per-sample times for {len(old)} sizes")
    times = tuple(p * b for p, b in zip(per, old, strict=True))
    bad = [k for k, p in enumerate(per) if not (math.isfinite(p) and p > 0)]
    if bad:
        return Adjustment(
            step, times, tuple(math.nan for _ in old), old, old, 0.0, False,
            "invalid time: rank(s) " + ", ".join(f"{k} ({per[k]})" for k in bad)
            + " had no finite positive compute time; sizes kept",
        )
    proposal = allocate(global_batch, [1.0 / p for p in per], b_min=b_min, b_max=b_max)
    new = tuple(int(v) for v in proposal)
    change = max_relative_change(old, new)
    moved = max(abs(a - b) for a, b in zip(old, new, strict=True))
    if force:
        applied, reason = True, "probe"
    elif change > deadband and moved > min_change:
        applied, reason = True, "adopted"
    else:
        applied, reason = False, "dead-band" if change > 0 else "unchanged"
    throughputs = tuple(b / t for b, t in zip(old, times, strict=True))
    return Adjustment(step, times, throughputs, old, new, change, applied, reason)
