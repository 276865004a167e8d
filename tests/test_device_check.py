"""scripts/device_check.sh on CPU (--cpu --small): every step runs, GPU-only items say so."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(
    "OMPI_COMM_WORLD_SIZE" in os.environ or "PMI_SIZE" in os.environ,
    reason="launches mpirun itself; run it outside mpirun",
)


@pytest.mark.timeout(240)
def test_device_check_on_cpu() -> None:
    proc = subprocess.run(
        [str(ROOT / "scripts" / "device_check.sh"), "--cpu", "--small", "--budget-s", "200"],
        capture_output=True, text=True, timeout=230, cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines, out[-4000:]
    res = json.loads(lines[-1])  # one JSON line at the end
    assert proc.returncode == 0 and res["ok"], json.dumps(res, indent=1)
    assert (res["device_check"], res["gpus"]) == ("cpu", 0)
    assert res["nccl_allreduce"] == "skipped: no GPU"
    assert res["train"]["timing"] == "skipped: no GPU"
    assert res["build"]["setup_plan"]["gpu"] is False
    assert res["allreduce"]["sum"] == 3.0 and res["allreduce"]["ranks"] == 2
    assert res["pipeline"]["same_loss"] and res["pipeline"]["same_gradients"]
    assert res["train"]["device"] == "cpu" and res["train"]["transfers"]["p2p"] == "host memory"
    assert len(res["train"]["max_rank_batch"]) == 2  # each rank's cap, measured (auto)
    assert res["bench_pipeline"]["speedup"] > 0 and res["bench_pipeline"]["device"] == "cpu"
