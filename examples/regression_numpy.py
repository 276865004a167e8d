"""Your own regression model on your own numpy arrays, through hethpc's Python API.

    scripts/mpirun.sh -np 2 .venv/bin/python examples/regression_numpy.py
    .venv/bin/python examples/regression_numpy.py --epochs 40 --sync selsync

The data is scikit-learn's diabetes set (442 patients, 10 features, a disease-progression
score: shipped with scikit-learn, no download), standardised. The model is a small MLP with
one output, the loss mean squared error: nothing here is built into hethpc. Every rank runs
the same script; hethpc splits each global batch across the ranks, synchronises as ``--sync``
says and writes metrics and checkpoints to the run directory.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import torch
from sklearn.datasets import load_diabetes
from torch import nn

import hethpc
from hethpc import comm


def load(seed: int = 0) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """Standardised ``(x, y)`` train and test arrays (an 80/20 split, the same on every rank)."""
    x, y = load_diabetes(return_X_y=True)
    order = np.random.default_rng(seed).permutation(len(y))
    x, y = x[order].astype(np.float32), y[order].astype(np.float32)
    cut = int(0.8 * len(y))
    mean, std = x[:cut].mean(0), x[:cut].std(0)
    y_mean, y_std = y[:cut].mean(), y[:cut].std()
    x, y = (x - mean) / std, (y - y_mean) / y_std
    return (x[:cut], y[:cut]), (x[cut:], y[cut:])


def model(features: int) -> nn.Module:
    return nn.Sequential(nn.Linear(features, 64), nn.ReLU(), nn.Linear(64, 1))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--sync", default="bsp", choices=["bsp", "selsync", "fedavg", "local"])
    ap.add_argument("--run-dir", default="")
    args = ap.parse_args(argv)

    torch.manual_seed(0)
    train, test = load()
    result = hethpc.fit(
        model(train[0].shape[1]),
        train,
        test_data=test,
        batch_size=32,
        epochs=args.epochs,
        lr=0.01,
        sync=args.sync,
        run_dir=args.run_dir,
        progress=False,
        eval_every=0,
    )
    # Standardised targets: predicting the mean scores 1.0; lower is better.
    if comm.rank() == 0:
        print(f"test mse {result.summary['test_mse']:.3f} (predicting the mean: 1.000)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
