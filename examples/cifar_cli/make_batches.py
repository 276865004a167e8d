"""Write a small set in the CIFAR-10 python format (pickled batches), to try the CLI offline.

    .venv/bin/python examples/cifar_cli/make_batches.py --out /tmp/cifar-small

Real CIFAR-10 (``cifar-10-python.tar.gz``) has the same layout: ``data_batch_1 .. 5`` and
``test_batch``, each a dict with ``b"data"`` (uint8 ``[n, 3072]``) and ``b"labels"``. Here each
class is a colour and a stripe orientation with noise, so a CNN can learn it in a few epochs.
"""

from __future__ import annotations

import argparse
import pickle
import sys
from pathlib import Path

import numpy as np


def images(n: int, rng: np.random.Generator) -> tuple[np.ndarray, list[int]]:
    labels = rng.integers(0, 10, n)
    colours = np.array([[1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 0], [1, 0, 1]], np.float32)
    rows = np.arange(32)[:, None] + np.zeros(32)[None, :]
    stripes = [np.sin(rows * 0.8) > 0, np.sin(rows.T * 0.8) > 0]
    x = np.empty((n, 3, 32, 32), np.float32)
    for i, c in enumerate(labels):
        pattern = stripes[c // 5].astype(np.float32)
        x[i] = colours[c % 5][:, None, None] * (0.3 + 0.7 * pattern)[None]
    x = np.clip(x * 200 + rng.normal(0, 40, x.shape), 0, 255).astype(np.uint8)
    return x.reshape(n, 3072), [int(v) for v in labels]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="directory for data_batch_* and test_batch")
    ap.add_argument("--per-batch", type=int, default=500, help="images per batch file")
    ap.add_argument("--batches", type=int, default=2, help="training batch files")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    names = [f"data_batch_{i + 1}" for i in range(args.batches)] + ["test_batch"]
    for name in names:
        data, labels = images(args.per_batch, rng)
        with (out / name).open("wb") as f:
            pickle.dump({b"batch_label": name.encode(), b"labels": labels, b"data": data}, f)
    print(f"wrote {', '.join(names)} to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
