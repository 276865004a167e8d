"""jobs/train.py with --compression under mpirun: killed and resumed, a run ends bit for bit
where the uninterrupted one did, the compression's state (PowerSGD's error buffers and Q, the
parameter averages' reference) carried by the checkpoints; the replicas of a pipeline's stages
stay identical.

Tiny runs (MNIST-1D, 2 or 4 ranks, 50 steps) launched by ``scripts/mpirun.sh``; skipped when pytest
itself runs under mpirun.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hethpc.train.keep.checkpoint import CheckpointManager

ROOT = Path(__file__).resolve().parents[1]
MPIRUN = ROOT / "scripts" / "mpirun.sh"
JOB = ROOT / "jobs" / "train.py"

pytestmark = pytest.mark.skipif(
    "OMPI_COMM_WORLD_SIZE" in os.environ, reason="launches mpirun itself; run it outside mpirun"
)


def _run(
    cache: Path, run_dir: Path, *extra: str, np: int = 2
) -> subprocess.CompletedProcess[str]:
    argv = [
        "--samples", "2000", "--batch-size", "64", "--epochs", "2", "--model", "mlp",
        "--cache-dir", str(cache), "--run-dir", str(run_dir), "--checkpoint-every", "10",
        "--progress", "false", "--watchdog-s", "60", *extra,
    ]  # fmt: skip
    return subprocess.run(
        [str(MPIRUN), "-np", str(np), sys.executable, str(JOB), *argv],
        capture_output=True, text=True, timeout=180, cwd=ROOT,
        env={**os.environ, "HETHPC_MPIRUN_TIMEOUT": "180", "OMP_NUM_THREADS": "1"},
    )  # fmt: skip


def _final(run_dir: Path) -> dict:
    step, state = CheckpointManager(run_dir / "checkpoints").load_latest()  # type: ignore[misc]
    assert step == 50
    return state


def _equal(a: object, b: object, where: str) -> None:
    """Tensors, lists and dicts of them equal bit for bit."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for k in a:
            _equal(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list | tuple):
        assert isinstance(b, list | tuple) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _equal(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


@pytest.mark.parametrize(
    ("flags", "carried"),
    [
        (("--sync", "bsp", "--compression", "powersgd:2"), "codec"),
        (("--sync", "fedavg", "--fedavg-period", "4", "--compression", "fp16"), "reference"),
        (("--sync", "fedavg", "--fedavg-period", "4", "--compression", "int8"), "codec"),
    ],
    ids=["bsp-powersgd", "fedavg-fp16", "fedavg-int8"],
)
def test_a_killed_compressed_run_resumes_bit_identically(
    tmp_path: Path, flags: tuple[str, ...], carried: str
) -> None:
    cache, whole, run = tmp_path / "cache", tmp_path / "whole", tmp_path / "killed"
    proc = _run(cache, whole, *flags)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = _run(cache, run, *flags, "--fault", "1:25:kill")
    assert proc.returncode != 0
    proc = _run(cache, run, *flags, "--resume")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "resumed from step 20" in proc.stdout
    want, got = _final(whole), _final(run)
    for r, (w, g) in enumerate(zip(want["ranks"], got["ranks"], strict=True)):
        mine = w["policy"][carried]
        assert mine, (r, carried)  # the state is there, and not empty
        _equal(mine, g["policy"][carried], f"rank {r} policy {carried}")
        assert w["policy"]["tally"] == g["policy"]["tally"]  # the bytes counted
        for k, v in w.get("model", want["model"]).items():
            assert torch.equal(v, g.get("model", got["model"])[k]), (r, k)
    summary = json.loads((run / "summary.json").read_text())
    # Each counts what it sent uncompressed: powersgd its 10 plain steps (fedavg's averages
    # all travel in fp16, the first as its change since the broadcast start).
    assert summary["compression_ratio"] > 1.8


def test_a_resume_that_changes_the_compression_is_refused_unless_allowed(
    tmp_path: Path,
) -> None:
    cache, run = tmp_path / "cache", tmp_path / "run"
    proc = _run(cache, run, "--max-steps", "10")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = _run(cache, run, "--max-steps", "20", "--resume", "--resume-changes", "max_steps",
                "--compression", "bf16")  # fmt: skip
    assert proc.returncode != 0
    assert "compression: 'none' -> 'bf16'" in proc.stdout + proc.stderr
    proc = _run(cache, run, "--max-steps", "20", "--resume", "--resume-changes",
                "max_steps,compression", "--compression", "bf16")  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads((run / "summary.json").read_text())["compression"] == "bf16"


@pytest.mark.parametrize("compression", ["fp16", "powersgd:2"])
def test_the_replicas_of_each_pipeline_stage_stay_identical(
    tmp_path: Path, compression: str
) -> None:
    """P = 2 stages x D = 2 replicas: each stage's replicas average their gradients compressed
    (the policy runs over the stage's replica group) and end with the same parameters."""
    run = tmp_path / "run"
    proc = _run(tmp_path / "cache", run, "--pipeline-stages", "2", "--compression", compression,
                "--eval-every", "0", np=4)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ranks = _final(run)["ranks"]
    stages: dict[tuple[str, ...], list[dict]] = {}
    for state in ranks:  # the replicas of a stage hold the same layers
        stages.setdefault(tuple(state["model"]), []).append(state["model"])
    assert sorted(len(v) for v in stages.values()) == [2, 2]
    for replicas in stages.values():
        for k, v in replicas[0].items():
            assert torch.equal(v, replicas[1][k]), k
    summary = json.loads((run / "summary.json").read_text())
    assert summary["compression"] == compression and summary["compression_ratio"] > 1.9
