"""A per-rank watchdog: a rank stuck in one step for too long dumps its stacks and exits."""

from __future__ import annotations

import faulthandler
import sys
import time
from typing import TextIO


class Watchdog:
    """Re-armed at every step; if not re-armed within ``timeout_s`` the process exits.

    A rank that exits makes the launcher (mpirun, srun) end the others, so a stall anywhere
    (a peer that stopped answering, a hung file system) ends the job instead of burning the
    allocation. The stacks of every thread go to ``stream`` first, to show where it hung.

    Re-arming starts a timer thread, so :meth:`kick` re-arms at most every ``timeout_s / 10``
    seconds (one second at most): a process ends between 0.9 and 1 times ``timeout_s`` after
    its last kick, and a training step costs no thread start.

    Args:
        timeout_s: seconds allowed between two :meth:`kick` calls; 0 disables the watchdog.
        stream: where the stacks are written (default: stderr).
    """

    def __init__(self, timeout_s: float, *, stream: TextIO | None = None) -> None:
        if timeout_s < 0:
            raise ValueError(f"timeout_s must not be negative, got {timeout_s}")
        self.timeout_s = timeout_s
        self.stream = stream or sys.stderr
        self._every = min(1.0, timeout_s / 10)
        self._armed = -float("inf")

    def kick(self) -> None:
        """Restart the countdown."""
        now = time.monotonic()
        if self.timeout_s > 0 and now - self._armed >= self._every:
            self._armed = now
            faulthandler.dump_traceback_later(self.timeout_s, exit=True, file=self.stream)

    def stop(self) -> None:
        """Cancel the countdown."""
        if self.timeout_s > 0:
            faulthandler.cancel_dump_traceback_later()

    def __enter__(self) -> Watchdog:
        self._armed = -float("inf")
        self.kick()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
