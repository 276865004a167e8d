"""Pipeline benchmark: 2 stages on 2 CPU ranks (one thread each) against one rank.

    flock /tmp/hethpc-bench.lock .venv/bin/python benchmarks/bench_pipeline.py [--quick]

Started as a plain process it relaunches itself under ``scripts/mpirun.sh -np 2``. It measures,
side by side in one run: training throughput of the whole model on one rank and of the 2-stage
pipeline (m micro-batches, 1F1B and GPipe), the measured idle fraction against the theoretical
(P-1)/(m+P-1), and the peak activation memory of 1F1B and GPipe as m grows (micro-batch size
fixed). The last stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hethpc import comm  # noqa: E402
from hethpc.pipeline import ActivationMeter, Pipeline, bubble_fraction  # noqa: E402


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="a short run (under a minute)")
    p.add_argument("--width", type=int, default=1024, help="width of each Linear layer")
    p.add_argument("--layers", type=int, default=2, help="Linear+ReLU blocks per half")
    p.add_argument(
        "--batch", type=int, default=1024,
        help="rows per training step (CPU matmuls lose efficiency below ~128-row micro-batches)",
    )
    p.add_argument("--micro-batches", type=int, default=8, help="m for the throughput runs")
    p.add_argument("--steps", type=int, default=6, help="timed steps per round")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds single/pipeline")
    p.add_argument("--memory-ms", default="2,4,8,16", help="m values of the memory sweep")
    p.add_argument("--memory-rows", type=int, default=16, help="rows per micro-batch in the sweep")
    return p.parse_args(argv)


def make_model(width: int, layers: int) -> nn.Sequential:
    """Two equal halves of ``layers`` Linear+ReLU blocks each."""
    torch.manual_seed(0)
    blocks: list[nn.Module] = []
    for _ in range(2 * layers):
        blocks += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*blocks)


def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(out, target)


def say(*args: object) -> None:
    if comm.rank() == 0:
        print(*args, flush=True)


def time_single(model: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int) -> list[float]:
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    out = []
    for _ in range(steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
        out.append(time.perf_counter() - t0)
    return out


def time_pipeline(
    pipe: Pipeline, x: torch.Tensor, y: torch.Tensor, steps: int
) -> tuple[list[float], list[float]]:
    opt = torch.optim.SGD(pipe.parameters(), lr=1e-4)
    times, idle = [], []
    for _ in range(steps):
        comm.barrier()  # each step starts together, as in training where the data arrives together
        t0 = time.perf_counter()
        opt.zero_grad()
        pipe.train_step(x, y, loss_fn)
        opt.step()
        times.append(time.perf_counter() - t0)
        idle.append(pipe.stats.idle_fraction)
    return times, idle


def worker(args: argparse.Namespace) -> dict[str, object]:
    comm.init()
    torch.set_num_threads(1)
    if comm.size() != 2:
        raise SystemExit(f"bench_pipeline needs 2 ranks, got {comm.size()}")
    w, L, B, m = args.width, args.layers, args.batch, args.micro_batches
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(B, w, generator=g), torch.randn(B, w, generator=g)
    single_model = make_model(w, L)
    pipes = {
        s: Pipeline(make_model(w, L), balance=(2 * L, 2 * L), micro_batches=m, schedule=s,
                    stage_group=comm.world())
        for s in ("1f1b", "gpipe")
    }
    say(f"model: 2 halves x {L} Linear({w},{w})+ReLU, batch {B}, m={m}, 2 ranks x 1 thread")
    # Warm-up, then alternate rounds so that drifting machine load hits both sides alike.
    time_single(single_model, x, y, 1)
    for pipe in pipes.values():
        time_pipeline(pipe, x, y, 1)
    single_t: list[float] = []
    pipe_t: dict[str, list[float]] = {s: [] for s in pipes}
    pipe_idle: dict[str, list[float]] = {s: [] for s in pipes}
    for r in range(args.rounds):
        # Both ranks run the whole model at once, each on its own core: one rank's throughput
        # under the same load as the pipeline's two ranks.
        comm.barrier()
        single_t += time_single(single_model, x, y, args.steps)
        for s, pipe in pipes.items():
            t, idle = time_pipeline(pipe, x, y, args.steps)
            pipe_t[s] += t
            pipe_idle[s] += idle
        rates = [("single", single_t), *pipe_t.items()]
        say(f"round {r + 1}/{args.rounds} (rank 0): "
            + ", ".join(f"{k} {B / statistics.median(t):.1f} samples/s" for k, t in rates))
    # Every rank's medians, combined on every rank.
    mine = {
        "single": statistics.median(single_t),
        **{s: statistics.median(t) for s, t in pipe_t.items()},
        **{f"idle_{s}": statistics.mean(v) for s, v in pipe_idle.items()},
    }
    all_ranks = comm.allgather_object(mine)
    # One rank's throughput: the mean rank's; the pipeline goes at its slowest rank's pace.
    single_s = statistics.mean(d["single"] for d in all_ranks)
    step_s = {s: max(d[s] for d in all_ranks) for s in pipes}
    idle = {s: statistics.mean(d[f"idle_{s}"] for d in all_ranks) for s in pipes}

    memory: dict[str, list[float]] = {"1f1b": [], "gpipe": []}
    ms = [int(v) for v in args.memory_ms.split(",")]
    for mm in ms:
        rows = mm * args.memory_rows
        xm, ym = x[:rows] if rows <= B else torch.randn(rows, w), torch.randn(rows, w)
        for s in memory:
            pipe = Pipeline(make_model(w, L), balance=(2 * L, 2 * L), micro_batches=mm,
                            schedule=s, stage_group=comm.world())
            with ActivationMeter() as meter:
                pipe.train_step(xm, ym, loss_fn)
            peak = max(comm.allgather_object(meter.peak_bytes))
            memory[s].append(round(peak / 2**20, 3))
        say(f"memory m={mm:>3} ({args.memory_rows} rows each): peak activations "
            f"1f1b {memory['1f1b'][-1]:.2f} MiB, gpipe {memory['gpipe'][-1]:.2f} MiB")

    single_sps = B / single_s
    pipe_sps = B / step_s["1f1b"]
    return {
        "stages": 2,
        "micro_batches": m,
        "batch": B,
        "single_rank_samples_per_s": round(single_sps, 2),
        "pipeline_samples_per_s": round(pipe_sps, 2),
        "pipeline_gpipe_samples_per_s": round(B / step_s["gpipe"], 2),
        "speedup": round(pipe_sps / single_sps, 3),
        "speedup_goal": 1.6,
        "speedup_ideal": round(2 * m / (m + 1), 3),
        "idle_fraction": round(idle["1f1b"], 4),
        "idle_fraction_gpipe": round(idle["gpipe"], 4),
        "idle_fraction_theory": round(bubble_fraction(2, m), 4),
        "memory_micro_batches": ms,
        "memory_rows_per_micro_batch": args.memory_rows,
        "peak_activation_mib_1f1b": memory["1f1b"],
        "peak_activation_mib_gpipe": memory["gpipe"],
        "peak_1f1b_flat_in_m": len(set(memory["1f1b"])) == 1,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.quick:
        args.steps, args.rounds, args.memory_ms = 3, 2, "2,4,8"
    comm.init()
    if comm.size() == 1 and "OMPI_COMM_WORLD_SIZE" not in os.environ:
        argv = sys.argv[1:] if argv is None else argv
        cmd = [str(ROOT / "scripts" / "mpirun.sh"), "-np", "2", sys.executable, __file__, *argv]
        print("launching:", " ".join(cmd), flush=True)
        # Waiting ranks yield their core instead of spinning: the machine may be shared.
        env = {**os.environ, "OMP_NUM_THREADS": "1", "OMPI_MCA_mpi_yield_when_idle": "1"}
        return subprocess.run(cmd, cwd=ROOT, env=env, check=False).returncode
    comm.abort_on_exception()
    result = worker(args)
    if comm.rank() == 0:
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
