"""A peer of hethpc: plain Horovod data-parallel training, as Horovod's own examples write it.

    scripts/mpirun.sh -np 2 .venv/bin/python benchmarks/peer_horovod.py --epochs 6
    python3 jobs/testbed.py --name peers run --node cpu=1,link=1gbit \\
        --node cpu=0.5,link=200mbit -- scripts/mpirun.sh -np 2 .venv/bin/python \\
        benchmarks/peer_horovod.py --out runs/peer_horovod.json

What a user would run instead of hethpc, unchanged, so that comparisons run it beside hethpc
on the same uneven cluster: the loop of ``examples/pytorch/pytorch_mnist.py`` (``hvd.init``,
``hvd.DistributedOptimizer``, ``broadcast_parameters`` and ``broadcast_optimizer_state``,
equal per-rank batches, test metrics averaged by ``hvd.allreduce``), training the model and
data of hethpc's demo (``jobs/demo.toml``): ``cnn1d_wide`` on the 20,000-sample MNIST-1D that
hethpc generates (80 % train, 20 % test, cached in ``$HETHPC_CACHE`` or ``~/.cache/hethpc``).
Only the model factory and the data generator come from hethpc, never its training loop.

``--batch-size`` is the global batch (each of N ranks takes ``batch / N``) and ``--lr`` is the
rate for it, as in hethpc, so the same flags mean the same optimisation. ``--partition iid``
shards the samples as ``torch.utils.data.DistributedSampler`` does; ``labels`` gives rank
``r`` the samples of hethpc's label-skew partition (``--labels-per-rank`` labels each), each
rank's share shuffled every epoch and padded with its own samples to the largest share, so that
every rank takes the same number of steps (Horovod's allreduce needs it).

Rank 0 prints one line per epoch (its training time, evaluation excluded, mean training loss
over all ranks, test accuracy) and the summary as one JSON object on the last line, also
written to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import horovod.torch as hvd
import torch
import torch.nn.functional as F
from _peer_data import load_data, train_sampler
from torch.utils.data import DataLoader, DistributedSampler

from hethpc.models import build_model

PEER = "horovod"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=6, help="epochs to train (default 6)")
    p.add_argument("--batch-size", type=int, default=128,
                   help="global batch: samples per step over all ranks (default 128)")
    p.add_argument("--lr", type=float, default=0.05,
                   help="SGD learning rate for the global batch (default 0.05)")
    p.add_argument("--momentum", type=float, default=0.9, help="SGD momentum (default 0.9)")
    p.add_argument("--seed", type=int, default=0,
                   help="model initialisation, shuffling and partition seed (default 0)")
    p.add_argument("--partition", choices=("iid", "labels"), default="iid",
                   help="iid: DistributedSampler shards; labels: hethpc's label skew")
    p.add_argument("--labels-per-rank", type=int, default=6,
                   help="labels each rank holds with --partition labels (default 6)")
    p.add_argument("--samples", type=int, default=20_000,
                   help="MNIST-1D samples to generate, 80 %% train, 20 %% test (default 20000)")
    p.add_argument("--data-seed", type=int, default=42,
                   help="seed of the generated MNIST-1D data (default 42, as hethpc's)")
    p.add_argument("--fp16-allreduce", action="store_true",
                   help="compress gradients to fp16 in the allreduce (Horovod's Compression.fp16)")
    p.add_argument("--out", type=Path, help="write the JSON summary here (rank 0)")
    args = p.parse_args(argv)
    for name in ("epochs", "batch_size", "samples", "labels_per_rank"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    return args


def metric_sum(values: list[float], name: str) -> list[float]:
    """``values`` summed over the ranks."""
    return hvd.allreduce(torch.tensor(values, dtype=torch.float64), op=hvd.Sum, name=name).tolist()


def test_accuracy(model: torch.nn.Module, loader: DataLoader) -> float:
    model.eval()
    correct = count = 0
    with torch.no_grad():
        for x, y in loader:
            correct += int((model(x).argmax(1) == y).sum())
            count += len(y)
    model.train()
    correct_all, count_all = metric_sum([correct, count], "test_accuracy")
    return correct_all / count_all


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    hvd.init()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)  # Horovod: limit the CPU threads used per worker
    if args.batch_size % hvd.size():
        raise SystemExit(f"--batch-size {args.batch_size} must be a multiple of the "
                         f"{hvd.size()} ranks (every rank takes an equal batch)")  # fmt: skip
    per_rank = args.batch_size // hvd.size()
    train_set, test_set, labels = load_data(args, hvd.rank(), hvd.barrier)
    sampler = train_sampler(args, train_set, labels, hvd.rank(), hvd.size())
    train_loader = DataLoader(train_set, batch_size=per_rank, sampler=sampler)
    test_sampler: DistributedSampler[int] = DistributedSampler(
        test_set, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=False
    )
    test_loader = DataLoader(test_set, batch_size=1000, sampler=test_sampler)

    model = build_model("cnn1d_wide", tuple(train_set.tensors[0].shape[1:]), 10)
    with torch.no_grad():
        model(train_set.tensors[0][:2])  # materialise the lazy layer before the broadcast
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression, op=hvd.Average)  # fmt: skip

    epochs: list[dict[str, Any]] = []
    trained = 0.0  # samples over all ranks
    start = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        sampler.set_epoch(epoch)
        model.train()
        loss_sum = seen = 0.0
        t0 = time.perf_counter()
        for x, y in train_loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            loss_sum += loss.item() * len(y)
            seen += len(y)
        time_s = time.perf_counter() - t0
        loss_all, seen_all = metric_sum([loss_sum, seen], "train_loss")
        trained += seen_all
        row = {"epoch": epoch, "time_s": time_s, "test_acc": test_accuracy(model, test_loader),
               "train_loss": loss_all / seen_all}  # fmt: skip
        epochs.append(row)
        if hvd.rank() == 0:
            print(f"epoch {epoch}  time {time_s:.2f} s  train loss {row['train_loss']:.4f}  "
                  f"test accuracy {row['test_acc']:.4f}", flush=True)  # fmt: skip
    train_s = sum(e["time_s"] for e in epochs)
    summary = {
        "peer": PEER,
        "world_size": hvd.size(),
        "testbed": os.environ.get("HETHPC_TESTBED"),
        "epochs": epochs,
        "total_time_s": train_s,
        "wall_s": time.perf_counter() - start,
        "samples_per_s": trained / train_s,
        "steps_per_epoch": len(train_loader),
        "per_rank_batch": per_rank,
        "final_test_acc": epochs[-1]["test_acc"],
        "settings": {**{k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                     "model": "cnn1d_wide"},  # fmt: skip
    }
    if hvd.rank() == 0:
        if args.out is not None:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(summary, indent=1) + "\n")
        print(json.dumps(summary), flush=True)
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
