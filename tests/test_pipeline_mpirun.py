"""Runs the pipeline's distributed tests on 4 ranks (P=2 x D=2, P=4), which `make test` lacks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(
    "OMPI_COMM_WORLD_SIZE" in os.environ or "PMI_SIZE" in os.environ,
    reason="launches mpirun itself; run it outside mpirun",
)


@pytest.mark.timeout(300)
def test_pipeline_tests_pass_on_four_ranks() -> None:
    found = (ROOT / "tests" / "mpi").glob("test_pipeline_*.py")
    tests = sorted(str(p.relative_to(ROOT)) for p in found)
    assert tests, "no tests/mpi/test_pipeline_*.py found"
    proc = subprocess.run(
        [
            str(ROOT / "scripts" / "mpirun.sh"), "-np", "4",
            sys.executable, "-m", "mpi4py", "-m", "pytest",
            "-q", "--color=no", "-p", "no:cacheprovider", "-rs", *tests,
        ],
        capture_output=True,
        text=True,
        timeout=280,
        cwd=ROOT,
        # 4 ranks on fewer cores: ranks waiting in MPI yield their core instead of spinning.
        env={
            **os.environ,
            "HETHPC_MPIRUN_TIMEOUT": "270",
            "OMP_NUM_THREADS": "1",
            "OMPI_MCA_mpi_yield_when_idle": "1",
        },
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert " passed" in out and " failed" not in out, out[-6000:]
    # The 4-rank configurations really ran (they skip at other world sizes).
    assert "P=2 x D=2 needs" not in out, out[-6000:]
