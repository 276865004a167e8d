"""The watchdog without MPI: its limit, whom it blames, and that a stalled process ends."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from hethpc.train.watch.watchdog import Peer, culprits, stall_limit


@pytest.mark.parametrize(
    ("slowest", "limit"),
    [(0.0, 30.0), (0.5, 30.0), (2.0, 40.0), (100.0, 600.0)],
    ids=["no-steps-yet", "fast-steps", "scaled", "ceiling"],
)
def test_stall_limit_scales_within_floor_and_ceiling(slowest: float, limit: float) -> None:
    assert stall_limit(30.0, 600.0, slowest, scale=20.0) == limit


def _peer(rank: int, step: int, phase: str, *, seen: float = 100.0) -> Peer:
    return Peer(rank=rank, step=step, phase=phase, idle_s=40.0, beat=1, pid=1, host="h",
                seen_change=seen)  # fmt: skip


@pytest.mark.parametrize(
    ("others", "blamed"),
    [
        ([_peer(1, 7, "compute", seen=60.0)], [1]),  # stopped: no heartbeat for 40 s
        ([_peer(1, 7, "compute"), _peer(2, 7, "sync")], [1]),  # alive but not waiting
        ([_peer(1, 6, "sync"), _peer(2, 7, "sync")], [1]),  # everyone waits: lowest step
    ],
    ids=["frozen-peer", "working-peer", "lowest-step"],
)
def test_culprits(others: list[Peer], blamed: list[int]) -> None:
    me = _peer(0, 7, "sync")
    assert [p.rank for p in culprits(me, others, now=100.0, frozen_s=10.0)] == blamed


def _python(code: str, timeout: float = 60) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip
    return proc, time.perf_counter() - t0


def test_a_process_stopped_by_sigstop_is_named_by_its_own_monitor(tmp_path: Path) -> None:
    code = (
        "import os, signal, time\nfrom hethpc.train.watch.watchdog import Watchdog\n"
        f"with Watchdog(1.0, heartbeat_dir={str(tmp_path)!r}) as w:\n"
        "    w.kick(2, 'compute')\n    os.kill(os.getpid(), signal.SIGSTOP)\n"
    )
    proc, took = _python(code)
    assert proc.returncode == -9, proc.stderr
    assert "Stalled: rank 0" in proc.stderr and "stopped (SIGSTOP" in proc.stderr, proc.stderr
    assert took < 20


def test_a_stalled_process_ends_naming_step_and_phase(tmp_path: Path) -> None:
    code = (
        "import time\nfrom hethpc.train.watch.watchdog import Watchdog\n"
        f"with Watchdog(1.0, heartbeat_dir={str(tmp_path)!r}) as w:\n"
        "    w.kick(4, 'compute')\n    time.sleep(60)\n"
    )
    proc, took = _python(code)
    assert proc.returncode == -9, proc.stderr  # killed by its monitor
    assert "no progress for 1 s" in proc.stderr and "at step 4, compute" in proc.stderr
    assert took < 20
    assert (tmp_path / "rank0.json").exists() and (tmp_path / "stacks-rank0.txt").exists()


def test_a_kicked_process_finishes() -> None:
    code = (
        "import time\nfrom hethpc.train.watch.watchdog import Watchdog\n"
        "with Watchdog(1.0) as w:\n    for s in range(6):\n        w.kick(s)\n"
        "        time.sleep(0.4)\nprint('done')\n"
    )
    proc, _ = _python(code)
    assert proc.returncode == 0 and "done" in proc.stdout, proc.stderr


def test_a_patient_phase_gets_the_ceiling() -> None:
    code = (
        "import time\nfrom hethpc.train.watch.watchdog import Watchdog\n"
        "with Watchdog(1.0, max_s=30.0) as w:\n    w.kick(0, 'checkpoint')\n"
        "    time.sleep(3)\nprint('done')\n"
    )
    proc, _ = _python(code)
    assert proc.returncode == 0 and "done" in proc.stdout, proc.stderr


def test_the_limit_grows_with_slow_steps() -> None:
    code = (
        "import time\nfrom hethpc.train.watch.watchdog import Watchdog\n"
        "with Watchdog(1.0, max_s=60.0, scale=20.0) as w:\n"
        "    w.kick(0)\n    time.sleep(0.2)\n    w.kick(1)\n    time.sleep(2.5)\n    w.kick(2)\n"
        "print('done', round(w.limit()))\n"
    )
    proc, _ = _python(code)
    # 2.5 s asleep with a 1 s floor: alive, since 0.2 s steps had raised the limit to 4 s.
    assert proc.returncode == 0 and "done 50" in proc.stdout, proc.stderr


def test_a_busy_process_kicking_nonstop_is_never_ended() -> None:
    # The monitor reads the shared record while the rank rewrites it; a half-written record
    # must never read as a stall (a kick per microsecond, the monitor reading every 0.02 s).
    code = (
        "import time\nfrom hethpc.train.watch.watchdog import Watchdog\n"
        "with Watchdog(0.2) as w:\n    t0 = time.monotonic()\n"
        "    while time.monotonic() - t0 < 4:\n        w.kick(1, 'compute')\nprint('done')\n"
    )
    proc, _ = _python(code)
    assert proc.returncode == 0 and "done" in proc.stdout, proc.stderr
