"""hethpc inside your own training loop: the Coordinator owns batch sizes, sync and weights.

    scripts/mpirun.sh -np 2 .venv/bin/python examples/own_loop.py --batching dynamic
    scripts/mpirun.sh -np 2 .venv/bin/python examples/own_loop.py --sync selsync --slowdown 1:2@0

scikit-learn's 8x8 digits (shipped with it), a small MLP and a plain SGD optimizer: the loop is
the user's. Each step the rank takes ``coord.batch_size`` samples (its share of the global
batch), times forward and backward, and ``coord.step()`` weighs its gradient by that share,
synchronises as the policy says and steps the optimizer. ``--slowdown 1:2@0`` emulates rank 1
being twice as slow, so that ``--batching dynamic`` has something to balance.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import torch
from sklearn.datasets import load_digits
from torch import nn

import hethpc
from hethpc import comm


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--sync", default="bsp", choices=["bsp", "selsync", "fedavg", "local"])
    ap.add_argument("--batching", default="uniform", choices=["uniform", "dynamic"])
    ap.add_argument("--slowdown", default="")
    args = ap.parse_args(argv)

    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x / 16.0, dtype=torch.float32)
    y = torch.tensor(y)
    test = slice(1500, None)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                          nn.Linear(512, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    coord = hethpc.Coordinator(model, opt, global_batch=256, sync=args.sync,
                               batching=args.batching, slowdown=args.slowdown)  # fmt: skip
    rng = np.random.default_rng(comm.rank())  # each rank draws its own samples
    loss_fn = nn.CrossEntropyLoss()
    for _ in range(args.steps):
        idx = rng.integers(0, 1500, coord.batch_size)
        coord.start()
        loss = loss_fn(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        coord.step(loss)
    coord.finish()
    with torch.no_grad():
        acc = (model(x[test]).argmax(1) == y[test]).float().mean().item()
    if comm.rank() == 0:
        sizes = coord.batch_sizes.tolist()
        print(f"test accuracy {100 * acc:.1f}%  batch sizes {sizes}  "
              f"synchronised {coord.policy.summary().sync_fraction:.0%} of steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())
