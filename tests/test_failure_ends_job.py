"""A rank that raises while the others wait in a collective ends the job: never a hang."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MPIRUN = ROOT / "scripts" / "mpirun.sh"

pytestmark = pytest.mark.skipif(
    "OMPI_COMM_WORLD_SIZE" in os.environ, reason="launches mpirun itself; run it outside mpirun"
)

WAITING_TEST = '''
import torch
from hethpc import comm

def test_one_rank_raises():
    comm.init()
    if comm.rank() == 1:
        raise RuntimeError("rank 1 fails on purpose")
    comm.allreduce(torch.ones(1))  # rank 0 waits here for a partner that never comes
'''

WAITING_SCRIPT = '''
import torch
from hethpc import comm
comm.abort_on_exception()
comm.init()
if comm.rank() == 1:
    raise RuntimeError("rank 1 fails on purpose")
comm.allreduce(torch.ones(1))
'''

# A user's own script: no abort_on_exception(); hethpc.comm.init() (as fit() and a
# Coordinator call it) installs it, so rank 1's exception still ends rank 0, which waits in an
# MPI collective (rank 1's MPI_Finalize at exit would wait for it: a hang without the hook).
USER_SCRIPT = WAITING_SCRIPT.replace("comm.abort_on_exception()\n", "").replace(
    "comm.allreduce(torch.ones(1))", "comm.barrier()"
)


def _run(args: list[str], timeout: float) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.perf_counter()
    proc = subprocess.run(
        [str(MPIRUN), "-np", "2", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, "HETHPC_MPIRUN_TIMEOUT": str(int(timeout))},
    )
    return proc, time.perf_counter() - t0


def test_pytest_under_mpirun_fails_instead_of_hanging(tmp_path: Path) -> None:
    test_dir = tmp_path / "mpi"
    test_dir.mkdir()
    (test_dir / "conftest.py").write_text((ROOT / "tests" / "mpi" / "conftest.py").read_text())
    (test_dir / "test_waits.py").write_text(WAITING_TEST)
    proc, took = _run(
        [sys.executable, "-m", "mpi4py", "-m", "pytest", "-p", "no:cacheprovider", str(test_dir)],
        timeout=120,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "rank 1 fails on purpose" in out, out
    assert took < 60, f"took {took:.1f} s"


def _failing_script(tmp_path: Path, text: str) -> str:
    """Run ``text`` as a script on 2 ranks; its output, after checking that the job failed
    within a minute instead of hanging."""
    script = tmp_path / "job.py"
    script.write_text(text)
    proc, took = _run([sys.executable, str(script)], timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert took < 60, f"took {took:.1f} s"
    return out


@pytest.mark.parametrize("text", [WAITING_SCRIPT, USER_SCRIPT], ids=["job", "user-script"])
def test_job_script_aborts_all_ranks_and_names_the_rank(tmp_path: Path, text: str) -> None:
    out = _failing_script(tmp_path, text)
    assert "[rank 1]" in out and "rank 1 fails on purpose" in out, out


MIXED_TRANSPORTS = '''
import os
from hethpc import comm
comm.init(transport="horovod" if os.environ["OMPI_COMM_WORLD_RANK"] == "1" else "mpi")
'''


def test_ranks_asking_for_different_transports_are_refused_not_hung(tmp_path: Path) -> None:
    # Rank 1 would wait in Horovod's start for a partner that never starts Horovod.
    out = _failing_script(tmp_path, MIXED_TRANSPORTS)
    assert "rank 0: 'mpi', rank 1: 'horovod'" in out and "--transport" in out, out
