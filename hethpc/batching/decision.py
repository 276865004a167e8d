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
            ``"noise"`` (held: outside the dead-band but within the measurement noise),
            ``"unchanged"``, or
            ``"invalid time: ..."`` (held: some rank reported no finite positive time).
        bands: per-rank noise bands: ``z`` times the relative standard error of the proposed
            size; a rank's move, less one sample of rounding, must exceed it (empty: no noise
            figures were given).
        elasticities: per-rank ``d log(step time) / d log(batch)`` the proposal assumed (empty:
            all 1, time proportional to the batch).
    """

    step: int
    times: tuple[float, ...]
    throughputs: tuple[float, ...]
    old_sizes: tuple[int, ...]
    new_sizes: tuple[int, ...]
    change: float
    applied: bool
    reason: str
    bands: tuple[float, ...] = ()
    elasticities: tuple[float, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """A plain dict (lists, floats) for JSON metrics and checkpoints."""
        d = asdict(self)
        for k in ("times", "throughputs", "old_sizes", "new_sizes", "bands", "elasticities"):
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
            bands=tuple(float(v) for v in d.get("bands", ())),
            elasticities=tuple(float(v) for v in d.get("elasticities", ())),
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
    rel_se: Sequence[float] | np.ndarray | None = None,
    z: float = 3.0,
    elasticity: Sequence[float] | np.ndarray | None = None,
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
        rel_se: per-rank relative standard errors of ``per_sample_s`` (None: exact times). A
            rank's proposed size then moves only when its relative change, less the one sample
            that rounding may add, also exceeds ``z`` standard errors of that size,
            ``sqrt((1-s_k)^2 e_k^2 + sum_{j!=k} s_j^2 e_j^2)`` with ``s`` the proposed shares:
            noise alone then almost never moves the sizes, and a small real imbalance is
            corrected once the growing windows make it significant.
        z: standard errors a size change must exceed (with ``rel_se``).
        elasticity: per-rank ``d log(step time) / d log(batch)`` in (0, 1] (None: all 1, time
            proportional to the batch). With a fixed cost per step a rank's time changes less
            than its batch, and sizes proportional to throughput under-correct; the proposal
            is then the split ``b_k (T / t_k)^(1/e_k)`` with the common step time ``T`` that
            sums to B (then bounded and rounded by :func:`allocate`), which balances in one
            adjustment instead of several.
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
            step,
            times,
            tuple(math.nan for _ in old),
            old,
            old,
            0.0,
            False,
            "invalid time: rank(s) "
            + ", ".join(f"{k} ({per[k]})" for k in bad)
            + " had no finite positive compute time; sizes kept",
        )
    weights = _targets(old, times, elasticity)
    proposal = allocate(global_batch, weights, b_min=b_min, b_max=b_max)
    new = tuple(int(v) for v in proposal)
    change = max_relative_change(old, new)
    if rel_se is not None and elasticity is not None:  # a target moves by se / e
        rel_se = [
            float(a) / float(e)
            for a, e in zip(
                np.asarray(rel_se).reshape(-1), np.asarray(elasticity).reshape(-1), strict=True
            )
        ]
    bands = _bands(new, rel_se, deadband, z)
    rel = [abs(q - p) / p for p, q in zip(old, new, strict=True)]
    moved = [abs(q - p) > min_change for p, q in zip(old, new, strict=True)]
    beyond_band = [m and r > deadband for m, r in zip(moved, rel, strict=True)]
    # Rounding moves a size by up to one sample: the real-valued proposal must clear the noise.
    beyond_noise = beyond_band
    if bands:
        beyond_noise = [
            c and (abs(q - p) - 1) / p > e
            for c, p, q, e in zip(beyond_band, old, new, bands, strict=True)
        ]
    if force:
        applied, reason = True, "probe"
    elif any(beyond_noise):
        applied, reason = True, "adopted"
    elif change == 0:
        applied, reason = False, "unchanged"
    elif any(beyond_band):
        applied, reason = False, "noise"
    else:
        applied, reason = False, "dead-band"
    throughputs = tuple(b / t for b, t in zip(old, times, strict=True))
    used = () if elasticity is None else tuple(float(v) for v in np.asarray(elasticity).ravel())
    return Adjustment(step, times, throughputs, old, new, change, applied, reason, bands, used)


def _targets(
    old: tuple[int, ...], times: tuple[float, ...], elasticity: Sequence[float] | np.ndarray | None
) -> list[float]:
    """Real sizes ``b_k (T / t_k)^(1/e_k)`` whose sum is ``sum(old)`` (plain throughputs when
    every elasticity is 1)."""
    if elasticity is None:
        return [b / t for b, t in zip(old, times, strict=True)]
    e = [float(v) for v in np.asarray(elasticity, dtype=np.float64).reshape(-1)]
    if len(e) != len(old) or not all(math.isfinite(v) and 0 < v <= 1 for v in e):
        raise ValueError(f"elasticity must be {len(old)} numbers in (0, 1], got {e}")
    if all(v == 1.0 for v in e):
        return [b / t for b, t in zip(old, times, strict=True)]
    B = sum(old)

    def total(log_T: float) -> float:
        return math.fsum(
            b * math.exp((log_T - math.log(t)) / ek) for b, t, ek in zip(old, times, e, strict=True)
        )

    lo, hi = math.log(min(times)), math.log(max(times))  # total(lo) <= B <= total(hi)
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if total(mid) < B else (lo, mid)
    log_T = 0.5 * (lo + hi)
    return [
        b * math.exp((log_T - math.log(t)) / ek) for b, t, ek in zip(old, times, e, strict=True)
    ]


def _bands(
    new: tuple[int, ...], rel_se: Sequence[float] | np.ndarray | None, deadband: float, z: float
) -> tuple[float, ...]:
    """Per-rank noise band: ``z`` standard errors of the proposed size, relative."""
    if rel_se is None:
        return ()
    e = [float(v) for v in np.asarray(rel_se, dtype=np.float64).reshape(-1)]
    if len(e) != len(new) or not all(math.isfinite(v) and v >= 0 for v in e):
        raise ValueError(f"rel_se must be {len(new)} finite numbers >= 0, got {e}")
    total = sum(new)
    s = [b / total for b in new]
    out = []
    for k in range(len(new)):
        var = ((1 - s[k]) * e[k]) ** 2 + math.fsum(
            (s[j] * e[j]) ** 2 for j in range(len(new)) if j != k
        )
        out.append(z * math.sqrt(var))
    return tuple(out)
