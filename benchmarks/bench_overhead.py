"""hethpc's BSP path against a plain Horovod loop: epoch time and test accuracy, side by side.

    flock /tmp/hethpc-bench.lock .venv/bin/python benchmarks/bench_overhead.py [--quick]

Started as a plain process it relaunches itself under ``scripts/mpirun.sh -np 2``. Both loops
train the same 1-D CNN from the same initial weights on MNIST-1D (40,000 training samples),
same global batch, optimizer and seed, one after the other in the same job: first the plain
loop (``hvd.DistributedOptimizer``, each rank slicing a shuffled global batch), then
``hethpc.train.train`` with BSP (loader, batch controller, sync policy, non-finite vote,
metrics and watchdog all on, evaluation only at the end). Both loops take the same number of
steps per epoch (ceil(n / B)) from uniformly shuffled epochs at the same learning rate, and both
time every epoch from their first step (setup excluded on both sides). The machine may be
shared, so besides the mean epoch time the median epoch time of each is reported, and the ratio
the goal is judged by is the ratio of medians (``epoch_time_ratio``; ``mean_ratio`` beside it).
Goal (issue 7): hethpc's epoch time at most 1.05x Horovod's, its test accuracy within 0.5
points. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from _launch import relaunch, under_mpi
from torch import nn

from hethpc import comm
from hethpc.data import ArrayDataset, load_mnist1d
from hethpc.models import build_model
from hethpc.train import TrainConfig, evaluate, read_metrics, train


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="3 epochs each (about a minute)")
    p.add_argument("--epochs", type=int, default=20, help="epochs of each loop")
    p.add_argument("--samples", type=int, default=50_000, help="MNIST-1D samples (80%% train)")
    p.add_argument("--batch-size", type=int, default=128, help="global batch")
    p.add_argument("--lr", type=float, default=0.05, help="SGD learning rate")
    p.add_argument("--seed", type=int, default=0, help="model and shuffling seed")
    p.add_argument("--np", type=int, default=2, help="ranks (when relaunching under mpirun)")
    args = p.parse_args(argv)
    if args.quick:
        args.epochs = 3
    return args


def horovod_loop(
    args: argparse.Namespace, train_set: ArrayDataset
) -> tuple[list[float], nn.Module]:
    """The plain Horovod data-parallel loop; returns (seconds of each epoch, model)."""
    import horovod.torch as hvd  # the baseline is plain Horovod, on purpose

    rank, size = comm.rank(), comm.size()
    torch.manual_seed(args.seed)
    model = build_model("cnn1d", train_set.x.shape[1:], train_set.num_classes)
    with torch.no_grad():
        model(torch.zeros(2, *train_set.x.shape[1:]))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    if size > 1:
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    loss_fn = nn.CrossEntropyLoss()
    b, n = args.batch_size // size, len(train_set)
    steps = -(-n // args.batch_size)
    t0 = time.perf_counter()
    ends = []
    for epoch in range(args.epochs):
        perm = np.random.default_rng(args.seed + epoch).permutation(n)
        perm = np.concatenate([perm, perm[: steps * args.batch_size - n]])  # wrap the last batch
        for s in range(steps):
            idx = np.sort(perm[s * args.batch_size + rank * b :][:b])
            x, y = torch.from_numpy(train_set.x[idx]), torch.from_numpy(train_set.y[idx])
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()
        ends.append(time.perf_counter() - t0)
        if rank == 0:
            print(f"  horovod epoch {epoch + 1}/{args.epochs}  {time.perf_counter() - t0:.1f} s",
                  flush=True)  # fmt: skip
    return list(np.diff([0.0, *ends])), model


def hethpc_epochs(run_dir: Path, epochs: int) -> list[float]:
    """Seconds of each epoch of rank 0, from its step records (``time`` at each epoch's end)."""
    ends: dict[int, float] = {}
    for r in read_metrics(run_dir / "metrics" / "rank0.jsonl"):
        if r["kind"] == "step":
            ends[int(r["epoch"])] = float(r["time"])  # the last step of each epoch wins
    return list(np.diff([0.0, *(ends[e] for e in sorted(ends))]))[:epochs]


def worker(args: argparse.Namespace) -> None:
    comm.init()
    torch.set_num_threads(1)
    rank = comm.rank()
    cache = os.environ.get("HETHPC_CACHE", str(Path.home() / ".cache" / "hethpc"))
    if rank == 0:
        load_mnist1d(num_samples=args.samples, seed=42, cache_dir=cache)
    comm.barrier()
    train_set, test_set = load_mnist1d(num_samples=args.samples, seed=42, cache_dir=cache)
    say = print if rank == 0 else (lambda *_a, **_k: None)
    say(f"bench_overhead: {comm.size()} ranks, {len(train_set)} train samples, global batch "
        f"{args.batch_size}, {args.epochs} epochs per loop", flush=True)  # fmt: skip

    say("plain Horovod (hvd.DistributedOptimizer):", flush=True)
    hvd_epochs, hvd_model = horovod_loop(args, train_set)
    hvd_acc = evaluate(hvd_model, test_set)

    say("hethpc (jobs/train.py's loop, BSP):", flush=True)
    run_dir = comm.broadcast_object(tempfile.mkdtemp(prefix="hethpc-bench-") if rank == 0 else "")
    cfg = TrainConfig(
        samples=args.samples, cache_dir=cache, model="cnn1d", epochs=args.epochs,
        batch_size=args.batch_size, lr=args.lr, momentum=0.9, seed=args.seed, sync="bsp",
        eval_every=0, progress=False, run_dir=run_dir, watchdog_s=300,
    )  # fmt: skip
    result = train(cfg, overwrite=True, log=lambda m: say("  " + m, flush=True))
    het_s, het_acc = float(result.summary["time_s"]), float(result.summary["test_acc"])
    het_epochs = hethpc_epochs(Path(run_dir), args.epochs) if rank == 0 else []

    hvd_epoch, het_epoch = float(np.mean(hvd_epochs)), het_s / args.epochs
    hvd_med = float(np.median(hvd_epochs))
    het_med = float(np.median(het_epochs)) if het_epochs else het_epoch
    ratio, mean_ratio = het_med / hvd_med, het_epoch / hvd_epoch
    say("per-epoch seconds, horovod: " + " ".join(f"{t:.2f}" for t in hvd_epochs))
    say("per-epoch seconds, hethpc:  " + " ".join(f"{t:.2f}" for t in het_epochs))
    say(f"\n{'':10}{'mean epoch':>12}{'median':>10}{'test acc':>10}")
    say(f"{'horovod':10}{hvd_epoch:>10.2f} s{hvd_med:>8.2f} s{100 * hvd_acc:>9.2f}%")
    say(f"{'hethpc':10}{het_epoch:>10.2f} s{het_med:>8.2f} s{100 * het_acc:>9.2f}%")
    say(f"ratio of medians {ratio:.3f} (goal <= 1.05; of means {mean_ratio:.3f}), accuracy gap "
        f"{100 * (het_acc - hvd_acc):+.2f} points (goal within 0.5)")  # fmt: skip
    say(json.dumps({
        "hethpc_epoch_s": round(het_epoch, 4), "horovod_epoch_s": round(hvd_epoch, 4),
        "hethpc_median_epoch_s": round(het_med, 4), "horovod_median_epoch_s": round(hvd_med, 4),
        "epoch_time_ratio": round(ratio, 4), "mean_ratio": round(mean_ratio, 4),
        "hethpc_test_acc": round(het_acc, 4),
        "horovod_test_acc": round(hvd_acc, 4),
        "acc_gap_points": round(100 * (het_acc - hvd_acc), 2), "epochs": args.epochs,
        "ranks": comm.size(), "train_samples": len(train_set), "quick": args.quick,
    }), flush=True)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if under_mpi():
        worker(args)
        return 0
    return relaunch(__file__, args.np, argv)


if __name__ == "__main__":
    sys.exit(main())
