"""The job's watchdog: when no rank makes progress, name the stalled rank and end the job."""

from __future__ import annotations

import faulthandler
import mmap
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TextIO

from hethpc.train.watch import stall_monitor
from hethpc.train.watch.stall_monitor import LAYOUT, PATIENT, PHASES, Peer, culprits, stall_limit

__all__ = ["PATIENT", "Peer", "Watchdog", "culprits", "stall_limit"]

_PHASE_INDEX = {p: i for i, p in enumerate(PHASES)}


class Watchdog:
    """Ends the job when this rank, and every rank it can see, stopped making progress.

    The training loop calls :meth:`kick` at each progress point (``step``, ``phase``): a few
    bytes written to a shared file, no I/O. A monitor process
    (:mod:`hethpc.train.watch.stall_monitor`) reads them every ``tick_s``, writes this rank's
    heartbeat (step, phase, seconds idle, whether the process is stopped) to
    ``heartbeat_dir/rank<k>.json``, and when this rank has been idle longer than the limit
    (:func:`stall_limit`: ``scale`` times the slowest gap between kicks, within
    ``[timeout_s, max_s]``) it reads the others' heartbeats. If some rank still makes progress
    (rank 0 evaluating while the others wait), it waits on, up to ``max_s``; otherwise it
    prints which rank stalled, at which step and phase, has this rank dump its stacks next to
    the heartbeats and kills it, which makes the launcher (mpirun, srun) end every rank. Being
    a separate process, it acts also when this rank is stopped or hung in C code.

    Args:
        timeout_s: the limit's floor in seconds; 0 disables the watchdog.
        max_s: the limit's ceiling (default: ``timeout_s``).
        scale: the limit as a multiple of the slowest gap between kicks.
        heartbeat_dir: where heartbeats go (shared by the ranks); None: this rank alone.
        rank: this process's rank.
        size: the number of ranks.

    The monitor's message goes to this process's standard error (file descriptor 2).
    """

    def __init__(
        self,
        timeout_s: float,
        *,
        max_s: float | None = None,
        scale: float = 20.0,
        heartbeat_dir: str | os.PathLike[str] | None = None,
        rank: int = 0,
        size: int = 1,
    ) -> None:
        if not timeout_s >= 0:
            raise ValueError(f"timeout_s must be a non-negative number, got {timeout_s}")
        self.timeout_s = float(timeout_s)
        self.max_s = max(float(max_s if max_s is not None else timeout_s), self.timeout_s)
        self.scale = scale
        self.dir = Path(heartbeat_dir) if heartbeat_dir is not None else None
        self.rank, self.size = rank, size
        self.tick_s = min(1.0, self.timeout_s / 10) if self.timeout_s else 1.0
        self._step, self._phase = -1, "start"
        self._last = time.monotonic()
        self._slowest = 0.0
        self._state: mmap.mmap | None = None
        self._state_path: str | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._stacks_file: TextIO | None = None

    def kick(self, step: int | None = None, phase: str = "step") -> None:
        """Record progress: this rank reached ``phase`` of ``step`` (cheap: no I/O)."""
        now = time.monotonic()
        if self._phase not in PATIENT:
            self._slowest = max(self._slowest, now - self._last)
        self._last = now
        if step is not None:
            self._step = step
        self._phase = phase
        if self._state is not None:
            self._publish(0)

    def limit(self) -> float:
        """The current limit in seconds (the ceiling while in a patient phase)."""
        if self._phase in PATIENT:
            return self.max_s
        return stall_limit(self.timeout_s, self.max_s, self._slowest, scale=self.scale)

    def _publish(self, stop: int) -> None:
        assert self._state is not None
        # One slice assignment (a memcpy): struct.pack_into would zero the record before
        # filling it, and the monitor could read the zeros.
        self._state[: LAYOUT.size] = LAYOUT.pack(
            self._step, _PHASE_INDEX.get(self._phase, 1), self._last, self._slowest, stop
        )

    def start(self) -> None:
        """Start the monitor process (once)."""
        if self.timeout_s == 0 or self._proc is not None:
            return
        if self.dir is not None:
            self.dir.mkdir(parents=True, exist_ok=True)
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None  # node-local, in memory
        fd, self._state_path = tempfile.mkstemp(prefix="hethpc-watchdog-", dir=shm)
        os.ftruncate(fd, LAYOUT.size)
        self._state = mmap.mmap(fd, LAYOUT.size)
        os.close(fd)
        self._last = time.monotonic()
        self._publish(0)
        stacks = ""
        if self.dir is not None:
            stacks = str(self.dir / f"stacks-rank{self.rank}.txt")
            self._stacks_file = open(stacks, "w")  # noqa: SIM115 (open while the run lasts)
            faulthandler.register(signal.SIGUSR1, file=self._stacks_file, all_threads=True)
        cmd = [
            sys.executable, stall_monitor.__file__, "--pid", str(os.getpid()),
            "--state", self._state_path, "--rank", str(self.rank), "--size", str(self.size),
            "--dir", str(self.dir or ""), "--stacks", stacks, "--floor-s", str(self.timeout_s),
            "--max-s", str(self.max_s), "--scale", str(self.scale), "--tick-s", str(self.tick_s),
        ]  # fmt: skip
        # Its own session: a Ctrl-C to the job reaches the rank, which then ends the monitor.
        self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                      start_new_session=True)  # fmt: skip

    def stop(self) -> None:
        """Stop the monitor and remove the shared file."""
        if self._proc is None:
            return
        self._publish(1)
        self._proc.terminate()
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
        self._proc = None
        if self._stacks_file is not None:
            faulthandler.unregister(signal.SIGUSR1)
            self._stacks_file.close()
            self._stacks_file = None
        assert self._state is not None and self._state_path is not None
        self._state.close()
        Path(self._state_path).unlink(missing_ok=True)
        self._state = None

    def __enter__(self) -> Watchdog:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
