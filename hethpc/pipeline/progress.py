"""Keep point-to-point sends moving while the stage computes.

Large MPI messages use a rendezvous: the sender's data moves only while the sender is inside
an MPI call. A stage that starts a send and then computes for a whole micro-batch would hold
its neighbour back by that long; a light thread that tests the pending sends every
``interval`` seconds (sleeping, not spinning, in between) lets them finish within that time.
"""

from __future__ import annotations

import threading
from types import TracebackType

from hethpc.comm import Request


class SendProgress:
    """Context manager: sends given to :meth:`add` progress in the background; all are
    complete when the block exits.

    Args:
        interval: seconds between tests of the pending sends.
    """

    def __init__(self, *, interval: float = 0.0005) -> None:
        self.interval = interval
        self._pending: list[Request] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, request: Request) -> None:
        """Track ``request`` until it completes."""
        with self._lock:
            self._pending.append(request)

    @property
    def pending(self) -> int:
        """Sends not yet known to be complete."""
        with self._lock:
            return len(self._pending)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            with self._lock:
                self._pending = [r for r in self._pending if not r.test()]

    def __enter__(self) -> SendProgress:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="hethpc-send-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self._lock:
            pending, self._pending = self._pending, []
        if exc_type is None:
            for r in pending:
                r.wait()
