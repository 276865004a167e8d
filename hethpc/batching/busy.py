"""A rank's compute time as the batch controller should see it: its CPU time at the share of
the CPU its work really gets, so that a CPU quota's stalls count wherever they fall.

Under a CPU quota (a container's or cgroup's CFS limit) a rank runs at full speed until its
quota for the period (100 ms) is spent, then stalls for the rest of the period: one step in
several carries a long stall, anywhere in the step (its data, its optimizer step, its waits),
and the others none. Its timed forward and backward then mostly look as fast as an uncapped
rank's, and the robust estimate drops the few stalled ones as spikes. The CPU time of the
forward and backward does not stall; the share of the CPU the rank gets while it wants to run
accounts for every stall. So the compute time the controller sees is the forward and
backward's CPU time divided by that share: on an idle dedicated core about its wall time, under
a quota q about ``1/q`` times its CPU time at every step, with the noise of CPU time only.

The share is read from the kernel where it can be (Linux's ``/proc/thread-self/schedstat``):
the training thread's CPU time over its CPU time plus its run delay (the time it was ready to
run but did not: throttled by a quota, or queued behind a busy neighbour), over the whole step,
waits included. A stall that falls inside a collective counts too, and a wait that sleeps does
not. Elsewhere it is the process's CPU seconds over its wall seconds outside collectives. The
emulated slowdown's extra time (``--slowdown``) is added as it is, and kept out of the share.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable

from hethpc import comm

SPAN_S = 1.0  # the share is measured over at least this much busy wall time (10 CFS periods)
MIN_STEPS = 3
SCHEDSTAT = "/proc/thread-self/schedstat"


def read_schedstat(path: str = SCHEDSTAT) -> tuple[float, float] | None:
    """The calling thread's CPU seconds and run-delay seconds from the kernel (``schedstat``:
    nanoseconds on the CPU, nanoseconds waiting on a run queue, which includes a quota's
    throttled time), or None where the file is missing or unreadable."""
    try:
        with open(path, "rb") as f:
            fields = f.read().split()
        return int(fields[0]) / 1e9, int(fields[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def _schedstat_works() -> bool:
    return read_schedstat() is not None


class CpuShare:
    """The share of the CPU a rank's own work gets, and compute times at that share.

    Per step: :meth:`begin_step` at its start, :meth:`begin_compute` and :meth:`end_compute`
    around the forward and backward (before an emulated stretch), :meth:`end_step` at its end,
    which returns the step's compute time for the controller. All four are called from the
    training thread.

    Args:
        span_s: the share is taken over the most recent steps whose busy time (wall time
            outside collectives, or the thread's CPU time plus run delay) adds up to at least
            this (and at least ``MIN_STEPS`` steps).
        schedstat: read the training thread's CPU time and run delay from the kernel; None:
            where ``/proc/thread-self/schedstat`` can be read.
    """

    def __init__(self, *, span_s: float = SPAN_S, schedstat: bool | None = None) -> None:
        self.span_s = float(span_s)
        self.schedstat = _schedstat_works() if schedstat is None else bool(schedstat)
        self._steps: deque[tuple[float, float]] = deque()
        self._wall = 0.0
        self._cpu = 0.0
        self._step0: tuple[float, float, float] | None = None
        self._compute0: tuple[float, float] | None = None
        self._compute: tuple[float, float] | None = None  # (wall, cpu) of the forward/backward
        self._cpu_now: Callable[[], float] = (
            time.thread_time if self.schedstat else time.process_time
        )

    def add(self, busy_s: float, cpu_s: float) -> None:
        """Fold in one step's busy seconds (the time its work wanted the CPU) and the CPU
        seconds it got."""
        if not (math.isfinite(busy_s) and math.isfinite(cpu_s)) or busy_s <= 0:
            return
        cpu_s = max(cpu_s, 0.0)
        self._steps.append((busy_s, cpu_s))
        self._wall += busy_s
        self._cpu += cpu_s
        while len(self._steps) > MIN_STEPS and self._wall - self._steps[0][0] >= self.span_s:
            w, c = self._steps.popleft()
            self._wall -= w
            self._cpu -= c

    @property
    def share(self) -> float:
        """CPU seconds per busy second of the rank's own work over the window (NaN before any
        step): below 1 under a quota or a busy neighbour, about 1 on an idle core; measured by
        wall time, above 1 with several busy threads."""
        return self._cpu / self._wall if self._wall > 0 and self._cpu > 0 else math.nan

    def at_share(self, cpu_s: float, wall_s: float) -> float:
        """``cpu_s`` divided by the share; ``wall_s`` while the share is unknown."""
        share = self.share
        if not (math.isfinite(share) and cpu_s > 0):
            return wall_s
        return cpu_s / share

    def _mark(self) -> tuple[float, float, float]:
        """(wall clock, CPU time, run delay or time in collectives) now; NaN where the kernel's
        figures cannot be read (the step is then left out of the share)."""
        if self.schedstat:
            cpu, delay = read_schedstat() or (math.nan, math.nan)
            return time.perf_counter(), cpu, delay
        return time.perf_counter(), time.process_time(), comm.comm_seconds()

    def begin_step(self) -> None:
        """Mark a step's start."""
        self._step0 = self._mark()
        self._compute = None

    def begin_compute(self) -> None:
        """Mark the forward pass's start."""
        self._compute0 = (time.perf_counter(), self._cpu_now())

    def end_compute(self) -> None:
        """Mark the backward pass's end (before any emulated stretch)."""
        if self._compute0 is not None:
            t0, c0 = self._compute0
            self._compute = (time.perf_counter() - t0, self._cpu_now() - c0)
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
        step0, computed = self._step0, self._compute
        self._step0 = self._compute = None
        if step0 is None or computed is None:
            return compute_s
        wall, cpu = computed
        stretch = max(compute_s - wall, 0.0)
        t1, c1, x1 = self._mark()
        t0, c0, x0 = step0
        step_cpu = c1 - c0
        if self.schedstat:  # busy: on the CPU or ready for it, the whole step, waits included
            self.add(step_cpu + (x1 - x0), step_cpu)
        else:  # busy: wall time outside collectives and the emulated stretch
            self.add(t1 - t0 - (x1 - x0) - stretch, step_cpu)
        return self.at_share(cpu, wall) + stretch
