"""The batch controller: times each rank's compute and resizes batches in proportion to speed.

One class: its constructor checks every setting alike on every rank (the control settings are
documented in ``settings``, the decision in ``decision``, the estimate in ``estimate``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from hethpc import comm
from hethpc.batching.allocation import Bound, allocate
from hethpc.batching.decision import Adjustment
from hethpc.batching.errors import BatchingError
from hethpc.batching.estimate import common_cut
from hethpc.batching.settings import ControlSettings
from hethpc.batching.slowdown import STRETCH_MODES, Slowdown, SlowdownSchedule, stretch

MODES = ("dynamic", "static", "uniform")


class BatchController:
    """Per-rank batch sizes that track each rank's measured compute throughput.

    Every rank times its own compute (forward + backward: start a clock before the forward and
    call :meth:`timer_stop` after the backward) and keeps a robust estimate of its per-sample
    time at the current size (:class:`TimeEstimator`: a trimmed mean over a window that grows
    while the speed is steady and restarts, on every rank at the same step, when some rank's
    speed changes significantly). Every ``interval`` steps the ranks allgather ``(b_k, t_k,
    standard error)`` through mpi4py and all compute the same sizes, proportional to
    throughput, summing to ``global_batch``; they adopt them when a rank's size moves by more
    than the dead-band, by more than ``noise_z`` standard errors and by more than
    ``min_change`` samples (:func:`decide`). Create it on every rank of ``group`` at the same
    point and call :meth:`update` on every rank every step.

    Args:
        global_batch: B, the samples of one step over the group; never changes.
        mode: ``"dynamic"`` (resize on measurements), ``"static"`` (fixed sizes from
            ``weights``) or ``"uniform"`` (equal sizes).
        weights: per-rank weights (e.g. core counts) for the first sizes (dynamic) or the fixed
            sizes (static); None for equal sizes.
        settings: how the sizes are measured, decided and bounded (:class:`ControlSettings`,
            whose fields document their defaults; ``interval`` applies to mode dynamic); None
            for the defaults. The job and the simulator use the same object.
        probe_steps: if > 0, the first decision comes after this many steps (at the start
            sizes) and is adopted whatever its change; then every ``interval`` steps.
        slowdown: emulated heterogeneity applied in :meth:`timer_stop`: a
            :class:`SlowdownSchedule`, its ``"rank:factor@step"`` spec, or None.
        slowdown_mode: how a slowed rank spends its extra time: ``"sleep"`` (frees its core)
            or ``"busy"`` computing, its core occupied as a slower processor's would be (see
            :func:`~hethpc.batching.slowdown.stretch`; with more ranks than cores a busy rank takes
            time from the others).
        device: the compute device; on CUDA :meth:`timer_stop` synchronises it first.
        group: the data-parallel ranks sharing the global batch (default: the world).

    Raises:
        BatchingError: a setting is out of range, or the ranks were given different settings
            (raised on every rank).
        AllocationError: the global batch cannot be split within the bounds.
    """

    def __init__(
        self,
        global_batch: int,
        *,
        mode: str = "dynamic",
        weights: Sequence[float] | np.ndarray | None = None,
        settings: ControlSettings | None = None,
        probe_steps: int = 0,
        slowdown: SlowdownSchedule | str | Sequence[Slowdown] | None = None,
        slowdown_mode: str = "sleep",
        device: torch.device | str | None = None,
        group: comm.Group | None = None,
    ) -> None:
        self.settings = ControlSettings() if settings is None else settings
        b_min, b_max = self.settings.b_min, self.settings.b_max
        self._group = comm.world() if group is None else group
        self._rank = self._group.rank
        self._n = self._group.size
        self._slowdown = SlowdownSchedule.of(slowdown)
        self.slowdown_mode = slowdown_mode
        self._device = torch.device(device) if device is not None else None
        self.global_batch = int(global_batch)
        self.mode = mode
        self.probe_steps = int(probe_steps)
        given = (
            self.global_batch,
            mode,
            None if weights is None else [float(w) for w in weights],
            self.settings.interval,
            self.settings.deadband,
            self.settings.min_change,
            self.settings.window,
            self.settings.noise_z,
            self.settings.trim,
            _plain(b_min),
            _plain(b_max),
            self.probe_steps,
            self._slowdown.spec,
            slowdown_mode,
        )
        # Decide on gathered settings so that a mismatch raises the same error on every rank.
        seen = comm.allgather_object(repr(given), group=self._group)
        if any(s != seen[0] for s in seen):
            differ = [k for k, s in enumerate(seen) if s != seen[0]]
            raise BatchingError(
                f"BatchController settings differ between ranks: rank(s) {differ} were given "
                f"{[seen[k] for k in differ]} but rank 0 {seen[0]}; pass the same settings on "
                "every rank"
            )
        # Validated after the comparison: equal settings fail alike on every rank.
        self._validate(weights)
        if mode == "uniform" or weights is None:
            start = allocate(self.global_batch, [1.0] * self._n, b_min=b_min, b_max=b_max)
        else:
            start = allocate(self.global_batch, weights, b_min=b_min, b_max=b_max)
        self._sizes = start
        self._estimator = self.settings.estimator()
        self._smoothed = math.nan  # this rank's estimated seconds per sample at the last decision
        self._since = 0
        self._probe_pending = mode == "dynamic" and self.probe_steps > 0
        self._step = 0
        self._last: dict[str, float] = {}
        self.adjustments: list[Adjustment] = []

    def _validate(self, weights: Sequence[float] | np.ndarray | None) -> None:
        if self.mode not in MODES:
            raise BatchingError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.probe_steps < 0:
            raise BatchingError(f"probe_steps must be >= 0, got {self.probe_steps}")
        if self.slowdown_mode not in STRETCH_MODES:
            raise BatchingError(
                f"slowdown_mode must be one of {STRETCH_MODES}, got {self.slowdown_mode!r}"
            )
        if self._slowdown.max_rank >= self._n:
            raise BatchingError(
                f"slowdown {self._slowdown.spec!r} names rank {self._slowdown.max_rank}, but the "
                f"group has {self._n} rank(s) (0..{self._n - 1})"
            )
        if weights is not None:
            if self.mode == "uniform":
                raise BatchingError(
                    "mode 'uniform' takes no weights; use mode 'static' for fixed weights"
                )
            w = [float(v) for v in weights]
            if len(w) != self._n or any(not math.isfinite(v) or v <= 0 for v in w):
                raise BatchingError(
                    f"weights must be {self._n} finite positive numbers (one per rank), got {w}"
                )

    @property
    def batch_sizes(self) -> np.ndarray:
        """Per-rank batch sizes (int64, ``sum == global_batch``), the same on every rank."""
        return self._sizes.copy()

    @property
    def local_batch(self) -> int:
        """This rank's batch size."""
        return int(self._sizes[self._rank])

    @property
    def slowdown(self) -> SlowdownSchedule:
        """The emulated-slowdown schedule."""
        return self._slowdown

    @property
    def last_metrics(self) -> dict[str, float]:
        """This rank's figures from the latest :meth:`update`: ``step``, ``rank``,
        ``batch_size``, ``compute_s`` and ``smoothed_s`` (the estimated seconds at this size at
        the latest decision; NaN before the first)."""
        return dict(self._last)

    def timer_start(self) -> float:
        """The clock reading to pass to :meth:`timer_stop`; on CUDA after the device has
        finished the work queued before (the last step's optimizer kernels are not this step's
        compute)."""
        if self._device is not None and self._device.type == "cuda":
            torch.cuda.synchronize(self._device)
        return time.perf_counter()

    def timer_stop(self, t0: float, *, step: int | None = None) -> float:
        """Seconds of compute since ``t0`` (a ``time.perf_counter()`` reading).

        Synchronises the device first on CUDA, then, under an emulated slowdown of factor F,
        spends ``(F - 1)`` times the compute so far busy or asleep (``slowdown_mode``); that
        time is part of the returned time.

        Args:
            t0: the clock reading taken just before the forward pass.
            step: the current step; defaults to the step after the last :meth:`update`.
        """
        if self._device is not None and self._device.type == "cuda":
            torch.cuda.synchronize(self._device)
        elapsed = time.perf_counter() - t0
        factor = self._slowdown.factor(self._rank, self._step if step is None else step)
        stretch(elapsed, factor, mode=self.slowdown_mode)
        return time.perf_counter() - t0

    def update(self, *, step: int, compute_s: float) -> Adjustment | None:
        """Fold in this step's compute time; every ``interval`` steps, decide new sizes.

        Call on every rank every step (it communicates on decision steps). A time that is not
        finite and positive is left out of the estimate; if a rank has no valid estimate at a
        decision, every rank keeps the current sizes and records why.

        Args:
            step: the step just computed (0-based).
            compute_s: this rank's compute seconds for it (from :meth:`timer_stop`).

        Returns:
            The decision (adopted or held) on decision steps, otherwise None.
        """
        b = self.local_batch
        t = float(compute_s)
        self._estimator.add(b, t)
        self._last = {
            "step": step,
            "rank": self._rank,
            "batch_size": b,
            "compute_s": t,
            "smoothed_s": self._smoothed * b,
        }
        self._step = step + 1
        if self.mode != "dynamic":
            return None
        self._since += 1
        if self._since < (self.probe_steps if self._probe_pending else self.settings.interval):
            return None
        self._since = 0
        rec = self._decide(step)
        self._last["smoothed_s"] = self._smoothed * b
        return rec

    def _decide(self, step: int) -> Adjustment:
        # Cut every rank's window at the same step, so that a slow spell of the whole host
        # cancels between the ranks instead of moving the sizes.
        cuts = comm.allgather_array(
            np.array([float(self._estimator.change_cut())]), group=self._group
        )
        est = self._estimator.report(keep=common_cut([int(c) for c in cuts[:, 0]]))
        self._smoothed = est.per_sample_s
        mine = np.array([float(self.local_batch), est.per_sample_s, est.rel_se, est.elasticity])
        gathered = comm.allgather_array(mine, group=self._group)
        rec = self.settings.decide(
            step, self._sizes, gathered[:, 1], gathered[:, 2], gathered[:, 3],
            global_batch=self.global_batch, force=self._probe_pending,
        )  # fmt: skip
        if rec.applied:
            self._sizes = np.asarray(rec.new_sizes, dtype=np.int64)
            if rec.new_sizes != rec.old_sizes:
                self._estimator.reset()
        self._probe_pending = False
        self.adjustments.append(rec)
        return rec

    def state_dict(self) -> dict[str, Any]:
        """The controller's state. ``estimator`` is this rank's own window of times; loading
        another rank's state only perturbs the estimate until the window turns over."""
        return {
            "global_batch": self.global_batch,
            "world_size": self._n,
            "mode": self.mode,
            "sizes": [int(v) for v in self._sizes],
            "estimator": self._estimator.state_dict(),
            "smoothed": None if math.isnan(self._smoothed) else self._smoothed,
            "since": self._since,
            "probe_pending": self._probe_pending,
            "step": self._step,
            "adjustments": [a.as_dict() for a in self.adjustments],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output.

        Raises:
            BatchingError: the state is for another global batch, group size or mode.
        """
        expected = {"global_batch": self.global_batch, "world_size": self._n, "mode": self.mode}
        for key, mine in expected.items():
            if state.get(key) != mine:
                raise BatchingError(
                    f"cannot load a batch-controller state with {key}={state.get(key)!r} into one "
                    f"with {key}={mine!r}; resume with the settings of the saved run"
                )
        sizes = np.asarray(state["sizes"], dtype=np.int64)
        if sizes.shape != (self._n,) or int(sizes.sum()) != self.global_batch:
            raise BatchingError(
                f"saved sizes {state['sizes']} do not split global batch {self.global_batch}"
            )
        self._sizes = sizes
        self._estimator.load_state_dict(state["estimator"])
        self._smoothed = math.nan if state["smoothed"] is None else float(state["smoothed"])
        self._since = int(state["since"])
        self._probe_pending = bool(state["probe_pending"])
        self._step = int(state["step"])
        self.adjustments = [Adjustment.from_dict(a) for a in state["adjustments"]]


def _plain(b: Bound) -> int | list[int] | None:
    if b is None or isinstance(b, (int, np.integer)):
        return None if b is None else int(b)
    return [int(v) for v in b]
