"""The examples, run as a user runs them: 2 MPI ranks, their own models and data."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MPIRUN = ROOT / "scripts" / "mpirun.sh"

pytestmark = pytest.mark.skipif(
    "OMPI_COMM_WORLD_SIZE" in os.environ, reason="launches mpirun itself; run it outside mpirun"
)


def _run(*argv: str, np: int = 2, timeout: float = 240) -> str:
    cmd = [str(MPIRUN), "-np", str(np), sys.executable, *argv] if np else [sys.executable, *argv]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
        env={**os.environ, "HETHPC_MPIRUN_TIMEOUT": str(int(timeout)), "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    return out


def test_regression_on_numpy_arrays_through_the_api(tmp_path: Path) -> None:
    out = _run("examples/regression_numpy.py", "--sync", "selsync", "--run-dir", str(tmp_path))
    mse = float(re.search(r"test mse ([0-9.]+)", out).group(1))  # type: ignore[union-attr]
    assert mse < 0.75, out  # predicting the mean scores 1.0
    assert out.count("test mse") == 1, out  # rank 0 speaks
    assert json.loads((tmp_path / "summary.json").read_text())["test_mse"] == pytest.approx(
        mse, abs=1e-3
    )


def test_a_cifar_format_model_through_the_cli(tmp_path: Path) -> None:
    raw, h5, run = tmp_path / "raw", tmp_path / "h5", tmp_path / "run"
    _run("examples/cifar_cli/make_batches.py", "--out", str(raw), "--per-batch", "400", np=0)
    _run("data_tools/convert.py", "cifar", str(raw / "data_batch_1"), str(raw / "data_batch_2"),
         "--test", str(raw / "test_batch"), "--out", str(h5), np=0)  # fmt: skip
    _run("jobs/train.py", "--data", str(h5), "--model", "examples/cifar_cli/model.py:make",
         "--epochs", "4", "--batch-size", "64", "--lr", "0.05", "--progress", "false",
         "--run-dir", str(run))  # fmt: skip
    summary = json.loads((run / "summary.json").read_text())
    # uint8 images, scaled alike in training and evaluation: far above chance (10 classes).
    assert summary["test_acc"] > 0.3, summary


def test_the_coordinator_in_a_users_own_loop() -> None:
    out = _run("examples/own_loop.py", "--steps", "150", "--batching", "dynamic",
               "--slowdown", "1:2@0")  # fmt: skip
    m = re.search(r"test accuracy ([0-9.]+)%  batch sizes \[(\d+), (\d+)\]", out)
    assert m is not None, out
    acc, b0, b1 = float(m.group(1)), int(m.group(2)), int(m.group(3))
    assert acc > 80, out
    assert b0 + b1 == 256 and b0 > b1, out  # rank 1 is emulated 2x slower: a smaller share


def test_the_text_example_trains_gpt_tiny_by_site_on_two_ranks(tmp_path: Path) -> None:
    data, run = tmp_path / "stdlib64", tmp_path / "run"
    stdlib = sysconfig.get_paths()["stdlib"]  # two packages of it: the README converts it all
    _run("-m", "hethpc.cli.convert", "text", f"{stdlib}/json", f"{stdlib}/email",
         "--context", "64", "--out", str(data), np=0)  # fmt: skip
    out = _run("jobs/train.py", "--config", "examples/text/text.toml", "--data", str(data),
               "--run-dir", str(run), "--max-steps", "60", "--eval-every-steps", "20",
               "--progress", "false")  # fmt: skip
    summary = json.loads((run / "summary.json").read_text())
    scores = [r["val_bpb"] for r in map(json.loads, (run / "metrics/rank0.jsonl").open())
              if r["kind"] == "epoch"]  # fmt: skip
    assert summary["config"]["partition"] == "site" and summary["world_size"] == 2, summary
    assert len(scores) == 3 and scores[-1] < scores[0] < 6.0, (scores, out)  # 8: a guess
    assert summary["test_bpb"] < 5.0, summary
    assert out.count("validation bits per byte") == 4, out  # rank 0 speaks: 3 + the summary
