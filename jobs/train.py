"""Train a model data-parallel across MPI ranks.

    scripts/mpirun.sh -np 2 .venv/bin/python jobs/train.py --epochs 5

Rank 0 prints loss and accuracy per epoch. Every flag is documented in ``--help``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from hethpc import comm
from hethpc.data import ArrayDataset, load_mnist1d
from hethpc.models import MODELS, build_model


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--model", choices=sorted(MODELS), default="cnn1d", help="built-in model")
    p.add_argument("--samples", type=int, default=20_000, help="MNIST-1D samples (80%% train)")
    p.add_argument("--data-seed", type=int, default=42, help="seed of the generated data")
    p.add_argument(
        "--cache-dir",
        default=os.environ.get("HETHPC_CACHE", str(Path.home() / ".cache" / "hethpc")),
        help="where generated data sets are kept (env HETHPC_CACHE)",
    )
    p.add_argument("--epochs", type=int, default=5, help="passes over the training set")
    p.add_argument("--batch-size", type=int, default=128, help="global batch (all ranks)")
    p.add_argument("--lr", type=float, default=0.05, help="SGD learning rate")
    p.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
    p.add_argument("--seed", type=int, default=0, help="model init and shuffling seed")
    return p.parse_args(argv)


def evaluate(model: nn.Module, data: ArrayDataset) -> float:
    """Accuracy of ``model`` on ``data`` (every rank computes it on the whole set)."""
    model.eval()
    with torch.no_grad():
        pred = model(torch.from_numpy(data.x)).argmax(1).numpy()
    model.train()
    return float((pred == data.y).mean())


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    comm.abort_on_exception()
    comm.init()
    torch.set_num_threads(1)
    rank, size = comm.rank(), comm.size()
    if args.batch_size < size:
        raise SystemExit(f"--batch-size {args.batch_size} is smaller than the {size} ranks")

    # Rank 0 generates the cached data first so the others only read it.
    if rank == 0:
        load_mnist1d(num_samples=args.samples, seed=args.data_seed, cache_dir=args.cache_dir)
    comm.barrier()
    train, test = load_mnist1d(num_samples=args.samples, seed=args.data_seed, cache_dir=args.cache_dir)

    torch.manual_seed(args.seed)
    model = build_model(args.model, train.x.shape[1:], train.num_classes)
    model(torch.from_numpy(train.x[:2]))  # materialise lazy layers before the broadcast
    comm.broadcast_model(model)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    loss_fn = nn.CrossEntropyLoss()

    local = args.batch_size // size + (1 if rank < args.batch_size % size else 0)
    offset = sum(args.batch_size // size + (1 if k < args.batch_size % size else 0) for k in range(rank))
    steps = len(train) // args.batch_size
    if rank == 0:
        print(
            f"hethpc: {size} rank(s), model {args.model}, {len(train)} train / {len(test)} test "
            f"samples, global batch {args.batch_size}, {steps} steps per epoch",
            flush=True,
        )
    t0 = time.perf_counter()
    for epoch in range(args.epochs):
        perm = np.random.default_rng(args.seed + epoch).permutation(len(train))
        total = torch.zeros(2, dtype=torch.float64)
        for step in range(steps):
            idx = np.sort(perm[step * args.batch_size + offset :][:local])
            x, y = torch.from_numpy(train.x[idx]), torch.from_numpy(train.y[idx])
            opt.zero_grad(set_to_none=False)
            loss = loss_fn(model(x), y)
            loss.backward()
            # Weighted by this rank's share of the global batch, summed: the global-batch gradient.
            grads = [p.grad for p in model.parameters() if p.grad is not None]
            comm.grouped_allreduce_(grads, comm.ReduceOp.SUM, prescale=local / args.batch_size)
            opt.step()
            total += torch.tensor([loss.item() * local, local], dtype=torch.float64)
        total = comm.allreduce(total, comm.ReduceOp.SUM)
        acc = evaluate(model, test)
        if rank == 0:
            print(
                f"epoch {epoch + 1}/{args.epochs}  loss {total[0] / total[1]:.4f}  "
                f"test accuracy {100 * acc:.1f}%  ({time.perf_counter() - t0:.1f} s)",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
