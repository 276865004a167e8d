"""Shared by the benchmarks: relaunch a plain ``python benchmarks/x.py`` under mpirun."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


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
    return subprocess.run(cmd, cwd=ROOT, env=env, check=False).returncode
