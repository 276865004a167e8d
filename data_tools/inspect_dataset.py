"""Summarise, verify and plot an HDF5-sharded dataset, per shard and per rank of a partition.

    python data_tools/inspect_dataset.py data/mnist1d/train
    python data_tools/inspect_dataset.py data/mnist1d/train --verify
    python data_tools/inspect_dataset.py data/mnist1d/train --partitioner dirichlet --alpha 0.3 \\
        --world-size 4 --plot ranks.png

(Named inspect_dataset.py, not inspect.py: a script called inspect.py would shadow Python's
own ``inspect`` module, which torch and dataclasses import.)
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import numpy as np


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("path", help="dataset directory (holds manifest.json)")
    ap.add_argument("--verify", action="store_true",
                    help="check every shard's sha256, size, shapes and labels against the manifest")
    ap.add_argument("--partitioner", default=None,
                    choices=["iid", "seldp", "label_skew", "dirichlet"],
                    help="also show the label histogram per rank of this partition")
    ap.add_argument("--world-size", type=int, default=2, help="ranks of the partition")
    ap.add_argument("--seed", type=int, default=0, help="partition seed")
    ap.add_argument("--labels-per-rank", type=int, default=1, help="label_skew: k")
    ap.add_argument("--alpha", type=float, default=0.5, help="dirichlet: concentration")
    ap.add_argument("--min-size", type=int, default=10, help="dirichlet: smallest share")
    ap.add_argument("--plot", default=None, metavar="PNG", help="write histograms to this PNG")
    ap.add_argument("--no-locking", action="store_true",
                    help="open files without HDF5 locking (shared filesystems)")
    return ap.parse_args(argv)


def _row(name: str, counts: np.ndarray) -> str:
    return f"{name:>18} {int(counts.sum()):>9}  " + " ".join(f"{int(c):>6}" for c in counts)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # Imported after parsing, so that --help answers without loading torch.
    from hethpc.data import DatasetError, PartitionError, make_partitioner, open_dataset

    try:
        ds = open_dataset(args.path, verify=args.verify, locking=False if args.no_locking else None)
    except DatasetError as e:
        print(f"inspect: error: {e}", file=sys.stderr)
        return 1
    m = ds.manifest
    print(f"{ds.root}: {m.name} ({m.split}), {len(ds)} samples of shape {m.sample_shape} "
          f"{m.dtype}, {m.num_classes} classes, {len(m.shards)} shard(s), chunk "
          f"{m.chunk_samples} samples, compression {m.compression}")
    if args.verify:
        print("verify: OK (sha256, sizes, shapes, dtypes and label histograms match)")
    header = f"{'':>18} {'samples':>9}  " + " ".join(f"{c:>6}" for c in range(m.num_classes))
    print("\nlabel histogram per shard\n" + header)
    for s in m.shards:
        print(_row(s.file, np.asarray(s.label_counts)))
    per_rank: list[np.ndarray] = []
    if args.partitioner:
        kw: dict[str, Any] = {}
        if args.partitioner == "label_skew":
            kw = {"labels_per_rank": args.labels_per_rank, "num_classes": m.num_classes}
        elif args.partitioner == "dirichlet":
            kw = {"alpha": args.alpha, "min_size": args.min_size}
        try:
            parts = make_partitioner(args.partitioner, **kw).all_indices(
                ds.labels, args.world_size, args.seed)
        except PartitionError as e:
            print(f"inspect: error: {e}", file=sys.stderr)
            return 1
        print(f"\nlabel histogram per rank ({args.partitioner}, {args.world_size} ranks, "
              f"seed {args.seed})\n" + header)
        for r, idx in enumerate(parts):
            per_rank.append(np.bincount(ds.labels[idx], minlength=m.num_classes))
            print(_row(f"rank {r}", per_rank[-1]))
        covered = len(np.unique(np.concatenate(parts)))
        if covered < len(ds):
            print(f"note: {len(ds) - covered} samples are in no rank's share")
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        rows = [("shards", np.array([s.label_counts for s in m.shards]))]
        if per_rank:
            rows.append((f"ranks ({args.partitioner})", np.array(per_rank)))
        fig, axes = plt.subplots(1, len(rows), figsize=(6 * len(rows), 4), squeeze=False)
        for ax, (title, counts) in zip(axes[0], rows, strict=True):
            bottom = np.zeros(len(counts))
            for c in range(m.num_classes):
                ax.bar(range(len(counts)), counts[:, c], bottom=bottom, label=str(c))
                bottom += counts[:, c]
            ax.set_title(f"label histogram per {title}")
            ax.set_xlabel(title.split()[0][:-1])
            ax.set_ylabel("samples")
        if m.num_classes <= 20:
            axes[0][-1].legend(title="label", fontsize="small", ncol=2)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=80)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
