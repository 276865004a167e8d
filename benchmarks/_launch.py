"""Shared by the benchmarks: relaunch a plain ``python benchmarks/x.py`` under mpirun."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import FrameType

ROOT = Path(__file__).resolve().parents[1]
SCRATCH_ENV = "HETHPC_SCRATCH"  # where the launched ranks' run directories go (_scratch.py)


def under_mpi() -> bool:
    """Whether this process is an MPI rank (started by mpirun, mpiexec or srun)."""
    return any(v in os.environ for v in ("OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMIX_RANK"))


def relaunch(
    script: str, ranks: int, argv: Sequence[str] | None = None, *, timeout_s: int = 1200
) -> int:
    """Run ``script`` with ``argv`` on ``ranks`` MPI ranks (one thread each); its exit code.

    The run is bounded by ``timeout_s`` seconds unless ``HETHPC_MPIRUN_TIMEOUT`` says otherwise.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    cmd = [str(ROOT / "scripts" / "mpirun.sh"), "-np", str(ranks), sys.executable,
           str(Path(script).resolve()), *args]  # fmt: skip
    print("launching:", " ".join(cmd), flush=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.setdefault("HETHPC_MPIRUN_TIMEOUT", str(int(timeout_s)))
    return run_ranks(cmd, env)


def run_ranks(cmd: Sequence[str], env: Mapping[str, str]) -> int:
    """Run ``cmd`` (a launcher: mpirun, or a testbed around it) to its end; its exit code.

    Its ranks' run directories (checkpoints: hundreds of MB over a protocol) go under a folder
    of this process's (``HETHPC_SCRATCH``), removed once the launcher and every rank have
    ended, also after Ctrl-C or SIGTERM. The launcher is asked to end its ranks: SIGTERM, then
    SIGKILL after 30 s; after Ctrl-C, which a terminal sends it too, only if it has not ended
    in 10 s (a second signal makes mpirun leave at once, before its ranks). Ranks whose
    launcher ended first become this process's (a child subreaper, Linux), which waits for them
    (SIGKILL after 30 s), so no rank writes after the removal. Then it exits: 130 (Ctrl-C) or
    143 (SIGTERM), with one line saying so.
    """
    _adopt_orphans()
    others = set(_children())  # this process's children before the launch: not its ranks
    with tempfile.TemporaryDirectory(prefix="hethpc-scratch-") as root, _sigterm_interrupts():
        proc = subprocess.Popen(list(cmd), cwd=ROOT, env={**env, SCRATCH_ENV: root})
        try:
            return proc.wait()
        except KeyboardInterrupt as e:
            term = isinstance(e, _Terminated)
            with _sigterm_interrupts(False):
                _end(proc, told=not term)
            print(f"{Path(sys.argv[0]).name}: stopped by {'SIGTERM' if term else 'Ctrl-C'}; "
                  "its ranks have ended, and their run directories are removed", file=sys.stderr,
                  flush=True)  # fmt: skip
            raise SystemExit(128 + (signal.SIGTERM if term else signal.SIGINT)) from None
        finally:
            with _sigterm_interrupts(False):
                _reap_orphans(30.0, others)


def _end(proc: subprocess.Popen[bytes], *, told: bool) -> None:
    """End the launcher: SIGTERM (unless ``told``: it got the same Ctrl-C, and is given 10 s to
    end its ranks), then SIGKILL after 30 s."""
    for sig, wait_s in ((None, 10.0 if told else 0.0), (signal.SIGTERM, 30.0)):
        if sig is not None:
            proc.send_signal(sig)
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            pass
    proc.kill()
    proc.wait()


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised as Ctrl-C is."""


def _adopt_orphans() -> None:
    """Make this process a child subreaper (Linux's prctl PR_SET_CHILD_SUBREAPER), for the rest
    of its life: a rank whose launcher ended first becomes this process's child instead of
    init's."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def _reap_orphans(timeout_s: float, others: set[int]) -> None:
    """Wait for every child but ``others`` (ranks adopted after their launcher ended), each by
    its pid; SIGKILL any still running after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while adopted := [pid for pid in _children() if pid not in others]:
        for pid in adopted:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
        if time.monotonic() > deadline:
            for pid in adopted:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            deadline = float("inf")
        time.sleep(0.1)


def _children() -> list[int]:
    """This process's children (Linux's /proc; elsewhere none known)."""
    pids: list[int] = []
    for task in Path("/proc/self/task").glob("*/children"):
        with contextlib.suppress(OSError):
            pids += [int(x) for x in task.read_text().split()]
    return pids


@contextlib.contextmanager
def _sigterm_interrupts(on: bool = True) -> Iterator[None]:
    """SIGTERM (a scheduler's cancel) as Ctrl-C is, while inside (``on``); ignored while
    inside with ``on`` false (the launcher is being ended). Outside the main thread: as is."""

    def interrupt(_sig: int, _frame: FrameType | None) -> None:
        raise _Terminated

    try:
        old = signal.signal(signal.SIGTERM, interrupt if on else signal.SIG_IGN)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)
