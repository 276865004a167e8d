"""A rank's compute time as the batch controller should see it: its CPU time at the share of
the CPU its work really gets, so that a CPU quota's stalls count wherever they fall.

Under a CPU quota (a container's or cgroup's CFS limit) a rank runs at full speed until its
quota for the period (100 ms) is spent, then stalls for the rest of the period: one step in
several carries a long stall, anywhere in the step (its data, its optimizer step, its waits),
and the others none. Its timed forward and backward then mostly look as fast as an uncapped
rank's, and the robust estimate drops the few stalled ones as spikes. The CPU time of the
forward and backward does not stall; the share of wall time the rank's own work gets the CPU
(its CPU seconds over its wall seconds outside collectives, over a span of several periods)
accounts for every stall. So the compute time the controller sees is the forward and backward's
CPU time divided by that share: on an idle dedicated core about its wall time, under a quota q
about ``1/q`` times its CPU time at every step, with the noise of CPU time only. The emulated
slowdown's extra time (``--slowdown``) is added as it is, and kept out of the share.
"""

from __future__ import annotations

import math
import time
from collections import deque

from hethpc import comm

SPAN_S = 1.0  # the share is measured over at least this much busy wall time (10 CFS periods)
MIN_STEPS = 3


class CpuShare:
    """The share of wall time a rank's own work gets the CPU, and compute times at that share.

    Per step: :meth:`begin_step` at its start, :meth:`begin_compute` and :meth:`end_compute`
    around the forward and backward (before an emulated stretch), :meth:`end_step` at its end,
    which returns the step's compute time for the controller.

    Args:
        span_s: the share is taken over the most recent steps whose wall time outside
            collectives adds up to at least this (and at least ``MIN_STEPS`` steps).
    """

    def __init__(self, *, span_s: float = SPAN_S) -> None:
        self.span_s = float(span_s)
        self._steps: deque[tuple[float, float]] = deque()
        self._wall = 0.0
        self._cpu = 0.0
        self._step0: tuple[float, float, float] | None = None
        self._compute0: tuple[float, float] | None = None
        self._compute: tuple[float, float] | None = None  # (wall, cpu) of the forward/backward

    def add(self, wall_s: float, cpu_s: float) -> None:
        """Fold in one step's wall seconds outside collectives and the CPU seconds it used."""
        if not (math.isfinite(wall_s) and math.isfinite(cpu_s)) or wall_s <= 0:
            return
        cpu_s = max(cpu_s, 0.0)
        self._steps.append((wall_s, cpu_s))
        self._wall += wall_s
        self._cpu += cpu_s
        while len(self._steps) > MIN_STEPS and self._wall - self._steps[0][0] >= self.span_s:
            w, c = self._steps.popleft()
            self._wall -= w
            self._cpu -= c

    @property
    def share(self) -> float:
        """CPU seconds per wall second of the rank's own work over the window (NaN before any
        step): below 1 under a quota or a busy neighbour, about 1 on an idle core, above 1 with
        several busy threads."""
        return self._cpu / self._wall if self._wall > 0 and self._cpu > 0 else math.nan

    def at_share(self, cpu_s: float, wall_s: float) -> float:
        """``cpu_s`` divided by the share; ``wall_s`` while the share is unknown."""
        share = self.share
        if not (math.isfinite(share) and cpu_s > 0):
            return wall_s
        return cpu_s / share

    def begin_step(self) -> None:
        """Mark a step's start (wall clock, process CPU time, time in collectives)."""
        self._step0 = (time.perf_counter(), time.process_time(), comm.comm_seconds())
        self._compute = None

    def begin_compute(self) -> None:
        """Mark the forward pass's start."""
        self._compute0 = (time.perf_counter(), time.process_time())

    def end_compute(self) -> None:
        """Mark the backward pass's end (before any emulated stretch)."""
        if self._compute0 is not None:
            t0, c0 = self._compute0
            self._compute = (time.perf_counter() - t0, time.process_time() - c0)
            self._compute0 = None

    def end_step(self, compute_s: float) -> float:
        """Close the step; returns its compute time for the controller.

        Args:
            compute_s: the step's timed compute (forward, backward and an emulated stretch:
                :meth:`~hethpc.batching.BatchController.timer_stop`).

        Returns:
            The forward and backward's CPU time at the share, plus the stretch; ``compute_s``
            itself when a mark is missing.
        """
        if self._step0 is None or self._compute is None:
            return compute_s
        t0, c0, s0 = self._step0
        wall, cpu = self._compute
        stretch = max(compute_s - wall, 0.0)
        step_wall = time.perf_counter() - t0 - (comm.comm_seconds() - s0) - stretch
        self.add(step_wall, time.process_time() - c0)
        self._step0 = self._compute = None
        return self.at_share(cpu, wall) + stretch
