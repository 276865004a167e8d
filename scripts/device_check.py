"""The device check's steps (run by scripts/device_check.sh): GPU build, NCCL allreduce,
jobs/train.py, a 2-stage pipeline against one process, bench_pipeline; one JSON line at the end.

    scripts/device_check.sh            # on a GPU machine (CPU when none is visible)
    scripts/device_check.sh --cpu      # the same steps on CPU; GPU-only items "skipped: no GPU"
    scripts/device_check.sh --small    # tiny sizes (the test in tests/ runs --cpu --small)

Every step runs in its own process under ``scripts/mpirun.sh`` with a time limit, so one that
fails or hangs is reported and the others still run. The last stdout line is one JSON object:
each step's ``status`` is ``ok``, ``failed: ...`` or ``skipped: ...``; ``ok`` is true when no
step failed (the exit code is then 0).

NCCL needs one GPU per rank (two ranks on one GPU are refused as a duplicate GPU), so on a
machine with one GPU the NCCL allreduce and the data-parallel job run one rank, and say so;
the pipeline's two stages may share one GPU (their transfers go through MPI, not NCCL).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MPIRUN = str(ROOT / "scripts" / "mpirun.sh")
NO_GPU = "skipped: no GPU"


# --- steps run on the ranks (python scripts/device_check.py rank <step> <device>) -------------


def _rank_device(setting: str) -> Any:
    from hethpc import comm
    from hethpc.train import this_device

    comm.init()
    return this_device(setting, comm.local_rank())


def rank_allreduce(setting: str) -> dict[str, Any]:
    """Each rank contributes ``rank + 1``: the sum is ``n (n + 1) / 2`` on every rank."""
    import torch

    from hethpc import comm

    dev = _rank_device(setting)
    n = comm.size()
    t = torch.full((1024,), float(comm.rank() + 1), device=dev)
    via = "hethpc.comm.allreduce"
    if n > 1:
        out = comm.allreduce(t, comm.ReduceOp.SUM)
    elif dev.type == "cuda":
        # hethpc makes no collective call on one rank; ask Horovod itself, so the NCCL build
        # runs an allreduce even on a machine with one GPU.
        import horovod.torch as hvd

        out, via = hvd.allreduce(t, op=hvd.Sum, name="device_check"), "horovod (1 rank)"
    else:
        out, via = t.clone(), "none (1 rank)"
    want = n * (n + 1) / 2
    got = float(out[0])
    ok = bool(torch.all(out == want))
    return {"ranks": n, "device": str(dev), "via": via, "sum": got, "expected": want,
            "right": ok, "transfers": comm.transfers().as_dict()}  # fmt: skip


def rank_pipeline(setting: str, small: bool) -> dict[str, Any]:
    """A 2-stage pipeline's loss and first-layer gradient against the whole model on rank 0."""
    import torch
    from torch import nn

    from hethpc import comm
    from hethpc.pipeline import Pipeline

    dev = _rank_device(setting)
    width, rows = (32, 64) if small else (512, 1024)
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(4):
        layers += [nn.Linear(width, width), nn.Tanh()]
    model = nn.Sequential(*layers)
    ref = copy.deepcopy(model).to(dev)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(rows, width, generator=g), torch.randn(rows, width, generator=g)
    loss_fn = nn.functional.mse_loss
    pipe = Pipeline(model, balance=[4, 4], micro_batches=4, stage_group=comm.world(), device=dev)
    loss = pipe.train_step(x, y, loss_fn)
    # Every stage's first parameter's gradient, gathered on rank 0 beside the reference's.
    grads = comm.allgather_object(next(pipe.module.parameters()).grad.cpu())
    out: dict[str, Any] = {"ranks": comm.size(), "device": str(dev),
                           "transfers": comm.transfers().as_dict()}  # fmt: skip
    losses = comm.allgather_object(loss)
    if comm.rank() == 0:
        ref_loss = loss_fn(ref(x.to(dev)), y.to(dev))
        ref_loss.backward()
        want = [ref[0].weight.grad.cpu(), ref[4].weight.grad.cpu()]
        pipe_loss = losses[-1]
        out["pipeline_loss"] = float(pipe_loss)
        out["one_process_loss"] = float(ref_loss)
        out["same_loss"] = abs(float(pipe_loss) - float(ref_loss)) <= 1e-5 * max(
            1.0, abs(float(ref_loss))
        )
        out["same_gradients"] = all(
            torch.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in zip(grads, want, strict=True)
        )
        out["right"] = out["same_loss"] and out["same_gradients"]
    return out


def rank_main(argv: list[str]) -> int:
    step, setting = argv[0], argv[1]
    small = "--small" in argv
    result = rank_allreduce(setting) if step == "allreduce" else rank_pipeline(setting, small)
    from hethpc import comm

    if comm.rank() == 0:
        print("RESULT " + json.dumps(result), flush=True)
    return 0


# --- the driver -------------------------------------------------------------------------------


_deadline = float("inf")  # time.monotonic() by which every step must be done


def _run(cmd: list[str], timeout: float) -> tuple[int, str]:
    """Run ``cmd`` for at most ``timeout`` seconds, and never past the check's deadline."""
    timeout = max(1.0, min(timeout, _deadline - time.monotonic() - 5))
    env = {**os.environ, "HETHPC_MPIRUN_TIMEOUT": str(int(timeout)), "OMP_NUM_THREADS": "1"}
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 3, cwd=ROOT,
                           env=env)  # fmt: skip
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        return 124, out + f"\n(timed out after {timeout:.0f} s)"
    return p.returncode, p.stdout + p.stderr


def _failed(rc: int, out: str) -> dict[str, Any]:
    tail = " | ".join(line for line in out.strip().splitlines()[-6:])
    return {"status": f"failed (exit {rc}): {tail[-600:]}"}


def _ranks_result(np_: int, step: str, device: str, small: bool, timeout: float) -> dict[str, Any]:
    cmd = [MPIRUN, "-np", str(np_), sys.executable, str(Path(__file__).resolve()), "rank", step,
           device, *(["--small"] if small else [])]  # fmt: skip
    rc, out = _run(cmd, timeout)
    found = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
    if rc != 0 or not found:
        return _failed(rc, out)
    res = json.loads(found[-1][len("RESULT "):])
    res["status"] = "ok" if res.get("right") else "failed: wrong result"
    return res


def check_build(gpus: int) -> dict[str, Any]:
    import torch

    out: dict[str, Any] = {"status": "ok", "torch": torch.__version__,
                           "torch_cuda": torch.version.cuda, "gpus": gpus}  # fmt: skip
    if gpus:
        out["gpu_names"] = [torch.cuda.get_device_name(i) for i in range(gpus)]
    rc, text = _run([sys.executable, str(ROOT / "scripts" / "setup_plan.py"), "--json"], 60)
    if rc == 0:
        plan = json.loads(text.strip().splitlines()[-1])["plan"]
        out["setup_plan"] = {k: plan[k] for k in ("gpu", "reason", "wheel_key", "horovod_env")}
    else:
        out["setup_plan"] = _failed(rc, text)["status"]
    try:
        import horovod.torch as hvd

        out["horovod_nccl_built"] = bool(hvd.nccl_built())
        out["horovod_mpi_built"] = bool(hvd.mpi_built())
    except Exception as e:  # noqa: BLE001 - reported, not raised
        out["horovod"] = f"failed to import: {e}"
        out["status"] = "failed: horovod"
    if gpus and not out.get("horovod_nccl_built"):
        out["status"] = "failed: a GPU but Horovod without NCCL (run scripts/setup.sh here)"
    return out


def check_train(np_: int, device: str, small: bool, timeout: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="hethpc-devcheck-") as tmp:
        return _check_train(Path(tmp) / "run", np_, device, small, timeout)


def _check_train(
    run_dir: Path, np_: int, device: str, small: bool, timeout: float
) -> dict[str, Any]:
    steps, samples = (12, 2000) if small else (60, 8000)
    cmd = [MPIRUN, "-np", str(np_), sys.executable, str(ROOT / "jobs" / "train.py"),
           "--device", device, "--batching", "dynamic", "--batch-interval", "4",
           "--samples", str(samples), "--epochs", "1", "--max-steps", str(steps),
           "--batch-size", "128", "--run-dir", str(run_dir), "--overwrite",
           "--progress", "false", "--watchdog-s", "120",
           # each rank's cap measured at start: GPU free memory, or 4 GB on a CPU
           "--max-rank-batch", "auto", "--memory-limit-gb", "4"]  # fmt: skip
    rc, out = _run(cmd, timeout)
    summary_path = run_dir / "summary.json"
    if rc != 0 or not summary_path.is_file():
        return _failed(rc, out)
    s = json.loads(summary_path.read_text())
    keep = ("device", "transfers", "world_size", "steps", "samples_per_s", "first_loss",
            "final_loss", "final_batch_sizes", "max_rank_batch", "test_acc")  # fmt: skip
    res = {k: s.get(k) for k in keep}
    res["status"] = "ok" if s.get("steps") == steps and s.get("final_loss") is not None else (
        "failed: unexpected summary")
    return res


def check_bench(device: str, small: bool, timeout: float) -> dict[str, Any]:
    size = ["--width", "128", "--layers", "1", "--batch", "256", "--rounds", "2",
            "--memory-ms", "2"] if small else []  # fmt: skip
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_pipeline.py"), "--quick",
           "--device", device, "--peers", "none", *size]  # fmt: skip
    rc, out = _run(cmd, timeout)
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    if rc != 0 or not lines:
        return _failed(rc, out)
    r = json.loads(lines[-1])
    keep = ("device", "transfers", "single_rank_samples_per_s", "pipeline_samples_per_s",
            "speedup", "pipeline_zb_samples_per_s", "speedup_zb", "speedup_best", "hethpc_best")
    return {"status": "ok", **{k: r.get(k) for k in keep}}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["rank"]:
        return rank_main(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpu", action="store_true", help="run every step on CPU")
    ap.add_argument("--small", action="store_true", help="tiny sizes (tests)")
    ap.add_argument("--budget-s", type=float, default=280.0,
                    help="seconds for all steps together (each also has its own limit)")
    args = ap.parse_args(argv)
    import torch

    global _deadline
    t0 = time.monotonic()
    _deadline = t0 + args.budget_s
    gpus = 0 if args.cpu else torch.cuda.device_count()
    dev = "cuda" if gpus else "cpu"
    say = lambda msg: print(f"[device_check] {msg}", file=sys.stderr, flush=True)  # noqa: E731
    say(f"{'GPU' if gpus else 'CPU'} check: {gpus} GPU(s) visible" + (
        " (--cpu)" if args.cpu else ""))
    res: dict[str, Any] = {"device_check": "gpu" if gpus else "cpu", "gpus": gpus}
    say("1/5 build")
    res["build"] = check_build(gpus)
    say("2/5 allreduce")
    dp_ranks = 2 if not gpus else min(2, gpus)
    res["allreduce"] = _ranks_result(dp_ranks, "allreduce", dev, args.small, 45)
    if not gpus:
        res["nccl_allreduce"] = NO_GPU
    elif gpus == 1:
        res["nccl_allreduce"] = ("1 rank only: one GPU here, and NCCL needs one GPU per rank "
                                 "(two ranks on one GPU are refused as a duplicate GPU)")
        # Informational, not counted in "ok": what 2 ranks sharing the one GPU really do.
        res["nccl_two_ranks_one_gpu"] = _ranks_result(2, "allreduce", dev, args.small, 40)
    else:
        res["nccl_allreduce"] = res["allreduce"]["status"]
    say("3/5 jobs/train.py")
    res["train"] = check_train(dp_ranks, dev, args.small, 75)
    res["train"]["timing"] = ("compute time ends with torch.cuda.synchronize (BatchController "
                              "on a CUDA device)") if gpus else NO_GPU  # fmt: skip
    say("4/5 pipeline against one process")
    res["pipeline"] = _ranks_result(2, "pipeline", dev, args.small, 45)
    say("5/5 bench_pipeline --quick")
    res["bench_pipeline"] = check_bench(dev, args.small, 200)
    res["seconds"] = round(time.monotonic() - t0, 1)
    steps = ("build", "allreduce", "train", "pipeline", "bench_pipeline")
    res["ok"] = all(str(res[s]["status"]) == "ok" for s in steps)
    print(json.dumps(res), flush=True)
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
