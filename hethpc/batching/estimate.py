"""A rank's robust per-sample compute time: trimmed mean over a window, its noise, and resets."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

_LEARN_STEPS = 20  # a window at least this long measures the noise level well enough
# A change in speed must clear z + this many standard errors: the window it keeps is then the
# one that looked extreme, so the test must rarely pass on noise alone (several windows are
# tested at every report).
_CHANGE_MARGIN = 1.5
_MIN_STEPS = 5  # steps at a size before its time is used for the elasticity
_ELASTICITY_SPAN = 0.1  # sizes closer than this (log ratio) say too little about it
_ELASTICITY_SE = 0.15  # its largest standard error to be used
_ELASTICITY_MIN = 0.3


@dataclass(frozen=True)
class Estimate:
    """A rank's per-sample compute time as reported at a control decision.

    Attributes:
        per_sample_s: seconds per sample (the exponential of the trimmed mean of the log
            per-sample times in the window); NaN when the window is empty.
        rel_se: the relative standard error of ``per_sample_s`` (0 without noise; NaN when
            the window is empty).
        steps: steps in the window.
        elasticity: ``d log(step time) / d log(batch)`` learned from the last two sizes (1:
            time proportional to the batch; less when a step has a fixed cost).
    """

    per_sample_s: float
    rel_se: float
    steps: int
    elasticity: float = 1.0


def trimmed_log_mean(values: list[float], trim: float) -> tuple[float, float]:
    """Trimmed mean of ``log(values)`` and its standard error (from the winsorised spread).

    ``floor(trim * n)`` values are dropped at each end, so isolated spikes (a descheduled step)
    do not move the estimate, while for plain noise it is nearly as precise as the mean.

    Args:
        values: positive numbers (at least one).
        trim: the fraction dropped at each end, in [0, 0.5).

    Returns:
        ``(mean, se)`` in log space; ``se`` is 0 for fewer than two values.
    """
    logs = sorted(math.log(v) for v in values)
    n = len(logs)
    g = int(trim * n)
    kept = logs[g : n - g]
    mean = math.fsum(kept) / len(kept)
    if n < 2:
        return mean, 0.0
    wins = [logs[g]] * g + kept + [logs[n - g - 1]] * g
    wmean = math.fsum(wins) / n
    var = math.fsum((v - wmean) ** 2 for v in wins) / (n - 1)
    return mean, math.sqrt(var) / ((1 - 2 * g / n) * math.sqrt(n))


class TimeEstimator:
    """One rank's per-sample compute time at the sizes in force, robust to timing noise.

    Keeps the per-sample times of up to ``window`` recent steps (all at the current batch size:
    :meth:`reset` when the sizes change). At a decision, :meth:`report` first compares the steps
    since the previous decision with the older ones; when they differ by more than ``z``
    standard errors (and more than ``floor``), the speed has really changed and the older steps
    are dropped, so the next allocation follows the change within one interval. Otherwise the
    window keeps growing and the estimate gets more precise, which lets the decision rule hold
    still against noise yet still correct small imbalances once they are significant. The
    comparison is repeated with the last 2, 4, ... reports' steps, so a moderate change that one
    interval cannot show is found once enough steps have seen it. A change must clear ``z + 1.5``
    standard errors (the kept steps are then the ones that looked extreme, so a false alarm
    would feed the decision an outlier).

    Args:
        window: most steps kept (>= 1).
        trim: fraction of the window dropped at each end of the sorted times (spikes).
        z: standard errors that make a difference significant (the decision's ``z``).
        floor: smallest relative change in speed that counts as a change.
    """

    def __init__(
        self, *, window: int = 200, trim: float = 0.2, z: float = 3.0, floor: float = 0.05
    ) -> None:
        self.window = int(window)
        self.trim = float(trim)
        self.z = float(z)
        self.floor = float(floor)
        self.change_z = self.z + _CHANGE_MARGIN
        self._times: list[float] = []  # per-sample seconds, oldest first
        self._fresh = 0  # of which added since the last report
        self._noise = 0.0  # standard error of one step, last measured on a long window
        self._batch = 0  # the batch size of the window's steps
        self._last: tuple[int, float, float] | None = None  # (batch, log mean, se) last report
        self._prev: tuple[int, float, float] | None = None  # the same at the previous size
        self._elasticity = 1.0

    def add(self, batch: int, seconds: float) -> bool:
        """Fold in one step; returns False (and ignores it) unless ``seconds`` is finite and
        positive and ``batch`` >= 1."""
        if not (math.isfinite(seconds) and seconds > 0 and batch >= 1):
            return False
        self._times.append(seconds / batch)
        self._batch = int(batch)
        self._fresh += 1
        if len(self._times) > self.window:
            del self._times[0]
        return True

    def reset(self) -> None:
        """Forget the window (the batch size changed). The noise level and the elasticity are
        kept, and the last report's estimate is kept as the previous size's, to learn the
        elasticity from."""
        self._times = []
        self._fresh = 0
        self._prev, self._last = self._last, None

    def _stats(self, values: list[float]) -> tuple[float, float]:
        """Log-space mean and a conservative standard error of ``values``.

        The spread measured on few steps is itself uncertain, so the error is widened as a
        Student t quantile is (``1 + (z^2 + 1) / (4 df)``, its first-order expansion), and is
        never below what the noise level last measured on a long window predicts for this many
        steps.
        """
        mean, se = trimmed_log_mean(values, self.trim)
        n = len(values)
        df = max(1, n - 2 * int(self.trim * n) - 1)
        se *= 1 + (self.z**2 + 1) / (4 * df)
        if n >= _LEARN_STEPS:
            self._noise = se * math.sqrt(n)
        return mean, max(se, self._noise / math.sqrt(n))

    def change_cut(self) -> int:
        """How many of the most recent steps to keep because the speed changed before them
        (0: no significant change, keep the whole window). Does not modify the window.

        The steps of the last 1, 2, 4, ... reports are compared with the steps before them: a
        large change shows at once, a moderate one once enough steps have seen it.
        """
        recent = min(self._fresh, len(self._times))
        while 0 < recent < len(self._times):
            old_mean, old_se = self._stats(self._times[:-recent])
            new_mean, new_se = self._stats(self._times[-recent:])
            gap = abs(new_mean - old_mean)
            if gap > max(math.log1p(self.floor), self.change_z * math.hypot(old_se, new_se)):
                return recent
            recent *= 2
        return 0

    def report(self, keep: int | None = None) -> Estimate:
        """The estimate for a decision, after dropping the older steps on a change.

        Args:
            keep: the most recent steps to keep (0: all) when the ranks agreed on a common cut
                (:func:`common_cut` of their :meth:`change_cut`), so that every rank's window
                covers the same steps and a speed change common to all ranks (the host slowing
                down) cancels in the allocation; None: this estimator's own :meth:`change_cut`.
        """
        cut = self.change_cut() if keep is None else int(keep)
        self._fresh = 0
        if 0 < cut < len(self._times):
            self._times = self._times[-cut:]
            self._prev = None  # the speed changed: the previous size's time is stale
        if not self._times:
            return Estimate(math.nan, math.nan, 0, self._elasticity)
        mean, se = self._stats(self._times)
        self._last = (self._batch, mean, se)
        self._learn_elasticity(mean, se)
        return Estimate(math.exp(mean), se, len(self._times), self._elasticity)

    def _learn_elasticity(self, mean: float, se: float) -> None:
        """Update the elasticity from this size's and the previous size's per-sample times.

        ``t = p * b``, so ``e = 1 + d log p / d log b``. It is kept only when precise (error
        below ``_ELASTICITY_SE``) and clamped to ``[_ELASTICITY_MIN, 1]``; a slowdown that
        stretches the whole step keeps it, so it carries over speed changes.
        """
        if self._prev is None or len(self._times) < _MIN_STEPS:
            return
        b0, mean0, se0 = self._prev
        span = math.log(self._batch / b0) if b0 > 0 and self._batch > 0 else 0.0
        if abs(span) < _ELASTICITY_SPAN:
            return
        if math.hypot(se, se0) / abs(span) > _ELASTICITY_SE:
            return
        e = 1 + (mean - mean0) / span
        self._elasticity = min(1.0, max(_ELASTICITY_MIN, e))

    def state_dict(self) -> dict[str, Any]:
        """The window and noise level (JSON-ready)."""
        return {
            "times": list(self._times),
            "fresh": self._fresh,
            "noise": self._noise,
            "batch": self._batch,
            "last": None if self._last is None else list(self._last),
            "prev": None if self._prev is None else list(self._prev),
            "elasticity": self._elasticity,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output."""
        self._times = [float(v) for v in state["times"]][-self.window :]
        self._fresh = int(state["fresh"])
        self._noise = float(state["noise"])
        self._batch = int(state["batch"])
        self._last = None if state["last"] is None else _triple(state["last"])
        self._prev = None if state["prev"] is None else _triple(state["prev"])
        self._elasticity = float(state["elasticity"])


def common_cut(cuts: list[int] | tuple[int, ...]) -> int:
    """The window cut every rank applies: the shortest of the ranks' detected cuts (so the
    window holds no step from before any rank's change), or 0 when no rank detected one.

    Args:
        cuts: each rank's :meth:`TimeEstimator.change_cut` (0: none).
    """
    detected = [int(c) for c in cuts if int(c) > 0]
    return min(detected) if detected else 0


def _triple(v: list[Any]) -> tuple[int, float, float]:
    return int(v[0]), float(v[1]), float(v[2])
