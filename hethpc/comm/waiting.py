"""Waiting for the other ranks without spinning, and the seconds this rank spent in collectives.

A blocking MPI collective polls while the rank waits for the last one to arrive: it spins, or
yields a core nobody else wants, and burns CPU time the whole wait. Under a CPU quota (a
container's limit, a cgroup) that burnt time is charged like work, so a rank that waits spends
its quota there and is throttled later, anywhere, often inside its next forward pass or its
next wait; its timed compute then no longer shows that it is the slow rank. :func:`arrive`
waits in a nonblocking barrier tested between short sleeps (growing to ``POLL_MAX_S``), so a
waiting rank uses almost no CPU; the collective that follows finds every rank there and only
moves data, itself nonblocking and waited for the same way (on a slow link the transfer is the
long part: a blocking allreduce spun for all of it). A nonblocking transfer moves only while
its rank tests it (Open MPI has no progress thread), so those waits sleep at most
``TRANSFER_POLL_MAX_S``: a 423 KB allreduce over a 200 Mbit/s testbed link took 18.4 ms with
sleeps up to 0.5 ms, 16.0 ms with sleeps up to 50 us and 14.0 ms in a blocking
``MPI_Allreduce``, which spun for it (``benchmarks/bench_wait.py``: 14-28 ms of CPU per call
against 1 ms, and on a node capped at half a core a third of the calls then took 56-62 ms).
:func:`comm_seconds` totals the time spent inside collectives (waits, transfers and link
emulation), so a rank's own time per step is its wall time minus that.
"""

from __future__ import annotations

import time
from typing import Any

SPIN_S = 100e-6  # tested without sleeping this long first: a quick collective pays nothing
POLL_MIN_S = 20e-6  # the first sleep between tests
POLL_MAX_S = 5e-4  # the longest sleep waiting for the others: the most it overshoots the last
TRANSFER_POLL_MAX_S = 5e-5  # the longest sleep while data moves (each test moves it on)
_GROWTH = 1.5

_spent = 0.0  # seconds in collectives on this rank since the start


def wait(request: Any, *, poll_max_s: float | None = None) -> None:
    """Complete an mpi4py request: tested in a loop for ``SPIN_S``, then between sleeps that
    grow to ``poll_max_s`` (default ``TRANSFER_POLL_MAX_S``; each test also moves the transfer
    on), instead of spinning in ``Wait`` however long it takes."""
    cap = TRANSFER_POLL_MAX_S if poll_max_s is None else poll_max_s
    end = time.perf_counter() + SPIN_S
    while not request.Test():
        if time.perf_counter() > end:
            break
    else:
        return
    pause = POLL_MIN_S
    while not request.Test():
        time.sleep(pause)
        pause = min(pause * _GROWTH, cap)


def arrive(mpi_comm: Any) -> None:
    """Return once every rank of ``mpi_comm`` has called it, sleeping (not spinning) meanwhile."""
    wait(mpi_comm.Ibarrier(), poll_max_s=POLL_MAX_S)


def add_comm_seconds(seconds: float) -> None:
    """Count ``seconds`` spent in a collective (called by the collectives themselves)."""
    global _spent
    _spent += seconds


def comm_seconds() -> float:
    """Seconds this rank has spent inside collectives since it started (monotonic)."""
    return _spent
