"""The device a rank computes on: a pure choice from the setting, its local rank and the GPUs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hethpc.train import ConfigError
from hethpc.train.parts.device import pick_device, ranks_sharing

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "setting, local_rank, gpus, expected",
    [
        pytest.param("auto", 0, 0, "cpu", id="auto-no-gpu"),
        pytest.param("auto", 3, 4, "cuda:3", id="auto-one-rank-per-gpu"),
        pytest.param("auto", 5, 4, "cuda:1", id="auto-more-ranks-than-gpus"),
        pytest.param("cuda", 1, 1, "cuda:0", id="cuda-two-ranks-share-one-gpu"),
        pytest.param("cpu", 0, 8, "cpu", id="cpu-on-a-gpu-node"),
    ],
)
def test_pick_device(setting: str, local_rank: int, gpus: int, expected: str) -> None:
    assert pick_device(setting, local_rank=local_rank, gpus=gpus) == torch.device(expected)


@pytest.mark.parametrize(
    "local_rank, local_size, gpus, expected",
    [
        pytest.param(0, 2, 1, 2, id="two-ranks-one-gpu"),
        pytest.param(1, 4, 4, 1, id="one-rank-per-gpu"),
        pytest.param(1, 5, 2, 2, id="ranks-1-and-3-on-gpu-1"),
        pytest.param(0, 5, 2, 3, id="ranks-0-2-4-on-gpu-0"),
        pytest.param(0, 2, 0, 1, id="no-gpu"),
    ],
)
def test_ranks_sharing_a_gpu(local_rank: int, local_size: int, gpus: int, expected: int) -> None:
    assert ranks_sharing(local_rank, local_size, gpus) == expected


def test_cuda_without_a_gpu_says_how_to_fix_it() -> None:
    with pytest.raises(ConfigError, match=r"device = 'cuda', but this process sees no GPU.*"
                       r"CUDA_VISIBLE_DEVICES.*use device cpu or auto"):
        pick_device("cuda", local_rank=0, gpus=0)


def test_unknown_setting() -> None:
    with pytest.raises(ConfigError, match=r"device = 'tpu' is not one of"):
        pick_device("tpu", local_rank=0, gpus=1)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_the_job_refuses_cuda_without_a_gpu_before_it_starts(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "jobs" / "train.py"), "--device", "cuda",
         "--run-dir", str(run_dir), "--max-steps", "1"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "device = 'cuda', but this process sees no GPU" in proc.stderr
    assert "Traceback" not in proc.stderr and not run_dir.exists()


def test_a_run_records_its_device_and_transfer_paths(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "jobs" / "train.py"), "--device", "cpu", "--run-dir",
         str(run_dir), "--samples", "2000", "--epochs", "1", "--max-steps", "2",
         "--progress", "false"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    config = json.loads((run_dir / "config.json").read_text())
    summary = json.loads((run_dir / "summary.json").read_text())
    assert config["device"] == "cpu" and summary["device"] == "cpu"
    assert config["transfers"] == summary["transfers"]
    assert set(config["transfers"]) == {"gpu", "cuda_aware_mpi", "cuda_aware_source", "p2p",
                                        "allreduce"}  # fmt: skip
    assert "data-parallel on cpu" in proc.stdout
