"""jobs/train.py end to end under mpirun: kill and resume, failures that end the job, guards.

Each test launches ``scripts/mpirun.sh`` itself with tiny runs (MNIST-1D, 1,600 training
samples, 2 ranks, 50 steps), so it is skipped when pytest itself runs under mpirun.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from hethpc.cli.train import resume_command
from hethpc.train import read_metrics
from hethpc.train.keep.checkpoint import CheckpointManager

ROOT = Path(__file__).resolve().parents[1]
MPIRUN = ROOT / "scripts" / "mpirun.sh"
JOB = ROOT / "jobs" / "train.py"

pytestmark = pytest.mark.skipif(
    "OMPI_COMM_WORLD_SIZE" in os.environ, reason="launches mpirun itself; run it outside mpirun"
)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


def _args(cache: Path, run_dir: Path, *extra: str) -> list[str]:
    return [
        "--samples", "2000", "--batch-size", "64", "--epochs", "2", "--model", "mlp",
        "--cache-dir", str(cache), "--run-dir", str(run_dir), "--checkpoint-every", "10",
        "--progress", "false", "--watchdog-s", "60", *extra,
    ]  # fmt: skip


def _launch(
    argv: list[str], *, np: int | None = 2, timeout: float = 120
) -> tuple[subprocess.CompletedProcess[str], float]:
    """``np`` ranks of the job with ``argv``; np=None: mpirun ``argv``; np=0: ``argv`` alone."""
    if np is None:
        cmd = [str(MPIRUN), *argv]
    elif np == 0:
        cmd = argv
    else:
        cmd = [str(MPIRUN), "-np", str(np), sys.executable, str(JOB), *argv]
    t0 = time.perf_counter()
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
        env={**os.environ, "HETHPC_MPIRUN_TIMEOUT": str(int(timeout)), "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    return proc, time.perf_counter() - t0


def _final(run_dir: Path) -> dict:
    m = CheckpointManager(run_dir / "checkpoints")
    step, state = m.load_latest()  # type: ignore[misc]
    assert step == 50
    return state


@pytest.fixture(scope="module")
def uninterrupted(cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("full")
    proc, _ = _launch(_args(cache, run))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return run


def test_run_writes_metrics_summary_and_checkpoints(uninterrupted: Path) -> None:
    for r in (0, 1):
        steps = [m for m in read_metrics(uninterrupted / "metrics" / f"rank{r}.jsonl")
                 if m["kind"] == "step"]  # fmt: skip
        assert [m["step"] for m in steps] == list(range(50))
        assert {m["batch"] for m in steps} == {32} and all(m["synced"] for m in steps)
    assert (uninterrupted / "summary.json").exists()
    assert CheckpointManager(uninterrupted / "checkpoints").steps() == [30, 40, 50]


def test_both_transports_train_the_same_model(
    uninterrupted: Path, cache: Path, tmp_path: Path
) -> None:
    # The default on CPU ranks (auto) is mpi4py alone; Horovod must train the same model.
    run = tmp_path / "horovod"
    proc, _ = _launch(_args(cache, run, "--transport", "horovod"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    transports = {json.loads((r / "summary.json").read_text())["transport"]
                  for r in (uninterrupted, run)}  # fmt: skip
    assert transports == {"mpi", "horovod"}
    want, got = _final(uninterrupted), _final(run)
    for k, v in want["model"].items():
        torch.testing.assert_close(got["model"][k], v, rtol=1e-5, atol=1e-6, msg=k)


def test_killed_rank_ends_the_job_and_resume_is_bit_identical(
    uninterrupted: Path, cache: Path, tmp_path: Path
) -> None:
    run = tmp_path / "killed"
    proc, took = _launch(_args(cache, run, "--fault", "1:25:kill"))
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "rank 1" in out and "signal 9" in out, out
    assert took < 60, f"the job took {took:.1f} s to end after a rank was killed"
    assert CheckpointManager(run / "checkpoints").steps() == [10, 20]

    proc, _ = _launch(_args(cache, run, "--resume"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "resumed from step 20" in proc.stdout
    want, got = _final(uninterrupted), _final(run)
    for k, v in want["model"].items():
        assert torch.equal(v, got["model"][k]), k
    for k, v in want["optimizer"]["state"].items():
        assert torch.equal(v["momentum_buffer"], got["optimizer"]["state"][k]["momentum_buffer"])


def test_resume_on_one_rank_keeps_the_global_batch(
    uninterrupted: Path, cache: Path, tmp_path: Path
) -> None:
    run = tmp_path / "shrunk"
    (run / "checkpoints").mkdir(parents=True)
    (run / ".hethpc-run").write_bytes((uninterrupted / ".hethpc-run").read_bytes())
    for p in (uninterrupted / "checkpoints").glob("ckpt-000000030.pt*"):
        (run / "checkpoints" / p.name).write_bytes(p.read_bytes())
    proc, _ = _launch([sys.executable, str(JOB), *_args(cache, run, "--resume")], np=0)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "saved on 2 ranks, re-split over 1" in proc.stdout
    recs = read_metrics(run / "metrics" / "rank0.jsonl")
    steps = [m for m in recs if m["kind"] == "step"]
    assert [m["step"] for m in steps] == list(range(30, 50)) and steps[0]["batch"] == 64
    (resumed,) = [m for m in recs if m["kind"] == "resume"]  # where jobs/report.py marks it
    assert resumed["step"] == 30 and 0 < resumed["time"] <= steps[0]["time"]
    # The same samples per step, summed in another order: equal up to float rounding.
    want, got = _final(uninterrupted), _final(run)
    for k, v in want["model"].items():
        torch.testing.assert_close(got["model"][k], v, rtol=1e-4, atol=1e-5)
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["steps"], summary["synced_steps"], summary["sync_fraction"]) == (50, 50, 1.0)


def test_config_mismatch_is_refused_naming_setting_and_ranks(cache: Path, tmp_path: Path) -> None:
    a = [sys.executable, str(JOB), *_args(cache, tmp_path, "--seed", "0")]
    b = [sys.executable, str(JOB), *_args(cache, tmp_path, "--seed", "3")]
    proc, took = _launch(["-np", "1", *a, ":", "-np", "1", *b], np=None)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "seed (rank 0: 0, rank 1: 3)" in out, out
    assert took < 60


@pytest.mark.parametrize(
    ("setting", "ok", "sync"),
    [("skip", True, "bsp"), ("stop", False, "bsp"), ("skip", True, "selsync")],
    ids=["skip-everywhere", "stop", "selsync-skip-everywhere"],
)
def test_nonfinite_loss_on_one_rank(
    cache: Path, tmp_path: Path, setting: str, ok: bool, sync: str
) -> None:
    # BSP catches it in the averaged gradient, SelSync inside its per-step vote.
    extra = ("--fault", "1:5:nan", "--on-nonfinite", setting, "--max-steps", "12", "--sync", sync)
    proc, _ = _launch(_args(cache, tmp_path, *extra))
    out = proc.stdout + proc.stderr
    assert "non-finite loss or gradient at step 5 on rank(s) [1]" in out, out
    assert (proc.returncode == 0) is ok, out
    if ok:
        for r in (0, 1):
            recs = [m for m in read_metrics(tmp_path / "metrics" / f"rank{r}.jsonl")
                    if m["kind"] == "step"]  # fmt: skip
            assert [m["step"] for m in recs if m["skipped"]] == [5]
        state = CheckpointManager(tmp_path / "checkpoints").load_latest()[1]  # type: ignore[index]
        assert all(torch.isfinite(v).all() for v in state["model"].values())
        summary = json.loads((tmp_path / "summary.json").read_text())
        # The skipped step is not a synchronised one (BSP's own counter says it was).
        assert summary["skipped_steps"] == 1, summary
        if sync == "bsp":
            assert summary["synced_steps"] == 11, summary


def _stall_args(cache: Path, run_dir: Path, *extra: str) -> list[str]:
    # The default watchdog settings: no --watchdog-s.
    return [
        "--samples", "20000", "--batch-size", "64", "--epochs", "50", "--model", "mlp",
        "--cache-dir", str(cache), "--run-dir", str(run_dir), "--progress", "false", *extra,
    ]  # fmt: skip


def _heartbeat(run_dir: Path, rank: int, *, past_step: int, timeout: float = 60) -> dict:
    """Rank ``rank``'s heartbeat once it is past ``past_step`` (the job is training)."""
    path = run_dir / "heartbeat" / f"rank{rank}.json"
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            beat = json.loads(path.read_text())
            if beat["step"] > past_step:
                return beat
        except (OSError, ValueError):
            pass
        time.sleep(0.2)
    raise AssertionError(f"no heartbeat past step {past_step} in {path}")


def test_a_rank_stopped_by_sigstop_ends_the_job_within_a_minute(
    cache: Path, tmp_path: Path
) -> None:
    # A shorter watchdog than the default (the stall test below keeps the default's minute).
    argv = _stall_args(cache, tmp_path, "--watchdog-s", "8")
    proc = subprocess.Popen(
        [str(MPIRUN), "-np", "2", sys.executable, str(JOB), *argv],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
        env={**os.environ, "HETHPC_MPIRUN_TIMEOUT": "300", "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    try:
        beat = _heartbeat(tmp_path, 1, past_step=20)
        os.kill(beat["pid"], signal.SIGSTOP)
        t0 = time.perf_counter()
        out, _ = proc.communicate(timeout=120)
        took = time.perf_counter() - t0
    finally:
        proc.kill()
    assert proc.returncode != 0, out
    assert f"Stalled: rank 1 (pid {beat['pid']}" in out and "stopped (SIGSTOP" in out, out
    assert "Traceback" not in out, out
    assert took < 30, f"the job took {took:.1f} s to end after rank 1 was stopped (watchdog 8 s)"


def test_a_stalled_rank_ends_the_job_within_a_minute(cache: Path, tmp_path: Path) -> None:
    proc, took = _launch(_stall_args(cache, tmp_path, "--fault", "1:30:stall"), timeout=150)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "Stalled: rank 1" in out and "at step 30, compute" in out, out
    assert took < 75, f"the job took {took:.1f} s in all (the stall came after start-up)"


def test_fresh_run_refuses_to_overwrite_a_previous_one(uninterrupted: Path, cache: Path) -> None:
    proc, _ = _launch([sys.executable, str(JOB), *_args(cache, uninterrupted)], np=0)
    assert proc.returncode != 0
    assert "already holds a run" in proc.stderr


@pytest.mark.parametrize("schedule", ["1f1b", "zbv"])
def test_pipeline_stages_train_through_the_job(cache: Path, tmp_path: Path, schedule: str) -> None:
    # P=2 stages of the 'large' model on 2 ranks (D=1): the loss falls, accuracy beats chance,
    # and the losses are those of the same model trained in one process (same batches). zbv
    # cuts it into 4 chunks, two per rank in a V: rank 0 holds the last one and the loss.
    argv = [
        "--samples", "2000", "--batch-size", "32", "--model", "large", "--epochs", "2",
        "--max-steps", "60", "--optimizer", "adam", "--lr", "0.0003", "--micro-batches", "4",
        "--cache-dir", str(cache), "--progress", "false", "--eval-every", "0",
    ]  # fmt: skip
    pipe, one = tmp_path / "pipe", tmp_path / "one"
    pipeline = ["--pipeline-stages", "2", "--schedule", schedule, "--run-dir", str(pipe)]
    proc, _ = _launch([*argv, *pipeline], timeout=180)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "2 pipeline stages x 1 replica(s)" in out and f"({schedule})" in out, out
    summary = json.loads((pipe / "summary.json").read_text())
    chunks, loss_rank = (4, 0) if schedule == "zbv" else (2, 1)
    assert summary["pipeline_stages"] == 2 and len(summary["balance"]) == chunks
    assert summary["final_loss"] < 0.9 * summary["first_loss"], summary
    assert summary["test_acc"] > 0.2, summary  # 10 classes: chance is 0.1
    steps = {r: [m for m in read_metrics(pipe / "metrics" / f"rank{r}.jsonl")
                 if m["kind"] == "step"] for r in (0, 1)}  # fmt: skip
    last = steps[loss_rank]
    assert len(last) == 60 and all(m["loss"] is None for m in steps[1 - loss_rank])
    proc, _ = _launch([*argv, "--run-dir", str(one)], np=1, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ref = [m["loss"] for m in read_metrics(one / "metrics" / "rank0.jsonl") if m["kind"] == "step"]
    assert [m["loss"] for m in last][:10] == pytest.approx(ref[:10], rel=1e-3)


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (("--pipeline-stages", "3"), "must divide the number of ranks 2"),
        (("--pipeline-stages", "2", "--inject-alpha", "0.5", "--inject-beta", "0.2"),
         "supports only: no --inject-alpha"),
        (("--pipeline-stages", "2", "--pipeline-balance", "10,10"),
         "pipeline_balance = '10,10' for model large: balance [10, 10] covers 20 layers but the "
         "model has 26"),
    ],
    ids=["indivisible", "unsupported-sync", "given-cut-not-the-model"],
)
def test_pipeline_settings_are_refused(
    cache: Path, tmp_path: Path, extra: tuple[str, ...], match: str
) -> None:
    proc, _ = _launch(_args(cache, tmp_path, "--model", "large", *extra))
    assert proc.returncode != 0 and match in proc.stdout + proc.stderr, proc.stdout + proc.stderr


def test_a_damaged_newest_checkpoint_is_skipped_with_one_line_and_set_aside(
    uninterrupted: Path, cache: Path, tmp_path: Path
) -> None:
    run = tmp_path / "damaged"
    (run / "checkpoints").mkdir(parents=True)
    (run / ".hethpc-run").write_bytes((uninterrupted / ".hethpc-run").read_bytes())
    for p in (uninterrupted / "checkpoints").glob("ckpt-*.pt*"):
        (run / "checkpoints" / p.name).write_bytes(p.read_bytes())
    newest = run / "checkpoints" / "ckpt-000000050.pt"
    newest.write_bytes(newest.read_bytes()[:100])
    proc, _ = _launch([sys.executable, str(JOB), *_args(cache, run, "--resume")], np=0)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "jobs/train.py: warning: skipping checkpoint" in proc.stderr, proc.stderr
    assert "CheckpointWarning" not in proc.stderr and "warnings.warn" not in proc.stderr
    assert "resumed from step 40" in proc.stdout
    assert (run / "checkpoints" / "ckpt-000000050.pt.corrupt").is_file()
    assert CheckpointManager(run / "checkpoints").steps() == [30, 40, 50]


def test_resume_refuses_changed_settings_unless_allowed(uninterrupted: Path, cache: Path) -> None:
    job = [sys.executable, str(JOB), *_args(cache, uninterrupted, "--resume")]
    for extra, named in ((["--lr", "0.5"], "lr: 0.05 -> 0.5"),
                         (["--optimizer", "adam"], "optimizer: 'sgd' -> 'adam'")):  # fmt: skip
        proc, _ = _launch([*job, *extra], np=0)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert named in proc.stderr and "--resume-changes" in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr
    proc, _ = _launch([*job, "--lr", "0.5", "--resume-changes", "lr"], np=0)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--epcohs", "3"), "unrecognized arguments: --epcohs"),
        (("--lr", "nan"), "lr = nan: expected a finite number (set by --lr)"),
        (("--fault", "3:5:raise"), "--fault names rank(s) [3], but the job has ranks 0-1"),
        (("--data", "/nonexistent/data"), "/nonexistent/data"),
    ],
    ids=["typo", "nan", "fault-rank", "missing-data"],
)
def test_a_user_error_is_one_message_from_rank_0(
    cache: Path, tmp_path: Path, extra: tuple[str, ...], message: str
) -> None:
    proc, took = _launch(_args(cache, tmp_path / "run", *extra))
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert out.count(message) == 1, out
    assert "Traceback" not in out and "[rank 1]" not in out, out
    assert took < 60


def test_steps_that_stay_nonfinite_stop_the_job(cache: Path, tmp_path: Path) -> None:
    proc, _ = _launch(_args(cache, tmp_path, "--lr", "1e30", "--max-skipped-steps", "3"))
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "4 steps in a row" in out and "Lower --lr" in out, out
    assert "Traceback" not in out, out


def _whole_model(state: dict) -> dict[str, torch.Tensor]:
    """A 2-stage pipeline checkpoint's stages joined into the whole model's state dict, by
    the cut it was saved under (stage 1 keys its layers from 0)."""
    first = state["cut"][0]
    out = {}
    for stage in (0, 1):
        for k, v in state["ranks"][stage]["model"].items():
            layer, rest = k.split(".", 1)
            out[f"{int(layer) + first * stage}.{rest}"] = v
    return out


_PIPELINE_ARGS = [
    "--samples", "2000", "--batch-size", "32", "--model", "large", "--epochs", "1",
    "--max-steps", "40", "--optimizer", "adam", "--lr", "0.0003", "--micro-batches", "4",
    "--progress", "false", "--eval-every", "0", "--pipeline-stages", "2",
    "--checkpoint-every", "10",
]  # fmt: skip


@pytest.mark.parametrize("balance", ["params", "time"])
def test_pipeline_checkpoint_kill_and_resume_is_bit_identical(
    cache: Path, tmp_path: Path, balance: str
) -> None:
    # P=2 stages on 2 ranks, SelSync's decisions over the stage groups, checkpoints every 10.
    # Cut by time, the resumed run keeps its cut unless the speeds measured at the resume
    # call for another (the stages then move to it); the model is the same either way.
    argv = [
        *_PIPELINE_ARGS, "--cache-dir", str(cache), "--sync", "selsync",
        "--pipeline-balance", balance,
    ]  # fmt: skip
    full, killed = tmp_path / "full", tmp_path / "killed"
    proc, _ = _launch([*argv, "--run-dir", str(full)], timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc, _ = _launch([*argv, "--run-dir", str(killed), "--fault", "0:25:kill"], timeout=180)
    assert proc.returncode != 0
    assert CheckpointManager(killed / "checkpoints").steps() == [10, 20]
    cut = json.loads((killed / "pipeline_cut.json").read_text())
    assert cut["by"] == balance and len(cut["balance"]) == 2
    proc, _ = _launch([*argv, "--run-dir", str(killed), "--resume"], timeout=180)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "resumed from step 20" in out, out
    want = CheckpointManager(full / "checkpoints").load_latest()[1]  # type: ignore[index]
    got = CheckpointManager(killed / "checkpoints").load_latest()[1]  # type: ignore[index]
    assert want["step"] == got["step"] == 40
    summary = json.loads((killed / "summary.json").read_text())
    if balance == "params":  # the same cut again, no re-cut
        assert json.loads((killed / "pipeline_cut.json").read_text()) == cut
        assert "re-cut" not in out and summary["recut_from"] is None, out
    assert got["cut"] == summary["balance"]
    assert (summary["recut_from"] is not None) == ("pipeline re-cut" in out), out
    whole_want, whole_got = _whole_model(want), _whole_model(got)
    assert whole_want.keys() == whole_got.keys()
    for k, v in whole_want.items():  # the whole model, bit for bit, whatever the cuts
        assert torch.equal(v, whole_got[k]), k
    last = [m for m in read_metrics(killed / "metrics" / "rank1.jsonl") if m["kind"] == "step"]
    assert all(m["loss"] is not None for m in last)  # the last stage holds the loss
    assert summary["steps"] == 40 and summary["final_loss"] < summary["first_loss"], summary


def test_pipeline_resume_recut_moves_the_stages_and_trains_on_exactly(
    cache: Path, tmp_path: Path
) -> None:
    # Cut by parameters ([12, 14] for `large`: its first Linear is small), killed at step 25,
    # resumed with the cut given as [14, 12]: each rank's layers, Adam moments and step move
    # to the rank that now holds them, and the last 20 steps give the uninterrupted run's
    # model bit for bit. (A cut by time moves the stages the same way; which cut the
    # measured speeds pick depends on the host: the parametrized test above takes either.)
    argv = [*_PIPELINE_ARGS, "--cache-dir", str(cache), "--pipeline-balance", "params"]
    full, killed = tmp_path / "full", tmp_path / "killed"
    proc, _ = _launch([*argv, "--run-dir", str(full)], timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc, _ = _launch([*argv, "--run-dir", str(killed), "--fault", "0:25:kill"], timeout=180)
    assert proc.returncode != 0
    params_cut = json.loads((killed / "pipeline_cut.json").read_text())["balance"]
    assert params_cut == [12, 14]
    resume = [*argv, "--run-dir", str(killed), "--resume", "--pipeline-balance", "14, 12"]
    proc, _ = _launch(resume, timeout=180)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "--resume-changes pipeline_balance" in out, out
    proc, _ = _launch([*resume, "--resume-changes", "pipeline_balance"], timeout=180)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "resumed from step 20" in out, out
    summary = json.loads((killed / "summary.json").read_text())
    assert summary["recut_from"] == params_cut and summary["balance"] == [14, 12], summary
    assert "pipeline re-cut: layers per chunk [12, 14] -> [14, 12]" in out, out
    assert json.loads((killed / "pipeline_cut.json").read_text()) == {
        "balance": [14, 12], "by": "14,12",
    }  # fmt: skip
    want = CheckpointManager(full / "checkpoints").load_latest()[1]  # type: ignore[index]
    got = CheckpointManager(killed / "checkpoints").load_latest()[1]  # type: ignore[index]
    assert want["step"] == got["step"] == 40 and got["cut"] == summary["balance"]
    whole_want, whole_got = _whole_model(want), _whole_model(got)
    assert whole_want.keys() == whole_got.keys()
    for k, v in whole_want.items():
        assert torch.equal(v, whole_got[k]), k
    for stage in (0, 1):  # Adam's state moved too: one moment per parameter tensor
        moved = got["ranks"][stage]["optimizer"]["state"]
        held = got["ranks"][stage]["model"]
        assert len(moved) == sum(1 for k in held if k.endswith((".weight", ".bias")))


def test_pipeline_cut_within_each_ranks_memory(cache: Path, tmp_path: Path) -> None:
    # max_rank_batch auto with a cut by time: each stage's parameters, Adam's state and the
    # activations 1F1B keeps in flight stay within 80 % of its rank's memory (here the limit
    # given); a limit below what the process already holds leaves no cut, one message.
    argv = [*_PIPELINE_ARGS, "--cache-dir", str(cache), "--pipeline-balance", "time",
            "--max-rank-batch", "auto", "--max-steps", "10"]  # fmt: skip
    proc, _ = _launch([*argv, "--memory-limit-gb", "64", "--run-dir", str(tmp_path / "a")],
                      timeout=180)  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    (need0, limit0), (need1, limit1) = summary["chunk_memory_mib"]
    assert 0 < need0 <= limit0 and 0 < need1 <= limit1 and limit0 > 40_000, summary
    assert "within memory: chunk 0" in out and "max_rank_batch" not in summary, out
    proc, _ = _launch([*argv, "--memory-limit-gb", "0.01", "--run-dir", str(tmp_path / "b")],
                      timeout=180)  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert out.count("no pipeline cut fits the ranks' memory") == 1, out
    assert "give more micro-batches" in out and "Traceback" not in out, out


def test_pipeline_replicas_get_batches_by_their_speed(cache: Path, tmp_path: Path) -> None:
    # P=2 stages x D=2 replicas on 4 ranks; replica 1 emulated 3x slower: dynamic batching
    # gives it the smaller share, the same on both of its stages, and training still works.
    argv = [
        "--samples", "4000", "--batch-size", "64", "--model", "large", "--epochs", "1",
        "--max-steps", "40", "--optimizer", "adam", "--lr", "0.0003", "--micro-batches", "2",
        "--cache-dir", str(cache), "--progress", "false", "--eval-every", "0",
        "--pipeline-stages", "2", "--batching", "dynamic", "--slowdown", "1:3@0",
        "--batch-interval", "10", "--run-dir", str(tmp_path),
    ]  # fmt: skip
    proc, _ = _launch(argv, np=4, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    fast, slow = summary["final_batch_sizes"]
    assert fast + slow == 64 and fast > slow, summary
    # World ranks 2 and 3 are replica 1's two stages: one batch size per step for both.
    b2, b3 = ([m["batch"] for m in read_metrics(tmp_path / "metrics" / f"rank{r}.jsonl")
               if m["kind"] == "step"] for r in (2, 3))  # fmt: skip
    assert b2 == b3 and b2[0] == 32 and b2[-1] < 32, b2
    assert summary["final_loss"] < summary["first_loss"], summary


def test_ssp_lets_the_fast_rank_run_ahead_within_the_bound(cache: Path, tmp_path: Path) -> None:
    """Rank 1 is 3x slower: rank 0 runs up to --staleness steps ahead, never more; trained."""
    run = tmp_path / "ssp"
    proc, _ = _launch(_args(cache, run, "--sync", "ssp", "--staleness", "3",
                            "--slowdown", "1:3@0", "--checkpoint-every", "0"))  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert summary["staleness"] == 3
    assert 1 <= summary["max_clock_gap"] <= 3, summary
    assert summary["waits"] > 0 and summary["test_acc"] > 0.2, summary


def test_ssp_a_killed_rank_ends_the_job(cache: Path, tmp_path: Path) -> None:
    proc, took = _launch(_args(cache, tmp_path / "k", "--sync", "ssp", "--fault", "1:25:kill"))
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "signal 9" in out, out
    assert took < 60, f"the job took {took:.1f} s to end after a rank was killed"


def test_speed_sized_local_steps_give_the_fast_rank_more(cache: Path, tmp_path: Path) -> None:
    """DiLoCo with --inner-steps speed, rank 1 3x slower: rank 0 takes several local steps per
    step once the controller has measured the ranks, rank 1 one."""
    run = tmp_path / "speed"
    proc, _ = _launch(_args(cache, run, "--sync", "fedavg", "--outer-optimizer", "nesterov",
                            "--batching", "dynamic", "--inner-steps", "speed",
                            "--slowdown", "1:3@0", "--checkpoint-every", "0"))  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    late = {r: [m["local_steps"] for m in read_metrics(run / "metrics" / f"rank{r}.jsonl")
                if m["kind"] == "step"][-10:] for r in (0, 1)}  # fmt: skip
    assert min(late[0]) >= 2 and set(late[1]) == {1}, late
    assert json.loads((run / "summary.json").read_text())["test_acc"] > 0.2


def test_drift_corrected_selsync_on_skewed_labels_resumes_bit_identical(
    cache: Path, tmp_path: Path
) -> None:
    """Label skew turns drift correction and the momentum's averaging on (auto); the
    corrections are in the checkpoint, the momentum's average settled in it, and every rank
    ends where the uninterrupted run did, momentum included."""
    skew = ("--partition", "labels", "--labels-per-rank", "5", "--sync", "selsync")
    whole, run = tmp_path / "whole", tmp_path / "killed"
    proc, _ = _launch(_args(cache, whole, *skew))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc, _ = _launch(_args(cache, run, *skew, "--fault", "1:25:kill"))
    assert proc.returncode != 0
    proc, _ = _launch(_args(cache, run, *skew, "--resume"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    want, got = _final(whole), _final(run)
    for r, (w, g) in enumerate(zip(want["ranks"], got["ranks"], strict=True)):
        assert w["policy"]["drift"]["drift"] is not None  # on, and it corrected something
        for a, b in zip(w["policy"]["drift"]["drift"], g["policy"]["drift"]["drift"],
                        strict=True):  # fmt: skip
            assert torch.equal(a, b), r
        for k, v in w["model"].items():  # every rank's replica
            assert torch.equal(v, g["model"][k]), (r, k)
        for i, s in w["optimizer"]["state"].items():
            assert torch.equal(s["momentum_buffer"], g["optimizer"]["state"][i]["momentum_buffer"])
    # the replicas' momenta: averaged at the last sync, then one local step on each rank's labels
    mom = [w["optimizer"]["state"][0]["momentum_buffer"] for w in want["ranks"]]
    assert not torch.equal(mom[0], mom[1])
    assert json.loads((whole / "config.json").read_text())["average_optimizer_state"] == "auto"


def test_unequal_batches_on_skewed_labels_are_rebalanced(cache: Path, tmp_path: Path) -> None:
    """Static batches 3:1 on a label partition with BSP: each rank reads half of every global
    batch and rank 1 sends the rest of its half to rank 0, so rank 0 trains on both ranks'
    labels (the step records show the computed batches)."""
    run = tmp_path / "rebalanced"
    proc, _ = _launch(_args(cache, run, "--partition", "labels", "--labels-per-rank", "5",
                            "--batching", "static", "--weights", "3,1",
                            "--checkpoint-every", "0"))  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    batches = {r: {m["batch"] for m in read_metrics(run / "metrics" / f"rank{r}.jsonl")
                   if m["kind"] == "step"} for r in (0, 1)}  # fmt: skip
    assert batches == {0: {48}, 1: {16}}, batches
    assert json.loads((run / "summary.json").read_text())["test_acc"] > 0.2


def test_csv_tensorboard_and_plain_progress_lines(cache: Path, tmp_path: Path) -> None:
    """--csv and --tensorboard write rank 0's records; with output to a pipe, progress is a
    plain line every --progress-every-s, never a bar's carriage returns."""
    run = tmp_path / "logs"
    proc, _ = _launch(_args(cache, run, "--csv", "true", "--tensorboard", "true",
                            "--progress", "true", "--progress-every-s", "0.001",
                            "--checkpoint-every", "0"))  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "\r" not in out and "step 50/50 (100 %)" in out, out
    assert "epoch 2/2  test accuracy" in out
    import csv

    rows = list(csv.DictReader((run / "csv" / "metrics.csv").open()))
    steps = [r for r in rows if r["kind"] == "step"]
    epochs = [r for r in rows if r["kind"] == "epoch"]
    assert [int(r["step"]) for r in steps] == list(range(50)) and len(epochs) == 2
    assert all(r["test_acc"] == "" for r in steps) and float(epochs[-1]["test_acc"]) > 0.2
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"train/loss", "batch/rank0", "batch/rank1", "test/acc"} <= tags, tags
    assert [e.step for e in events.Scalars("train/loss")] == list(range(50))


def test_a_validation_split_is_held_out_and_scored_every_k_steps(
    cache: Path, tmp_path: Path
) -> None:
    """--val-fraction 0.2 trains on 80 % of the training samples and scores the held-out
    fifth every --eval-every-steps steps (the test split at the end), with the time spent
    evaluating kept out of train_time."""
    run = tmp_path / "val"
    proc, _ = _launch(_args(cache, run, "--val-fraction", "0.2", "--eval-every-steps", "5",
                            "--sync", "selsync", "--partition", "labels", "--labels-per-rank", "6",
                            "--checkpoint-every", "0"))  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1280 train / 320 validation / 400 test samples" in proc.stdout
    evals = [m for m in read_metrics(run / "metrics" / "rank0.jsonl") if m["kind"] == "epoch"]
    steps = json.loads((run / "summary.json").read_text())["steps"]
    assert [m["step"] + 1 for m in evals] == list(range(5, steps + 1, 5)), steps
    assert all(0 <= m["val_acc"] <= 1 and "test_acc" not in m for m in evals)
    clocks = [m["time"] - m["train_time"] for m in evals]  # evaluation seconds before each
    assert clocks[0] == 0 and all(b > a for a, b in zip(clocks, clocks[1:], strict=False))
    summary = json.loads((run / "summary.json").read_text())
    assert summary["val_acc"] > 0.2 and summary["test_acc"] > 0.2 and summary["eval_s"] > 0
    assert summary["train_time_s"] == pytest.approx(summary["time_s"] - summary["eval_s"])
    syncs = summary["warmup_syncs"] + summary["voted_syncs"] + summary["forced_syncs"]
    assert syncs == summary["synced_steps"]


def test_resume_command_replaces_the_run_dir_and_drops_overwrite() -> None:
    argv = ["--epochs", "3", "--run-dir", "old dir", "--overwrite", "--resume", "false"]
    assert resume_command(argv, "runs/run-3") == (
        "jobs/train.py --epochs 3 --run-dir runs/run-3 --resume"
    )
    assert resume_command(["--run-dir=x", "--resume=true", "--lr", "0.1"], "x") == (
        "jobs/train.py --lr 0.1 --run-dir x --resume"
    )


@pytest.mark.parametrize("np", [0, 2], ids=["one-process", "2-ranks"])
def test_a_signal_ends_the_job_with_the_step_the_checkpoint_and_the_resume_line(
    cache: Path, tmp_path: Path, np: int
) -> None:
    run = tmp_path / "stopped"
    argv = [sys.executable, str(JOB)] if np == 0 else []
    proc, took = _launch([*argv, *_args(cache, run, "--fault", "0:25:term")], np=np)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and (np or proc.returncode == 143), out
    line = (
        f"jobs/train.py: stopped by SIGTERM after step 25 of 50; checkpoint kept: "
        f"{run}/checkpoints/ckpt-000000020.pt; to continue: "
        f"{resume_command(_args(cache, run, '--fault', '0:25:term'), run)}"
    )
    assert out.count(line) == 1 and "Traceback" not in out, out
    assert took < 60
    again = shlex.split(line.split("to continue: ")[1])[1:]
    i = again.index("--fault")
    del again[i : i + 2]  # the user's own command has no fault
    proc, _ = _launch([*argv, *again] if np == 0 else again, np=np)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "resumed from step 20" in proc.stdout


def test_a_fast_rank_whose_share_passes_its_cap_computes_it_in_pieces(
    cache: Path, tmp_path: Path
) -> None:
    """Rank 0 takes 3/4 of 128 rows (fixed weights 3 : 1, as dynamic batching gives a rank 3x
    faster), past its cap of 40, so it computes them in pieces; rank 1's share stays within
    its cap."""
    run = tmp_path / "capped"
    proc, _ = _launch(_args(
        cache, run, "--batch-size", "128", "--batching", "static", "--weights", "3,1",
        "--max-rank-batch", "40,64",
    ))  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "most samples per pass per rank  40 / 64" in proc.stdout
    summary = json.loads((run / "summary.json").read_text())
    assert summary["max_rank_batch"] == [40, 64]
    assert summary["final_batch_sizes"] == [96, 32], summary["final_batch_sizes"]
    records = {rank: read_metrics(run / "metrics" / f"rank{rank}.jsonl") for rank in (0, 1)}
    steps = {rank: [r for r in records[rank] if r["kind"] == "step"] for rank in (0, 1)}
    for rank, cap in ((0, 40), (1, 64)):
        assert all(r["pieces"] == -(-r["batch"] // cap) for r in steps[rank]), rank
    assert max(r["pieces"] for r in steps[0]) >= 3
