"""scripts/mpirun.sh picks Open MPI's single-copy transport by probing the host (CMA or none)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MPIRUN = ROOT / "scripts" / "mpirun.sh"
VAR = "OMPI_MCA_btl_vader_single_copy_mechanism"

pytestmark = pytest.mark.skipif(
    "OMPI_COMM_WORLD_SIZE" in os.environ, reason="launches mpirun itself; run it outside mpirun"
)


def _probe() -> tuple[bool, str]:
    spec = importlib.util.spec_from_file_location("probe_cma", ROOT / "scripts" / "probe_cma.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.cma_works()  # type: ignore[no-any-return]


def _launch(
    np_: int, script: str, *args: str, **env: str
) -> subprocess.CompletedProcess[str]:
    """Run ``python -c script args`` on ``np_`` ranks by mpirun.sh, with ``VAR`` unset unless
    ``env`` sets it."""
    base = {k: v for k, v in os.environ.items() if k != VAR}
    return subprocess.run(
        [str(MPIRUN), "-np", str(np_), sys.executable, "-c", script, *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**base, "HETHPC_MPIRUN_TIMEOUT": "100", **env},
    )


PRINT_MECHANISM = f"import os; print(os.environ['{VAR}'])"

# Rank 0 starts a 4 MiB send, then stays out of MPI (it sleeps, watching a file) until rank 1
# has the whole message. With one copy (CMA) rank 1 takes it alone; with two copies the message
# moves only while rank 0 calls into MPI, so rank 1 cannot finish first. Plain mpi4py: no
# Horovod thread calling into MPI on rank 0's behalf.
ARRIVES_WHILE_SENDER_SLEEPS = """
import os, sys, time
import numpy as np
from mpi4py import MPI
w = MPI.COMM_WORLD
flag = sys.argv[1]
buf = np.arange(2**20, dtype=np.float32)
if w.rank == 0:
    req = w.Isend(buf, dest=1, tag=5)
    t0 = time.monotonic()
    while not os.path.exists(flag) and time.monotonic() - t0 < float(sys.argv[2]):
        time.sleep(0.01)
    arrived = os.path.exists(flag)
    req.Wait()
    print("ARRIVED" if arrived else "NOT-ARRIVED", flush=True)
else:
    got = np.empty_like(buf)
    w.Recv(got, source=0, tag=5)
    assert np.array_equal(got, buf)
    open(flag, "w").close()
"""


def _arrival(tmp_path: Path, mechanism: str, wait_s: float) -> str:
    flag = tmp_path / f"arrived-{mechanism}"
    proc = _launch(2, ARRIVES_WHILE_SENDER_SLEEPS, str(flag), str(wait_s), **{VAR: mechanism})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.strip().splitlines()[-1]


def test_mechanism_follows_the_probe() -> None:
    works, why = _probe()
    proc = _launch(1, PRINT_MECHANISM)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == ("cma" if works else "none"), why


def test_failed_probe_falls_back_to_two_copies() -> None:
    proc = _launch(1, PRINT_MECHANISM, PYTHON="false")  # a probe that cannot run says "no"
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "none"


def test_user_setting_wins() -> None:
    proc = _launch(1, PRINT_MECHANISM, **{VAR: "none", "PYTHON": "true"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "none", proc.stderr


def test_probe_reports_why_not() -> None:
    works, why = _probe()
    assert isinstance(works, bool)
    assert works == (why == ""), why


@pytest.mark.skipif(not _probe()[0], reason="this host forbids CMA (scripts/probe_cma.py -v)")
def test_single_copy_message_arrives_while_the_sender_sleeps(tmp_path: Path) -> None:
    assert _arrival(tmp_path, "cma", wait_s=30) == "ARRIVED"


def test_two_copy_message_waits_for_the_sender(tmp_path: Path) -> None:
    # The contrast that makes the test above meaningful: the same program without single copy.
    assert _arrival(tmp_path, "none", wait_s=2) == "NOT-ARRIVED"
