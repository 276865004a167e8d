"""The sbatch scripts: valid bash, and dry runs that print the launch command they would run."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((ROOT / "slurm").glob("*.sbatch"))

sys.path.insert(0, str(ROOT / "jobs"))
import train as train_job  # noqa: E402


def _dry_run(script: Path, *args: str, **env: str) -> str:
    proc = subprocess.run(
        ["bash", str(script), *args],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "HETHPC_DRY_RUN": "1", **env},
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_every_script_is_listed() -> None:
    assert {p.name for p in SCRIPTS} == {
        "train_cpu.sbatch",
        "train_gpu.sbatch",
        "train_mpirun.sbatch",
        "train_hetjob.sbatch",
    }


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_bash_syntax(script: Path) -> None:
    subprocess.run(["bash", "-n", str(script)], check=True, timeout=30)


@pytest.mark.parametrize(
    ("name", "launcher"),
    [
        ("train_cpu", ["srun", "--mpi=pmix", "--kill-on-bad-exit=1"]),
        ("train_gpu", ["srun", "--gpu-bind=single:1"]),
        ("train_mpirun", ["mpirun", "-np", "8", "--timeout"]),
        ("train_hetjob", ["srun", "--het-group=0", ":", "--het-group=1"]),
    ],
    ids=["cpu", "gpu", "mpirun", "hetjob"],
)
def test_dry_run_prints_the_launch(name: str, launcher: list[str], tmp_path: Path) -> None:
    env = {"SLURM_SUBMIT_DIR": str(tmp_path), "SLURM_JOB_ID": "4242", "SLURM_NTASKS": "8",
           "SLURM_CPUS_PER_TASK": "4"}  # fmt: skip
    out = _dry_run(ROOT / "slurm" / f"{name}.sbatch", "--epochs", "3", "--sync", "selsync", **env)
    words = shlex.split(out)
    for w in launcher:
        assert w in words, out
    assert words.index(launcher[0]) < words.index(f"{tmp_path}/jobs/train.py")
    if name != "train_hetjob":
        assert words[0] == "OMP_NUM_THREADS=4"
    # Everything after the job script is a valid jobs/train.py command line.
    job_args = words[words.index(f"{tmp_path}/jobs/train.py") + 1 :]
    if ":" in job_args:
        job_args = job_args[: job_args.index(":")]
    cfg, _ = train_job.parse_config(job_args)
    assert (cfg.epochs, cfg.sync, cfg.resume) == (3, "selsync", True)
    assert cfg.run_dir == f"{tmp_path}/runs/slurm-4242"
