"""The peers' shared settings (``peer_horovod.py``, ``peer_ddp.py``): the run's flags and their
checks, and the learning-rate schedule, the same for both, so that they differ only in how
they synchronise."""

from __future__ import annotations

import argparse
from typing import Any

import torch

WSD_DECAY = 0.2  # wsd: the rate falls to 0 over the last 20 % of the steps, as hethpc's


def add_run_args(p: argparse.ArgumentParser) -> None:
    """The flags every peer takes: the run, its data and the protocol's evaluations."""
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
                   help="seed of the generated MNIST-1D data and of --val-fraction's split "
                   "(default 42, as hethpc's)")
    p.add_argument("--val-fraction", type=float, default=0.0,
                   help="hold out this fraction of the training samples as hethpc does: the "
                   "evaluations score it, the test split is scored at the end (default 0: none)")
    p.add_argument("--lr-schedule", choices=("constant", "wsd"), default="constant",
                   help="constant, or wsd: constant, then down in a straight line to 0 over the "
                   "last 20 %% of the steps, as hethpc's --lr-schedule wsd (default constant)")
    p.add_argument("--eval-every-steps", type=int, default=0, metavar="K",
                   help="evaluate every K steps and at the end (default 0: every epoch)")


def check_run_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse the flags of :func:`add_run_args` out of range, one line each (``p.error``)."""
    for name in ("epochs", "batch_size", "samples", "labels_per_rank"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if not 0.0 <= args.val_fraction < 0.5:
        p.error(f"--val-fraction must be in [0, 0.5), got {args.val_fraction}")
    if args.eval_every_steps < 0:
        p.error(f"--eval-every-steps must be 0 (every epoch) or more, got {args.eval_every_steps}")


def lr_factor(kind: str, step: int, total: int) -> float:
    """The learning-rate factor at ``step`` of ``total``: 1 (``constant``), or ``wsd``'s."""
    decay_from = (1.0 - WSD_DECAY) * total
    if kind == "constant" or step <= decay_from or total <= 0:
        return 1.0
    return max(0.0, (total - step) / (total - decay_from))


def lr_schedule(optimizer: torch.optim.Optimizer, kind: str, total: int) -> Any:
    """The schedule a user of the peer writes: a ``LambdaLR`` stepped after every optimizer
    step."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(kind, s, total))
