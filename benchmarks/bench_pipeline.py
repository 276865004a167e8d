"""Pipeline benchmark: 2 stages on 2 CPU ranks (one thread each) against one rank.

    flock /tmp/hethpc-bench.lock .venv/bin/python benchmarks/bench_pipeline.py [--quick] [-h]

Started as a plain process it relaunches itself under ``scripts/mpirun.sh -np 2``. It measures,
side by side in one run: training throughput of the whole model on one rank and of the 2-stage
pipeline (m micro-batches, 1F1B and GPipe), the measured idle fraction against the theoretical
(P-1)/(m+P-1), and the peak activation memory of 1F1B and GPipe as m grows (micro-batch size
fixed). The last stdout line is one JSON object.

The pipeline's last stage splits its backward (input gradient first, sent at once; weight
gradients after: hethpc.pipeline.backward); ``1f1b-unsplit`` runs the same 1F1B with a plain
backward beside it, and ``split_backward_gain`` is the median of the rounds' step-time ratios.
``zb`` is the zero-bubble schedule ZB-H1 (W passes postponed into 1F1B's bubble).

Peer rows: PyTorch's own ``torch.distributed.pipelining`` (PipelineStage with ScheduleGPipe,
Schedule1F1B, and, on 4 chunks of the same model, two per rank, ScheduleInterleaved1F1B,
ScheduleInterleavedZeroBubble and ScheduleZBVZeroBubble) over gloo, on the same model,
micro-batches and data, timed over the same scope (zero_grad, the schedule's step, the
optimizer's step, after a barrier) and interleaved with hethpc's rows in every round
(``--peers`` picks them; ``--peers none`` skips them). ``hethpc_best_over_torch_best`` is the
median over rounds of the best hethpc schedule's throughput over the best torch schedule's
(each side's best: its highest ``speedup``).

Rounds alternate single-rank and pipeline steps (--rounds, default 16, of --steps, default 1,
each); ``speedup`` is the median of the rounds' own ratios, since the host's speed drifts by
10-30 % within seconds (``speedup_each_round`` lists them; ``speedup_of_medians`` is the ratio
of the overall medians).

hethpc's rows split the layers by ``--balance``: ``time`` (default) times each layer's forward
and backward on one micro-batch on rank 0 (as on the first stage, without the data's gradient;
as on the others, with the input's gradient; and the loss) and broadcasts the profile, so both
ranks cut alike, minimising the slowest stage; ``params`` balances parameter counts. The JSON
line gives the split, the profile's predicted stage times and the bound they imply
(``predicted_speedup_bound``: the whole model's time over the slowest stage's), and the same
bound from the stages' measured speeds in zb (``speedup_bound_slowest_stage_zb``). The torch
peer rows keep equal chunks. The single-rank baseline is always the whole model on one rank.

Baselines: ``single_rank`` is the whole model on both ranks at once (two independent loops, the
machine's practical ceiling is twice it); ``single_rank_alone`` is one rank while the other
sleeps. The per-stage breakdown (forward/backward ms per micro-batch, waiting per step) gives
``speedup_bound_from_stage_speeds``: the speedup if no stage ever waited beyond the schedule's
own bubble, at the speed the stages actually computed.

The default model (2 halves x 4 Linear(1024, 1024)+ReLU, batch 4096, so 512-row micro-batches)
is one where pipelining pays on CPUs: each micro-batch's compute (tens of ms) dwarfs its
transfer (2 MiB), and a 512-row matmul runs about as fast per row as the whole batch's. Two
costs remain that no schedule removes: the last stage also computes its input's gradient
(one more matmul than the first stage, which needs none), and smaller micro-batches run
slower per row. Both grow as the model or batch shrinks: ``--layers 2 --batch 1024``
(128-row micro-batches) gets well under the goal; see README ("Pipeline stages").
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import time

import torch
from _launch import relaunch, under_mpi
from torch import nn

from hethpc import comm
from hethpc.pipeline import (
    ActivationMeter,
    LayerProfile,
    Pipeline,
    StepStats,
    bubble_fraction,
    partition_by_params,
    profile_layers,
    split_model,
)

# torch.distributed.pipelining's schedules beside hethpc's: (class name, chunks of the model,
# chunk indices each rank holds). Interleaved: rank r holds chunks r and r+2; V: 0,3 and 1,2.
PEERS = {
    "torch-gpipe": ("ScheduleGPipe", 2, ((0,), (1,))),
    "torch-1f1b": ("Schedule1F1B", 2, ((0,), (1,))),
    "torch-interleaved-1f1b": ("ScheduleInterleaved1F1B", 4, ((0, 2), (1, 3))),
    "torch-interleaved-zb": ("ScheduleInterleavedZeroBubble", 4, ((0, 2), (1, 3))),
    "torch-zbv": ("ScheduleZBVZeroBubble", 4, ((0, 3), (1, 2))),
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="a short run (under a minute)")
    p.add_argument("--width", type=int, default=1024, help="width of each Linear layer")
    p.add_argument("--layers", type=int, default=4, help="Linear+ReLU blocks per half")
    p.add_argument(
        "--batch", type=int, default=4096,
        help="rows per training step; m micro-batches of batch/m rows each (one-thread CPU "
        "matmuls lose efficiency on small micro-batches: see the module docstring)",
    )
    p.add_argument("--micro-batches", type=int, default=8, help="m for the throughput runs")
    p.add_argument("--steps", type=int, default=1, help="timed steps per round and method")
    p.add_argument("--rounds", type=int, default=16,
                   help="alternating rounds of single and pipeline steps; the speedup is the "
                   "median of the rounds' own ratios")
    p.add_argument("--memory-ms", default="2,4,8,16", help="m values of the memory sweep")
    p.add_argument("--memory-rows", type=int, default=16, help="rows per micro-batch in the sweep")
    p.add_argument(
        "--peers", default=",".join(PEERS),
        help=f"torch.distributed.pipelining rows, comma-separated from {', '.join(PEERS)}, or "
        "'none'",
    )
    p.add_argument(
        "--balance", choices=("params", "time"), default="time",
        help="how hethpc's rows split the layers: by measured time per layer (one micro-batch "
        "timed on rank 0 and broadcast; counts the last stage's loss and the input gradient "
        "that the first stage does not compute) or by parameter count",
    )
    p.add_argument(
        "--progress-interval", default="auto",
        help="seconds between the progress thread's tests, 'auto' (a tenth of a pass, "
        "Pipeline's default) or 0 (no thread: Pipeline's None)",
    )
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


def time_alone(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int, who: int
) -> list[float]:
    """Rank ``who`` runs the whole model while the other rank sleeps (not spinning in MPI)."""
    if comm.rank() == who:
        out = time_single(model, x, y, steps)
        comm.send_tensor(torch.zeros(1), 1 - who)
        return out
    req = comm.irecv_tensor(who)
    while not req.test():
        time.sleep(0.01)
    req.wait()
    return []


def time_pipeline(
    pipe: Pipeline, x: torch.Tensor, y: torch.Tensor, steps: int
) -> tuple[list[float], list[StepStats]]:
    opt = torch.optim.SGD(pipe.parameters(), lr=1e-4)
    times, stats = [], []
    for _ in range(steps):
        comm.barrier()  # each step starts together, as in training where the data arrives together
        t0 = time.perf_counter()
        opt.zero_grad()
        pipe.train_step(x, y, loss_fn)
        opt.step()
        times.append(time.perf_counter() - t0)
        stats.append(pipe.stats)
    return times, stats


class TorchPipe:
    """This rank's part of a ``torch.distributed.pipelining`` schedule over the same model."""

    def __init__(self, name: str, model: nn.Sequential, m: int) -> None:
        from torch.distributed import pipelining

        cls_name, chunks, held = PEERS[name]
        parts = split_model(model, [len(model) // chunks] * chunks)
        mine = held[comm.rank()]
        stages = [pipelining.PipelineStage(parts[i], i, chunks, torch.device("cpu"))
                  for i in mine]  # fmt: skip
        cls = getattr(pipelining, cls_name)
        self.schedule = cls(stages[0] if len(stages) == 1 else stages, m, loss_fn=loss_fn)
        self.is_first, self.is_last = 0 in mine, chunks - 1 in mine
        self.params = [p for i in mine for p in parts[i].parameters()]

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """One batch; the schedule averages the micro-batch losses' gradients (mean loss)."""
        args = (x,) if self.is_first else ()
        if self.is_last:
            self.schedule.step(*args, target=y, losses=[])
        else:
            self.schedule.step(*args)


def init_torch_distributed() -> None:
    """A gloo process group over the MPI world (rank 0 picks a free port and broadcasts it)."""
    import torch.distributed as dist

    port = None
    if comm.rank() == 0:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
    port = comm.broadcast_object(port)
    dist.init_process_group("gloo", rank=comm.rank(), world_size=comm.size(),
                            init_method=f"tcp://127.0.0.1:{port}")  # fmt: skip


def time_peer(peer: TorchPipe, x: torch.Tensor, y: torch.Tensor, steps: int) -> list[float]:
    """As :func:`time_pipeline`: a barrier, then zero_grad, the step and the optimizer's step."""
    opt = torch.optim.SGD(peer.params, lr=1e-4)
    times = []
    for _ in range(steps):
        comm.barrier()
        t0 = time.perf_counter()
        opt.zero_grad()
        peer.train_step(x, y)
        opt.step()
        times.append(time.perf_counter() - t0)
    return times


def breakdown(stats: list[StepStats], m: int) -> dict[str, float]:
    """This stage's medians: forward and backward ms per micro-batch, waiting, idle."""
    med = statistics.median
    return {
        "f_ms": med(s.forward_s for s in stats) / m * 1e3,
        "b_ms": med(s.busy_s - s.forward_s for s in stats) / m * 1e3,
        "wait_ms": med(s.wait_s for s in stats) * 1e3,
        "step_ms": med(s.step_s for s in stats) * 1e3,
        "idle": statistics.mean(s.idle_fraction for s in stats),
    }


def worker(args: argparse.Namespace) -> dict[str, object]:
    comm.init()
    torch.set_num_threads(1)
    if comm.size() != 2:
        raise SystemExit(f"bench_pipeline needs 2 ranks, got {comm.size()}")
    w, L, B, m = args.width, args.layers, args.batch, args.micro_batches
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(B, w, generator=g), torch.randn(B, w, generator=g)
    single_model = make_model(w, L)
    interval: float | str | None = args.progress_interval
    if interval != "auto":
        interval = float(interval) if float(interval) > 0 else None
    # "1f1b-unsplit": 1F1B with a plain backward on the last stage (it sends its input's
    # gradient only after its weights' gradients), to show what the split backward gains.
    variants = {"1f1b": ("1f1b", True), "gpipe": ("gpipe", True), "1f1b-unsplit": ("1f1b", False),
                "zb": ("zb", True)}  # fmt: skip
    # The split: timed on one micro-batch on rank 0 and broadcast (so both ranks cut alike),
    # or by parameters. The profile is taken either way, for its predicted stage times.
    rows = B // m
    profile: LayerProfile = profile_layers(single_model, x[:rows], target=y[:rows],
                                           loss_fn=loss_fn, repeats=5)  # fmt: skip
    balance = profile.balance(2) if args.balance == "time" else partition_by_params(single_model, 2)
    predicted = profile.stage_s(balance)
    say(f"balance by {args.balance}: {list(balance)} layers per stage; predicted stage ms per "
        f"micro-batch {[round(t * 1e3, 2) for t in predicted]}, the whole model "
        f"{profile.whole_s * 1e3:.2f} (bound {profile.whole_s / max(predicted):.3f}x)")
    pipes = {
        k: Pipeline(make_model(w, L), balance=balance, micro_batches=m, schedule=s,
                    stage_group=comm.world(), progress_interval=interval, split_backward=split)
        for k, (s, split) in variants.items()
    }
    names = [] if args.peers == "none" else [k for k in args.peers.split(",") if k]
    unknown = sorted(set(names) - set(PEERS))
    if unknown:
        raise SystemExit(f"unknown --peers {unknown}; choose from {', '.join(PEERS)} or 'none'")
    if names:
        init_torch_distributed()
    peers = {k: TorchPipe(k, make_model(w, L), m) for k in names}
    say(f"model: 2 halves x {L} Linear({w},{w})+ReLU, batch {B}, m={m}, 2 ranks x 1 thread")
    # Warm-up, then alternate rounds so that drifting machine load hits both sides alike.
    time_single(single_model, x, y, 1)
    for pipe in pipes.values():
        time_pipeline(pipe, x, y, 1)
    for peer in peers.values():  # the first step infers shapes and builds the buffers
        time_peer(peer, x, y, 2)
    single_t: list[list[float]] = []  # per round, its steps
    alone_t: list[float] = []
    pipe_t: dict[str, list[list[float]]] = {s: [] for s in [*pipes, *peers]}
    pipe_stats: dict[str, list[StepStats]] = {s: [] for s in pipes}
    for r in range(args.rounds):
        # Both ranks run the whole model at once, each on its own core: one rank's throughput
        # under the same load as the pipeline's two ranks (two independent loops together:
        # the machine's practical ceiling is twice that).
        comm.barrier()
        single_t.append(time_single(single_model, x, y, args.steps))
        # One rank alone, the other asleep: the whole model on one otherwise idle rank.
        alone_t += time_alone(single_model, x, y, args.steps, who=r % 2)
        for s, pipe in pipes.items():
            t, st = time_pipeline(pipe, x, y, args.steps)
            pipe_t[s].append(t)
            pipe_stats[s] += st
        for s, peer in peers.items():
            pipe_t[s].append(time_peer(peer, x, y, args.steps))
        rates = [("single", single_t[-1]), *((k, v[-1]) for k, v in pipe_t.items())]
        say(f"round {r + 1}/{args.rounds} (rank 0): "
            + ", ".join(f"{k} {B / statistics.median(t):.1f} samples/s" for k, t in rates))
    # Every rank's per-round medians, combined on every rank.
    med = statistics.median
    mine = {
        "single": [med(t) for t in single_t],
        "alone": alone_t,
        **{s: [med(t) for t in v] for s, v in pipe_t.items()},
        **{f"stage_{s}": breakdown(v, m) for s, v in pipe_stats.items()},
    }
    timed = [*pipes, *peers]
    all_ranks = comm.allgather_object(mine)
    # Per round: one rank's time is the mean rank's; the pipeline goes at its slowest rank's
    # pace. The machine's speed drifts by 10-30 % within seconds, so the speedup is the median
    # of the rounds' own ratios (single and pipeline measured seconds apart), not a ratio of
    # medians taken minutes apart.
    rounds = range(args.rounds)
    single_r = [statistics.mean(d["single"][r] for d in all_ranks) for r in rounds]
    step_r = {s: [max(d[s][r] for d in all_ranks) for r in rounds] for s in timed}
    ratio_r = {s: [a / b for a, b in zip(single_r, v, strict=True)] for s, v in step_r.items()}
    single_s = med(single_r)
    alone_s = med([t for d in all_ranks for t in d["alone"]])
    step_s = {s: med(v) for s, v in step_r.items()}
    # The best schedule of each side by its speedup (as above, the median of the rounds' own
    # ratios); then their ratio per round.
    best = max(["1f1b", "gpipe", "zb"], key=lambda s: med(ratio_r[s]))
    torch_best = max(peers, key=lambda s: med(ratio_r[s])) if peers else None
    over_torch = (
        med([t / h for h, t in zip(step_r[best], step_r[torch_best], strict=True)])
        if torch_best is not None else None
    )
    stages = {s: [d[f"stage_{s}"] for d in all_ranks] for s in pipes}
    idle = {s: statistics.mean(b["idle"] for b in stages[s]) for s in pipes}
    for s in pipes:
        for k, b in enumerate(stages[s]):
            say(f"{s} stage {k}: F {b['f_ms']:.2f} ms/micro-batch, B {b['b_ms']:.2f}, "
                f"waiting {b['wait_ms']:.1f} ms/step of {b['step_ms']:.1f}, idle {b['idle']:.3f}")
    # The best 2-stage step the measured stage speeds allow: the slower stage busy all along,
    # plus the other stage's first forward and last backward (P=2).
    (f0, b0), (f1, b1) = ((b["f_ms"], b["b_ms"]) for b in stages["1f1b"])
    bound_ms = max(f0 + m * (f1 + b1) + b0, m * (f0 + b0) + f1 + b1)
    # No schedule beats one rank by more than the whole model's time over the slowest stage's
    # (per micro-batch, as the stages computed in zb, the best table here).
    single_mb_ms = single_s / m * 1e3
    share = [(b["f_ms"] + b["b_ms"]) / single_mb_ms for b in stages["zb"]]

    memory: dict[str, list[float]] = {"1f1b": [], "gpipe": [], "zb": []}
    ms = [int(v) for v in args.memory_ms.split(",")]
    for mm in ms:
        rows = mm * args.memory_rows
        xm, ym = x[:rows] if rows <= B else torch.randn(rows, w), torch.randn(rows, w)
        for s in memory:
            pipe = Pipeline(make_model(w, L), balance=balance, micro_batches=mm,
                            schedule=s, stage_group=comm.world())
            with ActivationMeter() as meter:
                pipe.train_step(xm, ym, loss_fn)
            peak = max(comm.allgather_object(meter.peak_bytes))
            memory[s].append(round(peak / 2**20, 3))
        say(f"memory m={mm:>3} ({args.memory_rows} rows each): peak activations "
            f"1f1b {memory['1f1b'][-1]:.2f} MiB, gpipe {memory['gpipe'][-1]:.2f} MiB, "
            f"zb {memory['zb'][-1]:.2f} MiB")

    single_sps = B / single_s
    alone_sps = B / alone_s
    pipe_sps = B / step_s["1f1b"]
    speedup = med(ratio_r["1f1b"])
    speedup_best = med(ratio_r[best])
    say(f"hethpc best: {best} {speedup_best:.3f}x one rank; torch best: {torch_best}"
        + (f", hethpc best / torch best {over_torch:.3f}" if over_torch is not None else ""))
    return {
        "stages": 2,
        "balance_by": args.balance,
        "balance": list(balance),
        "predicted_stage_ms_per_micro_batch": [round(t * 1e3, 2) for t in predicted],
        "predicted_whole_ms_per_micro_batch": round(profile.whole_s * 1e3, 2),
        "predicted_speedup_bound": round(profile.whole_s / max(predicted), 3),
        "stage_share_of_single_zb": [round(v, 3) for v in share],
        "speedup_bound_slowest_stage_zb": round(1 / max(share), 3),
        "micro_batches": m,
        "batch": B,
        "progress_interval": interval,
        "progress_interval_used_s": pipes["1f1b"].current_progress_interval,
        "mpi_single_copy": os.environ.get("OMPI_MCA_btl_vader_single_copy_mechanism"),
        "single_rank_samples_per_s": round(single_sps, 2),
        "single_rank_alone_samples_per_s": round(alone_sps, 2),
        "two_independent_loops_samples_per_s": round(2 * single_sps, 2),
        "pipeline_samples_per_s": round(pipe_sps, 2),
        "pipeline_gpipe_samples_per_s": round(B / step_s["gpipe"], 2),
        "speedup": round(speedup, 3),
        "speedup_each_round": [round(v, 3) for v in ratio_r["1f1b"]],
        "speedup_of_medians": round(pipe_sps / single_sps, 3),
        "speedup_gpipe": round(med(ratio_r["gpipe"]), 3),
        "speedup_1f1b_unsplit_backward": round(med(ratio_r["1f1b-unsplit"]), 3),
        "pipeline_zb_samples_per_s": round(B / step_s["zb"], 2),
        "speedup_zb": round(med(ratio_r["zb"]), 3),
        "speedup_zb_each_round": [round(v, 3) for v in ratio_r["zb"]],
        "idle_fraction_zb": round(idle["zb"], 4),
        "stage_wait_ms_per_step_zb": [round(b["wait_ms"], 1) for b in stages["zb"]],
        "hethpc_best": best,
        "speedup_best": round(speedup_best, 3),
        "torch_samples_per_s": {s: round(B / step_s[s], 2) for s in peers},
        "speedup_torch": {s: round(med(ratio_r[s]), 3) for s in peers},
        "torch_best": torch_best,
        "hethpc_best_over_torch_best": None if over_torch is None else round(over_torch, 3),
        "goal_speedup_best": 1.75,
        "goal_speedup_best_met": speedup_best >= 1.75,
        "goal_over_torch_best": 1.1,
        "goal_over_torch_best_met": None if over_torch is None else over_torch >= 1.1,
        "split_backward_gain": round(
            med([a / b for a, b in zip(step_r["1f1b-unsplit"], step_r["1f1b"], strict=True)]), 3
        ),
        "speedup_vs_alone": round(pipe_sps / alone_sps, 3),
        "share_of_two_loops": round(speedup / 2, 3),
        "speedup_goal": 1.6,
        "speedup_ideal": round(2 * m / (m + 1), 3),
        "speedup_bound_from_stage_speeds": round(single_s * 1e3 / bound_ms, 3),
        "stage_forward_ms_per_micro_batch": [round(b["f_ms"], 2) for b in stages["1f1b"]],
        "stage_backward_ms_per_micro_batch": [round(b["b_ms"], 2) for b in stages["1f1b"]],
        "single_ms_per_micro_batch": round(single_mb_ms, 2),
        "stage_wait_ms_per_step": [round(b["wait_ms"], 1) for b in stages["1f1b"]],
        "stage_idle_fraction": [round(b["idle"], 4) for b in stages["1f1b"]],
        "idle_fraction": round(idle["1f1b"], 4),
        "idle_fraction_gpipe": round(idle["gpipe"], 4),
        "idle_fraction_theory": round(bubble_fraction(2, m), 4),
        "memory_micro_batches": ms,
        "memory_rows_per_micro_batch": args.memory_rows,
        "peak_activation_mib_1f1b": memory["1f1b"],
        "peak_activation_mib_gpipe": memory["gpipe"],
        "peak_activation_mib_zb": memory["zb"],
        "peak_1f1b_flat_in_m": len(set(memory["1f1b"])) == 1,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.quick:
        args.steps, args.rounds, args.memory_ms = 1, 3, "2,4,8"
    if not under_mpi():
        return relaunch(__file__, 2, argv)
    comm.init()
    comm.abort_on_exception()
    result = worker(args)
    if comm.rank() == 0:
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
