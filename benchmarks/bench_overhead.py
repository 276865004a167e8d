"""hethpc's BSP step against its peers: plain Horovod, PyTorch DDP (gloo), side by side.

    flock /tmp/hethpc-bench.lock .venv/bin/python benchmarks/bench_overhead.py [--quick]

Started as a plain process it relaunches itself under ``scripts/mpirun.sh -np 2``. Every loop
trains from the same initial weights with the same global batch, optimizer (SGD, momentum 0.9),
learning rate, seed and per-rank slices of the same shuffled epochs; evaluation is outside
every timed scope. The contenders:

- ``horovod``: a plain loop with ``hvd.DistributedOptimizer`` (per-parameter hooks, Horovod's
  tensor fusion, the allreduce overlapping the backward pass). With hethpc on its CPU default
  transport (``--transport auto``: mpi4py, Horovod not started), Horovod is started for each
  of this loop's turns and shut down after it, so each contender runs as it would alone: the
  others never share the cores with Horovod's polling thread, and Horovod keeps it;
- ``ddp``: the same loop with ``torch.nn.parallel.DistributedDataParallel`` over gloo
  (25 MB buckets fired by gradient hooks);
- ``hethpc``: the same loop with a plain optimizer and ``hethpc.sync.BSP().step`` (its weight
  check on, inside the gradient allreduce);
- ``overlap``: the same with ``BSP(overlap=True)``: 25 MB buckets allreduced by Horovod while
  the backward pass runs (``before_backward`` each step);
- ``job``: ``hethpc.train.train`` with BSP (loader, batch controller, sync policy, non-finite
  guard, metrics, watchdog), i.e. ``jobs/train.py``. On the small CNN it takes its turn in
  each round like the others: round ``e`` resumes the job's run for its epoch ``e`` (a
  checkpoint at each run's end), and its epoch time is the sum of that epoch's step times from
  its step records, the first step (which rebuilds the run's buffers after the resume) counted
  at the epoch's median step time. On the large model it runs after the others.

``hethpc``, ``overlap`` and ``job`` use the transport of ``--transport`` (default auto, what a
user's CPU job gets: mpi4py); ``--transport horovod`` measures them through Horovod, which
then runs for the whole benchmark.

Two models. The small 1-D CNN of MNIST-1D (8k parameters, global batch 128, 40,000 samples):
compute-bound, one epoch per contender in turn (``--epochs`` rounds), the median epoch time
reported. A communication-bound one (the built-in ``large``, 7.4M parameters, 30 MB of
gradients, global batch 32): ``--rounds`` rounds of ``--steps`` steps per contender in turn,
the median step time reported. Each ratio is the median of the rounds' own ratios (the host
drifts 10-30 % within seconds). Beside them, the same gradient bytes through each transport
(hethpc's flat buffer as the job's BSP step sums it, Horovod's grouped allreduce of the
parameter list, one Horovod tensor, gloo, mpi4py; the Horovod rows with Horovod started, the
others as the job runs them): median milliseconds and GB/s.

Goals: hethpc BSP at most 0.95x Horovod and 0.95x DDP per epoch (step), on both
models; its allreduce at least 0.9x the fastest transport on the same bytes; test accuracy of
the job within 0.1 point of the previous commit's. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from _launch import relaunch, under_mpi
from _scratch import scratch
from torch import nn

from hethpc import comm
from hethpc.data import ArrayDataset, load_mnist1d
from hethpc.models import build_model
from hethpc.sync import BSP
from hethpc.sync.averaging import average_gradients_
from hethpc.sync.powersgd import DEFAULT_START_STEP
from hethpc.train import TrainConfig, read_metrics, train
from hethpc.train.evaluation import evaluate

PEERS = ("horovod", "ddp", "hethpc", "overlap")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a short run (about a minute)")
    p.add_argument("--epochs", type=int, default=8, help="small CNN: epochs of each contender")
    p.add_argument("--samples", type=int, default=50_000, help="MNIST-1D samples (80%% train)")
    p.add_argument("--batch-size", type=int, default=128, help="small CNN: global batch")
    p.add_argument("--big-batch-size", type=int, default=32, help="large model: global batch")
    p.add_argument("--rounds", type=int, default=5, help="large model: rounds per contender")
    p.add_argument("--steps", type=int, default=20, help="large model: steps per round")
    p.add_argument("--lr", type=float, default=0.05, help="SGD learning rate")
    p.add_argument("--seed", type=int, default=0, help="model and shuffling seed")
    p.add_argument("--np", type=int, default=2, help="ranks (when relaunching)")
    p.add_argument(
        "--transport",
        default="auto",
        choices=comm.runtime.TRANSPORTS,
        help="hethpc's tensor transport (hethpc, overlap and job rows)",
    )
    args = p.parse_args(argv)
    if args.quick:
        args.epochs, args.rounds, args.steps = 2, 2, 5
    return args


def say(*a: object) -> None:
    if comm.rank() == 0:
        print(*a, flush=True)


@contextmanager
def horovod_up() -> Iterator[None]:
    """Horovod started for the enclosed code: started and shut down around it when hethpc's
    transport is not Horovod (the baseline is plain Horovod, on purpose)."""
    import horovod.torch as hvd

    if comm.transport() == "horovod":
        yield
        return
    hvd.init(comm=comm.runtime.state().mpi.COMM_WORLD)
    try:
        yield
    finally:
        hvd.shutdown()


class Loop:
    """One contender's model, optimizer and step, on this rank's slice of each global batch."""

    def __init__(self, kind: str, model_name: str, data: ArrayDataset, args: argparse.Namespace,
                 batch: int, compression: str = "none") -> None:  # fmt: skip
        """``compression``: ``none``, ``fp16``, ``bf16`` or ``powersgd:RANK``, each contender's
        own (``hethpc.sync``'s codecs, Horovod's ``Compression.fp16``, DDP's comm hooks)."""
        import horovod.torch as hvd  # the baseline is plain Horovod, on purpose

        torch.manual_seed(args.seed)
        self.model = build_model(model_name, data.x.shape[1:], data.num_classes)
        with torch.no_grad():
            self.model(torch.zeros(2, *data.x.shape[1:]))
        self.kind, self.data, self.batch, self.seed = kind, data, batch, args.seed
        opt = torch.optim.SGD(self.model.parameters(), lr=args.lr, momentum=0.9)
        self.net: nn.Module = self.model
        self.policy: BSP | None = None
        if kind == "horovod":
            with horovod_up():
                hvd.broadcast_parameters(self.model.state_dict(), root_rank=0)
                if compression not in ("none", "fp16"):
                    raise ValueError(f"Horovod compresses with fp16 only, not {compression!r}")
                opt = hvd.DistributedOptimizer(
                    opt, named_parameters=self.model.named_parameters(),
                    compression=hvd.Compression.fp16 if compression == "fp16"
                    else hvd.Compression.none,
                )  # fmt: skip
        elif kind == "ddp":
            # powerSGD_hook's callbacks start a bucket's second allreduce from gloo's threads,
            # so with two buckets the ranks can start them in different orders: on the testbed
            # both ranks hung in the first steps past its plain ones. One bucket avoids it.
            one = compression.startswith("powersgd")
            self.net = nn.parallel.DistributedDataParallel(
                self.model, bucket_cap_mb=1024 if one else 25
            )
            ddp_compression(self.net, compression)
        else:
            self.policy = BSP(keep_records=False, overlap=kind == "overlap",
                              compression=compression)  # fmt: skip
        self.opt = opt
        self.loss_fn = nn.CrossEntropyLoss()
        self.steps_per_epoch = -(-len(data) // batch)

    def run(self, epoch: int, steps: range) -> float:
        """Seconds of ``steps`` of ``epoch`` (from a barrier)."""
        if self.kind == "horovod":
            with horovod_up():
                return self._run(epoch, steps)
        return self._run(epoch, steps)

    def _run(self, epoch: int, steps: range) -> float:
        perm = np.random.default_rng(self.seed + epoch).permutation(len(self.data))
        rank, b, n = comm.rank(), self.batch // comm.size(), len(self.data)
        comm.barrier()
        t0 = time.perf_counter()
        for s in steps:
            start = (s * self.batch) % n + rank * b
            idx = np.sort(np.take(perm, np.arange(start, start + b), mode="wrap"))
            x, y = torch.from_numpy(self.data.x[idx]), torch.from_numpy(self.data.y[idx])
            self.opt.zero_grad()
            if self.policy is not None:
                self.policy.before_backward(self.model)
            self.loss_fn(self.net(x), y).backward()
            if self.policy is not None:
                self.policy.step(self.model, self.opt)
            else:
                self.opt.step()
        return time.perf_counter() - t0


def ddp_compression(ddp: nn.parallel.DistributedDataParallel, compression: str) -> None:
    """Register DDP's comm hook for ``compression`` (``fp16``, ``bf16``, ``powersgd:RANK``)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    name, _, rank = compression.partition(":")
    if name == "fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif name == "bf16":
        ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
    elif name == "powersgd":
        state = powerSGD_hook.PowerSGDState(
            process_group=None, matrix_approximation_rank=int(rank or 4),
            start_powerSGD_iter=DEFAULT_START_STEP,  # plain steps first, as many as hethpc's
        )  # fmt: skip
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    elif name != "none":
        raise ValueError(f"no DDP hook for compression {compression!r}")


def job_steps(run_dir: str, epoch: int | None = None) -> list[float]:
    """Rank 0's seconds of each step of a job (of ``epoch`` only, if given), from its step
    records."""
    recs = [r for r in read_metrics(Path(run_dir) / "metrics" / "rank0.jsonl")
            if r["kind"] == "step"]  # fmt: skip
    times = [0.0, *(float(r["time"]) for r in recs)]
    return [times[i + 1] - times[i] for i, r in enumerate(recs)
            if epoch is None or r["epoch"] == epoch]  # fmt: skip


def run_job(args: argparse.Namespace, cache: str, model: str, batch: int, *, run_dir: str,
            epochs: int = 0, max_steps: int = 0, resume: bool = False) -> dict:  # fmt: skip
    """Train (or with ``resume``, continue) the job in ``run_dir``; its summary."""
    cfg = TrainConfig(
        samples=args.samples, cache_dir=cache, model=model, epochs=max(epochs, 1),
        max_steps=max_steps, batch_size=batch, lr=args.lr, momentum=0.9, seed=args.seed,
        sync="bsp", eval_every=0, progress=False, run_dir=run_dir, watchdog_s=300,
        resume=resume, resume_changes="epochs" if resume else "", transport=args.transport,
    )  # fmt: skip
    return train(cfg, overwrite=not resume, log=lambda m: None).summary


def job_epoch(run_dir: str, epoch: int) -> float:
    """Rank 0's seconds of the job's ``epoch``; its first step (which follows the resume) is
    counted at the epoch's median step time."""
    steps = job_steps(run_dir, epoch)
    return statistics.median(steps) + sum(steps[1:])


def ratios(times: dict[str, list[float]], a: str, b: str) -> float:
    """Median over rounds of ``a``'s time over ``b``'s in the same round."""
    return statistics.median(x / y for x, y in zip(times[a], times[b], strict=True))


def transports(model: nn.Module, reps: int) -> dict[str, float]:
    """Median ms of one allreduce of ``model``'s gradient bytes through each transport."""
    import horovod.torch as hvd

    mpi = comm.runtime.state().mpi
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    grads = [torch.ones_like(p) for p in model.parameters()]
    flat = torch.ones(sum(g.numel() for g in grads))
    buf = flat.numpy()
    ways: dict[str, Callable[[], object]] = {
        # as the job's BSP step sums them: accumulated in place in the flat buffer, already
        # weighted through the loss (BSP.loss_scale), the weight check inside
        "hethpc": lambda: average_gradients_(model.parameters(), check=True, prescaled=True),
        "gloo": lambda: dist.all_reduce(flat),
        "mpi4py": lambda: mpi.COMM_WORLD.Allreduce(mpi.IN_PLACE, buf, op=mpi.SUM),
    }
    with_horovod: dict[str, Callable[[], object]] = {
        "horovod_grouped": lambda: hvd.grouped_allreduce_(grads, op=hvd.Average, name="b.g"),
        "horovod_flat": lambda: hvd.allreduce_(flat, op=hvd.Average, name="b.f"),
    }
    out: dict[str, list[float]] = {k: [] for k in (*ways, *with_horovod)}

    def time_each(fns: dict[str, Callable[[], object]], flip: bool) -> None:
        for k, fn in reversed(fns.items()) if flip else fns.items():
            comm.barrier()
            t0 = time.perf_counter()
            fn()
            out[k].append(time.perf_counter() - t0)

    for r in range(reps):  # every other round in reverse, so no transport always goes first
        time_each(ways, flip=r % 2 == 1)
        with horovod_up():
            time_each(with_horovod, flip=r % 2 == 1)
    return {k: 1e3 * statistics.median(v) for k, v in out.items()}


def worker(args: argparse.Namespace) -> None:
    comm.init(transport=args.transport)
    with scratch("hethpc-bench-") as new_dir:
        measure(args, new_dir)


def measure(args: argparse.Namespace, new_dir: Callable[[str], str]) -> None:
    """Every contender on both models, side by side; prints the figures and one JSON line."""
    torch.set_num_threads(1)
    rank = comm.rank()
    port = comm.broadcast_object(29500 + os.getpid() % 2000)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=comm.size())
    cache = os.environ.get("HETHPC_CACHE", str(Path.home() / ".cache" / "hethpc"))
    if rank == 0:
        load_mnist1d(num_samples=args.samples, seed=42, cache_dir=cache)
    comm.barrier()
    train_set, test_set = load_mnist1d(num_samples=args.samples, seed=42, cache_dir=cache)
    say(f"bench_overhead: {comm.size()} ranks, {len(train_set)} train samples")
    out: dict[str, object] = {"ranks": comm.size(), "quick": args.quick,
                              "transport": comm.transport()}  # fmt: skip
    say(f"hethpc's transport: {comm.transport()} (--transport {args.transport})")

    # The small CNN: one epoch of each contender in turn.
    say(f"\ncnn1d (8k parameters), global batch {args.batch_size}, {args.epochs} rounds of one "
        "epoch each:")  # fmt: skip
    loops = {k: Loop(k, "cnn1d", train_set, args, args.batch_size) for k in PEERS}
    times: dict[str, list[float]] = {k: [] for k in (*PEERS, "job")}
    job_dir = new_dir("cnn1d")
    for e in range(args.epochs):
        for k, loop in loops.items():
            times[k].append(loop.run(e, range(loop.steps_per_epoch)))
        summary = run_job(args, cache, "cnn1d", args.batch_size, run_dir=job_dir, epochs=e + 1,
                          resume=e > 0)  # fmt: skip
        times["job"].append(comm.broadcast_object(job_epoch(job_dir, e) if rank == 0 else 0.0))
        say(f"  epoch {e + 1}: " + "  ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items()))
    accs = {k: evaluate(loop.model, test_set) for k, loop in loops.items()}
    med = {k: statistics.median(v) for k, v in times.items()}
    accs["job"] = float(summary["test_acc"])
    small = {
        "epoch_s": {k: round(v, 4) for k, v in med.items()},
        "test_acc": {k: round(v, 4) for k, v in accs.items()},
        "hethpc_vs_horovod": round(ratios(times, "hethpc", "horovod"), 4),
        "hethpc_vs_ddp": round(ratios(times, "hethpc", "ddp"), 4),
        "overlap_vs_hethpc": round(ratios(times, "overlap", "hethpc"), 4),
        "job_vs_horovod": round(ratios(times, "job", "horovod"), 4),
        "job_vs_ddp": round(ratios(times, "job", "ddp"), 4),
    }
    say("  median epoch: " + "  ".join(f"{k} {v:.3f} s" for k, v in med.items()))
    say(
        f"  hethpc/horovod {small['hethpc_vs_horovod']}, hethpc/ddp {small['hethpc_vs_ddp']}, "
        f"job/horovod {small['job_vs_horovod']}, job/ddp {small['job_vs_ddp']} (goal <= 0.95)"
    )
    say(f"  overlap/hethpc {small['overlap_vs_hethpc']} (buckets during backward / after it)")
    out["cnn1d"] = small

    # The communication-bound model: rounds of --steps steps of each contender in turn.
    b = args.big_batch_size
    say(f"\nlarge (7.4M parameters, 30 MB of gradients), global batch {b}, {args.rounds} rounds "
        f"of {args.steps} steps:")  # fmt: skip
    loops = {k: Loop(k, "large", train_set, args, b) for k in PEERS}
    times = {k: [] for k in PEERS}
    for r in range(args.rounds):
        for k, loop in loops.items():
            steps_r = range(r * args.steps, (r + 1) * args.steps)
            times[k].append(loop.run(0, steps_r) / args.steps)
        say(f"  round {r + 1}: " + "  ".join(f"{k} {1e3 * times[k][-1]:.1f} ms" for k in PEERS))
    say("  the job:")
    run_dir = new_dir("large")
    run_job(args, cache, "large", b, run_dir=run_dir, max_steps=args.rounds * args.steps)
    steps = job_steps(run_dir)[1:] if rank == 0 else []  # the first step builds buffers
    med = {k: statistics.median(v) for k, v in times.items()}
    med["job"] = statistics.median(steps) if steps else float("nan")
    tx = transports(loops["hethpc"].model, reps=6 if args.quick else 20)
    nbytes = 4 * sum(p.numel() for p in loops["hethpc"].model.parameters())
    fastest = min(v for k, v in tx.items() if k != "hethpc")
    gb_per_s = {k: round(nbytes / v / 1e6, 3) for k, v in tx.items()}
    big = {
        "step_ms": {k: round(1e3 * v, 2) for k, v in med.items()},
        "hethpc_vs_horovod": round(ratios(times, "hethpc", "horovod"), 4),
        "hethpc_vs_ddp": round(ratios(times, "hethpc", "ddp"), 4),
        "overlap_vs_hethpc": round(ratios(times, "overlap", "hethpc"), 4),
        "job_vs_horovod": round(med["job"] / med["horovod"], 4),
        "job_vs_ddp": round(med["job"] / med["ddp"], 4),
        "allreduce_ms": {k: round(v, 2) for k, v in tx.items()},
        "allreduce_gb_per_s": gb_per_s,
        "allreduce_vs_fastest": round(fastest / tx["hethpc"], 4),
    }
    say("  median step: " + "  ".join(f"{k} {1e3 * v:.1f} ms" for k, v in med.items()))
    say(
        f"  hethpc/horovod {big['hethpc_vs_horovod']}, hethpc/ddp {big['hethpc_vs_ddp']}, "
        f"job/horovod {big['job_vs_horovod']}, job/ddp {big['job_vs_ddp']} (goal <= 0.95)"
    )
    say(
        "  allreduce of the gradient bytes: "
        + "  ".join(f"{k} {v:.1f} ms ({gb_per_s[k]} GB/s)" for k, v in tx.items())
    )
    say(f"  hethpc's throughput / the fastest other: {big['allreduce_vs_fastest']} (goal >= 0.9)")
    say(f"  overlap/hethpc {big['overlap_vs_hethpc']} (buckets during backward / after it)")
    out["large"] = big
    dist.destroy_process_group()
    say(json.dumps(out))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if under_mpi():
        worker(args)
        return 0
    return relaunch(__file__, args.np, argv)


if __name__ == "__main__":
    sys.exit(main())
