"""The sbatch scripts: dry runs, and every script through ``sbatch`` on a real SLURM cluster.

The cluster (``tests/slurm_cluster.py``) runs on this host with two nodes; it needs root, and
installs Debian's SLURM packages when they are missing. Sizes are given on sbatch's command line
as ``slurm/README.md`` tells users to, fitted to this host. Jobs train MNIST-1D for 50 steps.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hethpc.cli import train as train_job

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((ROOT / "slurm").glob("*.sbatch"))

sys.path.insert(0, str(Path(__file__).resolve().parent))
from slurm_cluster import SlurmCluster, Unavailable  # noqa: E402


def _dry_run(script: Path, *args: str, rc: int = 0, **env: str) -> str:
    proc = subprocess.run(
        ["bash", str(script), *args],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "HETHPC_DRY_RUN": "1", **env},
    )
    assert proc.returncode == rc, proc.stderr
    return proc.stdout.strip() if rc == 0 else proc.stderr.strip()


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
def test_dry_run_prints_the_launch(name: str, launcher: list[str]) -> None:
    env = {"SLURM_SUBMIT_DIR": str(ROOT), "SLURM_JOB_ID": "4242", "SLURM_NTASKS": "8",
           "SLURM_CPUS_PER_TASK": "4", "SLURM_CLUSTER_NAME": "alpha",
           "SLURM_CPUS_PER_TASK_HET_GROUP_0": "3",
           "SLURM_CPUS_PER_TASK_HET_GROUP_1": "5"}  # fmt: skip
    out = _dry_run(ROOT / "slurm" / f"{name}.sbatch", "--epochs", "3", "--sync", "selsync", **env)
    words = shlex.split(out)
    for w in launcher:
        assert w in words, out
    job = str(ROOT / "jobs" / "train.py")
    assert words.index(launcher[0]) < words.index(job)
    assert words[0] == "OMP_NUM_THREADS=4"
    if name == "train_hetjob":  # each component's threads from its own allocation
        assert words[words.index("--het-group=0") + 1] == "--export=ALL,OMP_NUM_THREADS=3"
        assert words[words.index("--het-group=1") + 1] == "--export=ALL,OMP_NUM_THREADS=5"
    # Everything after the job script is a valid jobs/train.py command line.
    job_args = words[words.index(job) + 1 :]
    if ":" in job_args:
        job_args = job_args[: job_args.index(":")]
    cfg, _ = train_job.parse_config(job_args)
    assert (cfg.epochs, cfg.sync, cfg.resume) == (3, "selsync", False)
    assert cfg.run_dir == f"{ROOT}/runs/slurm-alpha-4242"


def test_mpirun_forwards_only_variables_that_are_set() -> None:
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    proc = subprocess.run(
        ["bash", str(ROOT / "slurm" / "train_mpirun.sbatch")], capture_output=True, text=True,
        env={**env, "HETHPC_DRY_RUN": "1"}, timeout=30,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "-x PATH" in proc.stdout and "LD_LIBRARY_PATH" not in proc.stdout


def test_run_directories_never_collide_and_a_requeued_job_resumes_its_own(tmp_path: Path) -> None:
    """Job ids restart on a new cluster: a fresh job takes a free name, a requeue its newest."""
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "slurm", repo / "slurm")
    (repo / "jobs").mkdir()
    shutil.copy(ROOT / "jobs" / "train.py", repo / "jobs")
    (repo / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "openmpi_env.sh", repo / "scripts")  # common.sh sources it
    script = repo / "slurm" / "train_cpu.sbatch"
    env = {"SLURM_SUBMIT_DIR": str(repo), "SLURM_JOB_ID": "6", "SLURM_CLUSTER_NAME": "c"}

    def run_dir(**extra: str) -> tuple[str, bool]:
        words = shlex.split(_dry_run(script, **{**env, **extra}))
        return words[words.index("--run-dir") + 1], "--resume" in words

    base = f"{repo}/runs/slurm-c-6"
    assert run_dir() == (base, False)
    Path(base).mkdir(parents=True)  # an old cluster's job 6
    assert run_dir() == (f"{base}.2", False)
    assert run_dir(SLURM_RESTART_COUNT="1") == (base, True)
    Path(f"{base}.2").mkdir()  # this cluster's job 6, started once, now requeued
    assert run_dir(SLURM_RESTART_COUNT="1") == (f"{base}.2", True)
    assert run_dir(HETHPC_RUN_DIR="/shared/run") == ("/shared/run", True)


def test_a_submission_outside_the_repository_is_refused(tmp_path: Path) -> None:
    err = _dry_run(ROOT / "slurm" / "train_cpu.sbatch", rc=2, SLURM_SUBMIT_DIR=str(tmp_path))
    assert err == (
        f"hethpc: {tmp_path} is not the hethpc repository: submit from its directory, "
        "or set HETHPC_ROOT"
    )


# -- on a real cluster ----------------------------------------------------------------------------
TRAIN = ["--samples", "2000", "--batch-size", "64", "--epochs", "2", "--model", "mlp",
         "--checkpoint-every", "10", "--watchdog-s", "60"]  # fmt: skip
# Per script: sbatch's size flags for this host, as slurm/README.md tells users to set them.
SIZES = {
    "train_cpu": ["--nodes=1", "--ntasks-per-node=2", "--cpus-per-task=1"],
    "train_gpu": ["--nodes=1", "--ntasks-per-node=2", "--gpus-per-task=1", "--cpus-per-task=1"],
    "train_mpirun": ["--nodes=1", "--ntasks-per-node=2", "--cpus-per-task=1"],
    "train_hetjob": ["--nodes=1", "--ntasks-per-node=1", "--cpus-per-task=1", ":",
                     "--nodes=1", "--ntasks-per-node=1", "--cpus-per-task=2"],
}  # fmt: skip


@pytest.fixture(scope="module")
def cluster() -> Iterator[SlurmCluster]:
    if "OMPI_COMM_WORLD_SIZE" in os.environ:
        pytest.skip("stands up a SLURM cluster; run it outside mpirun")
    try:
        c = SlurmCluster.start()
    except Unavailable as e:
        pytest.skip(f"no SLURM cluster on this host: {e}")
    yield c
    c.stop()
    for d in (ROOT / "runs").glob(f"slurm-{c.name}-*"):
        shutil.rmtree(d)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


def _submit(c: SlurmCluster, script: str, *args: str, sizes: list[str] | None = None,
            env: dict[str, str] | None = None) -> tuple[str, Path]:  # fmt: skip
    """Submit a script from the repository, as a user does; the job id and its log."""
    log = c.root / f"{script}-%j.out"
    job = c.sbatch([f"--output={log}", *(SIZES[script] if sizes is None else sizes),
                    f"slurm/{script}.sbatch", *args], cwd=ROOT, env=env)  # fmt: skip
    return job, Path(str(log).replace("%j", job))


@pytest.fixture(scope="module")
def finished(cluster: SlurmCluster, cache: Path) -> dict[str, tuple[str, Path, str]]:
    """Every script submitted at once (SLURM queues them by resources); job, log, final state."""
    scripts = [s for s in SIZES if cluster.two_nodes or s != "train_hetjob"]
    jobs = {s: _submit(cluster, s, *TRAIN, "--cache-dir", str(cache), "--batching", "dynamic")
            for s in scripts}  # fmt: skip
    return {s: (j, log, cluster.wait(j, timeout=240)) for s, (j, log) in jobs.items()}


@pytest.mark.parametrize("script", list(SIZES))
def test_every_script_completes_on_a_real_cluster(
    script: str, finished: dict[str, tuple[str, Path, str]], cluster: SlurmCluster
) -> None:
    if script not in finished:
        pytest.skip("a heterogeneous job needs two nodes, and this host cannot give two slurmd "
                    "their own mount namespaces (unshare -m failed)")  # fmt: skip
    job, log, state = finished[script]
    text = log.read_text()
    assert state == "COMPLETED", text + cluster.logs()
    # Both ranks found by MPI under the launcher, training finished, summary in the job log.
    assert re.search(r"^hethpc: 2 rank\(s\), data-parallel", text, re.M), text
    assert re.search(r"^test accuracy \(averaged model\)\s+\d+\.\d+ %$", text, re.M), text
    assert re.search(r"^ranks\s+2$", text, re.M), text
    run_dir = ROOT / "runs" / f"slurm-{cluster.name}-{job}"
    assert f"hethpc: run directory {run_dir}" in text
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 50
    info = cluster.run(["scontrol", "show", "job", "-d", "-o", job]).stdout
    if script == "train_gpu":  # two GPUs scheduled, one per task
        assert "JOB_GRES=gpu:2 " in info, info
    if script == "train_hetjob":  # each component's ranks use their own CPU count
        assert "--het-group=0 --export=ALL,OMP_NUM_THREADS=1 " in text
        assert "--het-group=1 --export=ALL,OMP_NUM_THREADS=2 " in text
        assert re.findall(r" NodeList=(\S+)", info) == ["n1", "n2"], info


def test_a_failing_rank_fails_the_job_and_a_second_job_resumes(
    cluster: SlurmCluster, cache: Path, tmp_path: Path
) -> None:
    shared = {"HETHPC_RUN_DIR": str(tmp_path / "run")}
    args = [*TRAIN, "--cache-dir", str(cache)]
    job, log = _submit(cluster, "train_cpu", *args, "--fault", "1:25:kill", env=shared)
    assert cluster.wait(job, timeout=180) == "FAILED", log.read_text()
    job, log = _submit(cluster, "train_cpu", *args, env=shared)
    assert cluster.wait(job, timeout=180) == "COMPLETED", log.read_text()
    text = log.read_text()
    assert re.search(r"^hethpc: resumed from step 20\b", text, re.M), text
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["steps"] == 50


def _ranks(run_dir: Path) -> list[str]:
    out = subprocess.run(["pgrep", "-f", f"jobs/train.py --run-dir {run_dir}"],
                         capture_output=True, text=True).stdout  # fmt: skip
    return out.split()


def test_scancel_ends_every_rank_within_10_s(
    cluster: SlurmCluster, cache: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "long"
    args = [*TRAIN, "--cache-dir", str(cache), "--epochs", "1000"]
    job, log = _submit(cluster, "train_cpu", *args, env={"HETHPC_RUN_DIR": str(run_dir)})
    deadline = time.monotonic() + 120
    while "epoch 1/1000" not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline, log.read_text() if log.exists() else cluster.logs()
        time.sleep(0.3)
    assert len(_ranks(run_dir)) >= 2
    t0 = time.monotonic()
    cluster.run(["scancel", job])
    while _ranks(run_dir):
        assert time.monotonic() - t0 < 10, f"ranks {_ranks(run_dir)} alive after scancel"
        time.sleep(0.1)
    assert cluster.wait(job, timeout=30) == "CANCELLED"
