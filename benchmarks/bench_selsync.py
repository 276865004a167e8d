"""BSP vs SelSync on a communication-heavy model: wall time per step and per epoch.

    .venv/bin/python benchmarks/bench_selsync.py [--quick]

Started as a plain process it relaunches itself on 2 ranks (``--ranks``).

Both methods run in the same job, one after the other, from the same initial model and on the
same synthetic data (a random teacher labels Gaussian inputs). The model is an MLP of tens of
millions of parameters with a small per-rank batch, so BSP's per-step gradient allreduce
weighs as much as the compute. SelSync's epoch times include its warm-up (the first ``window``
steps always synchronise). Rank 0 prints progress; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import torch
from _launch import relaunch, under_mpi
from _training import policy_step
from torch import nn

from hethpc import comm
from hethpc.sync import SyncPolicy, make_policy


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a short run (under a minute)")
    p.add_argument("--epochs", type=int, default=3, help="epochs per method")
    p.add_argument("--steps", type=int, default=100, help="steps per epoch")
    p.add_argument("--ranks", type=int, default=2, help="ranks when relaunching")
    p.add_argument("--batch", type=int, default=16, help="samples per rank per step")
    p.add_argument("--width", type=int, default=3072, help="hidden width (3072: 15.8 M params)")
    p.add_argument("--threshold", type=float, default=0.3, help="SelSync threshold")
    p.add_argument("--window", type=int, default=25, help="SelSync EWMA window and warm-up")
    p.add_argument("--lr", type=float, default=0.01, help="SGD learning rate")
    args = p.parse_args(argv)
    if args.quick:
        # A smoke run: small model, short warm-up; its figures say little about the goal.
        args.epochs, args.steps, args.width, args.window = 2, 15, 1024, 10
    return args


def build(width: int, inputs: int, classes: int) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(inputs, width),
        nn.ReLU(),
        nn.Linear(width, width),
        nn.ReLU(),
        nn.Linear(width, inputs),
        nn.ReLU(),
        nn.Linear(inputs, classes),
    )


def run(
    policy: SyncPolicy, args: argparse.Namespace, data: list[tuple[torch.Tensor, torch.Tensor]]
) -> dict[str, object]:
    inputs, classes = data[0][0].shape[1], 10
    model = build(args.width, inputs, classes)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    epochs: list[float] = []
    compute = 0.0
    for epoch in range(args.epochs):
        comm.barrier()
        t0 = time.perf_counter()
        for x, y in data:
            loss, compute_s = policy_step(model, opt, policy, x, y)
            compute += compute_s
        comm.barrier()
        epochs.append(time.perf_counter() - t0)
        if comm.rank() == 0:
            s = policy.summary()
            print(
                f"  {policy.name:8s} epoch {epoch + 1}/{args.epochs}: {epochs[-1]:.2f} s, "
                f"loss {loss.item():.3f}, synced {s.synced_steps}/{s.steps}",
                flush=True,
            )
    s = policy.summary()
    steps = args.epochs * args.steps
    return {
        "epoch_s": float(np.mean(epochs)),
        "epochs_s": [round(e, 3) for e in epochs],
        "step_s": sum(epochs) / steps,
        "compute_s_per_step": compute / steps,
        "sync_s_per_step": s.sync_s / steps,
        "sync_fraction": s.sync_fraction,
        "bytes_vs_bsp": s.bytes_vs_bsp,
        "final_loss": float(loss.item()),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not under_mpi():
        return relaunch(__file__, args.ranks, argv)
    comm.abort_on_exception()
    comm.init()
    torch.set_num_threads(1)
    rank, size = comm.rank(), comm.size()
    inputs, classes = 1024, 10
    g = torch.Generator().manual_seed(1)
    teacher = torch.randn(inputs, classes, generator=g)
    g.manual_seed(100 + rank)
    data = []
    for _ in range(args.steps):
        x = torch.randn(args.batch, inputs, generator=g)
        data.append((x, (x @ teacher).argmax(1)))
    params = sum(p.numel() for p in build(args.width, inputs, classes).parameters())
    if rank == 0:
        print(
            f"bench_selsync: {size} rank(s), MLP width {args.width} ({params / 1e6:.1f} M params, "
            f"{params * 4 / 2**20:.0f} MiB of gradients), batch {args.batch}/rank, "
            f"{args.epochs} epochs x {args.steps} steps",
            flush=True,
        )
    results = {}
    for name, kw in [
        ("bsp", {}),
        ("selsync", {"threshold": args.threshold, "window": args.window}),
    ]:
        results[name] = run(make_policy(name, **kw), args, data)
    bsp, sel = results["bsp"], results["selsync"]
    speedup = float(bsp["epoch_s"]) / float(sel["epoch_s"])  # type: ignore[arg-type]
    if rank == 0:
        for name, r in results.items():
            print(
                f"{name:8s} epoch {r['epoch_s']:.2f} s  step {r['step_s'] * 1e3:.0f} ms "
                f"(compute {r['compute_s_per_step'] * 1e3:.0f} ms, sync "
                f"{r['sync_s_per_step'] * 1e3:.0f} ms)  synced {100 * r['sync_fraction']:.0f}% "
                f"of steps, bytes vs BSP {r['bytes_vs_bsp']:.2f}",  # type: ignore[operator]
                flush=True,
            )
        print(f"SelSync is {speedup:.2f}x faster per epoch than BSP (goal: >= 1.5x)", flush=True)
        print(
            json.dumps(
                {
                    "ranks": size,
                    "params": params,
                    "threshold": args.threshold,
                    "window": args.window,
                    "epochs": args.epochs,
                    "steps_per_epoch": args.steps,
                    "bsp_epoch_s": round(float(bsp["epoch_s"]), 4),  # type: ignore[arg-type]
                    "selsync_epoch_s": round(float(sel["epoch_s"]), 4),  # type: ignore[arg-type]
                    "speedup": round(speedup, 3),
                    "bsp_step_s": round(float(bsp["step_s"]), 4),  # type: ignore[arg-type]
                    "selsync_step_s": round(float(sel["step_s"]), 4),  # type: ignore[arg-type]
                    "sync_fraction": round(float(sel["sync_fraction"]), 4),  # type: ignore[arg-type]
                    "bytes_vs_bsp": round(float(sel["bytes_vs_bsp"]), 4),  # type: ignore[arg-type]
                    "bsp_epochs_s": bsp["epochs_s"],
                    "selsync_epochs_s": sel["epochs_s"],
                }
            ),
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
