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
``zb`` is the zero-bubble schedule ZB-H1 (W passes postponed into 1F1B's bubble); ``zbv`` is
ZB-V: the model in 4 equal chunks, two per rank in a V (rank 0: chunks 0 and 3, rank 1: 1 and
2), cut as the ``torch-zbv`` peer cuts them, so the two compare like for like.

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

``--device`` puts both ranks, the single-rank baseline and the data on the GPU (``auto``, the
default, when there is one; two ranks may share one GPU); timed steps then end with
``torch.cuda.synchronize``, and the torch peer rows (gloo, CPU) are skipped. Not yet run on a
GPU machine.

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
import statistics
import time

import torch
from _launch import relaunch, under_mpi
from _pipeline_figures import result, timings
from _torch_pipelining import PEERS, make_peers, time_peer
from _training import timed_steps
from torch import nn

from hethpc import comm
from hethpc.comm.runtime import TRANSPORTS
from hethpc.pipeline import Pipeline
from hethpc.pipeline.balance import partition_by_params
from hethpc.pipeline.memory import ActivationMeter
from hethpc.pipeline.profile import LayerProfile, profile_layers
from hethpc.pipeline.runner import StepStats
from hethpc.train import this_device


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
        "--device", choices=("auto", "cpu", "cuda"), default="auto",
        help="where both ranks compute (auto: GPU <local rank mod GPUs> when there is one, else "
        "the CPU; two ranks may share one GPU); the torch peer rows (gloo) run on CPU only and "
        "are skipped on a GPU",
    )
    p.add_argument(
        "--transport", choices=TRANSPORTS, default="auto",
        help="what carries the collectives (the pipeline's transfers go through mpi4py either "
        "way): auto (Horovod where a GPU is seen and Horovod is installed, else mpi4py), "
        "horovod or mpi",
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
    return timed_steps(opt, lambda: loss_fn(model(x), y).backward(), steps)


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
    """Each step after a barrier (the ranks start together, as in training where the data
    arrives together): zero_grad, the pipeline's step, the optimizer's step."""
    opt = torch.optim.SGD(pipe.parameters(), lr=1e-4)
    stats: list[StepStats] = []

    def step() -> None:
        pipe.train_step(x, y, loss_fn)
        stats.append(pipe.stats)

    return timed_steps(opt, step, steps, barrier=True), stats


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
    comm.init(transport=args.transport)
    torch.set_num_threads(1)
    if comm.size() != 2:
        raise SystemExit(f"bench_pipeline needs 2 ranks, got {comm.size()}")
    w, L, B, m = args.width, args.layers, args.batch, args.micro_batches
    dev = this_device(args.device, comm.local_rank())
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(B, w, generator=g).to(dev), torch.randn(B, w, generator=g).to(dev)
    single_model = make_model(w, L).to(dev)
    interval: float | str | None = args.progress_interval
    if interval != "auto":
        interval = float(interval) if float(interval) > 0 else None
    # "1f1b-unsplit": 1F1B with a plain backward on the last stage (it sends its input's
    # gradient only after its weights' gradients), to show what the split backward gains.
    variants = {"1f1b": ("1f1b", True), "gpipe": ("gpipe", True), "1f1b-unsplit": ("1f1b", False),
                "zb": ("zb", True), "zbv": ("zbv", True)}  # fmt: skip
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
    # zbv: 4 equal chunks, as the torch-zbv peer (_torch_pipelining) cuts the model
    chunks = 2 * comm.size()
    zbv_balance = [len(single_model) // chunks] * chunks
    pipes = {
        k: Pipeline(make_model(w, L), balance=zbv_balance if s == "zbv" else balance,
                    micro_batches=m, schedule=s,
                    stage_group=comm.world(), progress_interval=interval, split_backward=split,
                    device=dev)
        for k, (s, split) in variants.items()
    }
    if dev.type == "cuda" and args.peers != "none":
        say("torch.distributed.pipelining peer rows: skipped on a GPU (they run over gloo on CPU)")
        args.peers = "none"
    peers = make_peers(args.peers, lambda: make_model(w, L), m, loss_fn)
    say(f"model: 2 halves x {L} Linear({w},{w})+ReLU, batch {B}, m={m}, 2 ranks x 1 thread, "
        f"on {dev}")
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
    all_ranks = comm.allgather_object(mine)
    fig = timings(all_ranks, rounds=args.rounds, m=m, pipes=list(pipes), peers=list(peers))
    for s in pipes:
        for k, b in enumerate(fig.stages[s]):
            say(f"{s} stage {k}: F {b['f_ms']:.2f} ms/micro-batch, B {b['b_ms']:.2f}, "
                f"waiting {b['wait_ms']:.1f} ms/step of {b['step_ms']:.1f}, idle {b['idle']:.3f}")

    memory: dict[str, list[float]] = {"1f1b": [], "gpipe": [], "zb": [], "zbv": []}
    ms = [int(v) for v in args.memory_ms.split(",")]
    for mm in ms:
        rows = mm * args.memory_rows
        xm = x[:rows] if rows <= B else torch.randn(rows, w, device=dev)
        ym = torch.randn(rows, w, device=dev)
        for s in memory:
            pipe = Pipeline(make_model(w, L), balance=zbv_balance if s == "zbv" else balance,
                            micro_batches=mm,
                            schedule=s, stage_group=comm.world(), device=dev)
            with ActivationMeter() as meter:
                pipe.train_step(xm, ym, loss_fn)
            peak = max(comm.allgather_object(meter.peak_bytes))
            memory[s].append(round(peak / 2**20, 3))
        say(f"memory m={mm:>3} ({args.memory_rows} rows each): peak activations "
            f"1f1b {memory['1f1b'][-1]:.2f} MiB, gpipe {memory['gpipe'][-1]:.2f} MiB, "
            f"zb {memory['zb'][-1]:.2f} MiB, zbv {memory['zbv'][-1]:.2f} MiB")

    say(f"hethpc best: {fig.best} {med(fig.ratio_r[fig.best]):.3f}x one rank; torch best: "
        f"{fig.torch_best}" + (f", hethpc best / torch best {fig.over_torch:.3f}"
                               if fig.over_torch is not None else ""))  # fmt: skip
    run = {
        "balance_zbv": zbv_balance,
        "progress_interval": interval,
        "progress_interval_used_s": pipes["1f1b"].current_progress_interval,
        "mpi_single_copy": os.environ.get("OMPI_MCA_btl_vader_single_copy_mechanism"),
        "device": str(dev),
        "transport": comm.transport(),
        "transfers": comm.transfers().as_dict(),
    }
    return result(fig, batch=B, m=m, balance_by=args.balance, balance=list(balance),
                  profile=profile, predicted=list(predicted), run=run, memory=memory,
                  memory_ms=ms, memory_rows=args.memory_rows)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.quick:
        args.steps, args.rounds, args.memory_ms = 1, 3, "2,4,8"
    if not under_mpi():
        return relaunch(__file__, 2, argv)
    comm.init(transport=args.transport)
    comm.abort_on_exception()
    result = worker(args)
    if comm.rank() == 0:
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
