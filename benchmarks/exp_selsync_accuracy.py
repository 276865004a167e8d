"""Accuracy of SelSync beside BSP, FedAvg and local-only on MNIST-1D, IID and non-IID.

    flock /tmp/hethpc-bench.lock \\
        scripts/mpirun.sh -np 4 .venv/bin/python benchmarks/exp_selsync_accuracy.py [--quick]

Every method trains the same model from the same initial weights, with the same seed, global
batch and number of epochs. IID: each rank takes its slice of every global batch. Non-IID:
each rank holds the samples of ``--labels-per-rank`` labels (label skew); "selsync+inject"
adds data injection (alpha = beta = 0.5: the local batch shrinks to b / (1 + alpha beta N) and
senders share a beta fraction of it). After training, ``policy.finish`` averages the replicas
(FedAvg, local-only, SelSync after local steps) and rank 0 evaluates on the whole test set.
Rank 0 prints a table per setting; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _training import policy_step

from hethpc import comm
from hethpc.data import ArrayDataset, Injector, Loader, load_mnist1d
from hethpc.data.partition import LabelSkewPartitioner
from hethpc.models import build_model
from hethpc.sync import make_policy
from hethpc.train.evaluation import evaluate

METHODS = {
    "iid": ["bsp", "selsync", "selsync:previous", "selsync:window", "fedavg", "fedavg:22", "local"],
    "noniid": ["bsp", "fedavg", "selsync", "selsync+inject"],
}
# Every SelSync variant the experiment knows: "selsync" (the default criterion),
# "selsync:<criterion>" (another significance criterion, see SignificanceTracker), "+bound" (a
# staleness bound: at most --max-local-steps local steps in a row), "+inject" (data injection).
# "fedavg:<H>" is FedAvg with period H (a fixed schedule at a chosen sync fraction, as control).
VARIANTS = [
    "selsync:window",
    "selsync:last_sync",
    "selsync:previous",
    "selsync:delta",
    "selsync:delta_mean",
    "selsync:last_sync+bound",
    "selsync:previous+bound",
    "selsync:window+bound",
]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--setting", choices=["iid", "noniid", "both"], default="both")
    p.add_argument("--quick", action="store_true", help="2 epochs on 5000 samples")
    p.add_argument(
        "--methods",
        default="",
        help="comma-separated methods to run instead of the setting's table, e.g. "
        "'selsync,selsync:previous,selsync:window+bound'; 'variants' runs every SelSync variant",
    )
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--samples", type=int, default=20_000, help="MNIST-1D samples (80%% train)")
    p.add_argument("--batch", type=int, default=128, help="global batch")
    p.add_argument("--model", default="cnn1d")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threshold", type=float, default=0.3, help="SelSync threshold")
    p.add_argument("--window", type=int, default=25, help="SelSync EWMA window")
    p.add_argument("--period", type=int, default=10, help="FedAvg steps between averages")
    p.add_argument(
        "--max-local-steps", type=int, default=25, help="SelSync '+bound': staleness bound"
    )
    p.add_argument("--labels-per-rank", type=int, default=2, help="non-IID label skew")
    p.add_argument("--alpha", type=float, default=0.5, help="injection: fraction of senders")
    p.add_argument("--beta", type=float, default=0.5, help="injection: fraction of a batch sent")
    p.add_argument(
        "--cache-dir",
        default=os.environ.get("HETHPC_CACHE", str(Path.home() / ".cache" / "hethpc")),
    )
    args = p.parse_args(argv)
    if args.quick:
        args.epochs, args.samples = 2, 5_000
    return args


def train_one(
    method: str, setting: str, args: argparse.Namespace, train: ArrayDataset, test: ArrayDataset
) -> dict[str, Any]:
    rank, size = comm.rank(), comm.size()
    torch.manual_seed(args.seed)
    model = build_model(args.model, train.x.shape[1:], train.num_classes)
    model(torch.from_numpy(train.x[:2]))  # materialise lazy layers
    comm.broadcast_model(model)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    base, *extras = method.split("+")
    name, _, criterion = base.partition(":")
    kw: dict[str, Any] = {}
    if name == "selsync":
        kw = {"threshold": args.threshold, "window": args.window}
        if criterion:
            kw["criterion"] = criterion
        if "bound" in extras:
            kw["max_local_steps"] = args.max_local_steps
    elif name == "fedavg":
        kw = {"period": int(criterion) if criterion else args.period}  # "fedavg:<H>"
    policy = make_policy(name, **kw)
    sizes = np.full(size, args.batch // size, dtype=np.int64)
    sizes[: args.batch % size] += 1
    if setting == "iid":
        loader = Loader(train, rank=rank, world_size=size, mode="iid", seed=args.seed)
    else:
        # The published non-IID setting: labels nobody holds are left out on purpose.
        part = LabelSkewPartitioner(labels_per_rank=args.labels_per_rank, allow_uncovered=True)
        idx = part.indices(train.y, size, rank, args.seed)
        loader = Loader(
            train, rank=rank, world_size=size, mode="partition", indices=idx, seed=args.seed
        )
    injector = Injector(args.alpha, args.beta, seed=args.seed) if "inject" in extras else None
    if injector is not None:
        sizes = np.array([injector.local_batch(int(b)) for b in sizes], dtype=np.int64)
    steps = len(train) // args.batch
    comm.barrier()
    t0 = time.perf_counter()
    step = 0
    for _ in range(args.epochs):
        for _ in range(steps):
            x, y = loader.next_batch(sizes)
            if injector is not None:
                x, y = injector.exchange(x, y, step)
            policy_step(model, opt, policy, x, y)
            step += 1
    before = evaluate(model, test)  # rank 0's replica before the final average
    policy.finish(model)
    comm.barrier()
    wall = time.perf_counter() - t0
    loader.close()
    s = policy.summary()
    return {
        "method": method,
        "test_acc": round(100 * evaluate(model, test), 2),
        "rank0_replica_acc": round(100 * before, 2),
        "sync_fraction": round(s.sync_fraction, 4),
        "forced_fraction": round(getattr(policy, "forced_syncs", 0) / max(s.steps, 1), 4),
        "bytes_vs_bsp": round(s.bytes_vs_bsp, 4),
        "steps": s.steps,
        "wall_s": round(wall, 1),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    comm.abort_on_exception()
    comm.init()
    torch.set_num_threads(1)
    rank, size = comm.rank(), comm.size()
    if rank == 0:
        load_mnist1d(num_samples=args.samples, seed=42, cache_dir=args.cache_dir)
    comm.barrier()
    train, test = load_mnist1d(num_samples=args.samples, seed=42, cache_dir=args.cache_dir)
    settings = ["iid", "noniid"] if args.setting == "both" else [args.setting]
    if rank == 0:
        print(
            f"exp_selsync_accuracy: {size} ranks, {args.model}, {len(train)} train / {len(test)} "
            f"test, global batch {args.batch}, {args.epochs} epochs, lr {args.lr}, seed "
            f"{args.seed}; SelSync threshold {args.threshold} window {args.window}; FedAvg "
            f"period {args.period}; non-IID: {args.labels_per_rank} labels/rank, injection "
            f"alpha {args.alpha} beta {args.beta}",
            flush=True,
        )
    out: dict[str, Any] = {"ranks": size, "epochs": args.epochs, "seed": args.seed}
    for setting in settings:
        rows = []
        wanted = [v for m in args.methods.split(",") if m for v in VARIANTS if m == "variants"]
        wanted = [m for m in args.methods.split(",") if m and m != "variants"] + wanted
        for method in wanted or METHODS[setting]:
            row = train_one(method, setting, args, train, test)
            rows.append(row)
            if rank == 0:
                print(f"  {setting} {method}: {row}", flush=True)
        out[setting] = rows
        if rank == 0:
            print(f"\n{setting.upper()} ({size} ranks, {args.epochs} epochs)")
            print(
                "| method | test acc % | rank-0 replica before final avg % | steps synced "
                "(of which forced by the bound) | bytes vs BSP | wall s |"
            )
            print("| --- | --- | --- | --- | --- | --- |")
            for r in rows:
                print(
                    f"| {r['method']} | {r['test_acc']:.2f} | {r['rank0_replica_acc']:.2f} | "
                    f"{100 * r['sync_fraction']:.1f} % ({100 * r['forced_fraction']:.1f} %) | "
                    f"{r['bytes_vs_bsp']:.3f} | {r['wall_s']} |"
                )
            print(flush=True)
    if rank == 0:
        print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
