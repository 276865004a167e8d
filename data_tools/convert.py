"""Convert data into hethpc's HDF5-sharded format (one directory per split).

    python data_tools/convert.py mnist1d --out data/mnist1d --samples 20000
    python data_tools/convert.py digits --out data/digits
    python data_tools/convert.py npz data.npz --out data/mine
    python data_tools/convert.py npy x.npy y.npy --out data/mine
    python data_tools/convert.py idx train-images.gz train-labels.gz --out data/mnist
    python data_tools/convert.py cifar cifar-10/data_batch_* --test cifar-10/test_batch --out c10
    python data_tools/convert.py synthetic --out /tmp/synth --samples 100000 --shape 1024

Each split is written to ``OUT/<split>/`` (``manifest.json`` + ``shard-*.h5``). Source files are
only read. An existing dataset is replaced only with ``--force``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from hethpc.data import Manifest


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="output directory; splits go in OUT/<split>/")
    p.add_argument("--name", default=None, help="dataset name in the manifest (default: source)")
    p.add_argument("--shard-samples", type=int, default=65_536, help="samples per shard file")
    p.add_argument("--chunk-samples", type=int, default=None,
                   help="samples per HDF5 chunk (default: about 1 MiB)")
    p.add_argument("--compression", choices=["none", "gzip", "lzf"], default="none",
                   help="HDF5 compression filter")
    p.add_argument("--num-classes", type=int, default=None,
                   help="number of classes (default: from the source or max label + 1)")
    p.add_argument("--force", action="store_true", help="replace an existing dataset at OUT")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = ap.add_subparsers(dest="source", required=True)
    p = sub.add_parser("mnist1d", help="MNIST-1D generated locally by the mnist1d package")
    p.add_argument("--samples", type=int, default=5000, help="train + test samples (80/20)")
    p.add_argument("--seed", type=int, default=42, help="generator seed")
    _common(p)
    p = sub.add_parser("digits", help="scikit-learn's 8x8 digits (1797 samples)")
    p.add_argument("--test-fraction", type=float, default=0.2, help="held-out fraction")
    p.add_argument("--seed", type=int, default=0, help="split seed")
    _common(p)
    p = sub.add_parser("npz", help="an .npz archive with sample and label arrays")
    p.add_argument("path", help=".npz file")
    p.add_argument("--x-key", default="x", help="array of samples")
    p.add_argument("--y-key", default="y", help="array of labels")
    p.add_argument("--split", default="train", help="split name")
    _common(p)
    p = sub.add_parser("npy", help="a pair of .npy files (samples, labels), memory-mapped")
    p.add_argument("x", help="samples .npy")
    p.add_argument("y", help="labels .npy")
    p.add_argument("--split", default="train", help="split name")
    _common(p)
    p = sub.add_parser("idx", help="MNIST IDX image and label files, plain or gzipped")
    p.add_argument("images", help="IDX images file")
    p.add_argument("labels", help="IDX labels file")
    p.add_argument("--split", default="train", help="split name")
    _common(p)
    p = sub.add_parser("cifar", help="CIFAR-10/100 python pickle batches")
    p.add_argument("batches", nargs="+", help="training batch files")
    p.add_argument("--test", nargs="*", default=[], help="test batch files")
    _common(p)
    p = sub.add_parser("synthetic", help="seeded synthetic data of any shape and size")
    p.add_argument("--samples", type=int, default=10_000, help="number of samples")
    p.add_argument("--shape", type=int, nargs="+", default=[64], help="sample shape")
    p.add_argument("--classes", type=int, default=10, help="number of classes")
    p.add_argument("--seed", type=int, default=0, help="generator seed")
    p.add_argument("--split", default="train", help="split name")
    _common(p)
    return ap.parse_args(argv)


def _peek(pieces: Iterator[tuple[np.ndarray, np.ndarray]]) -> tuple[
    tuple[np.ndarray, np.ndarray] | None, Iterator[tuple[np.ndarray, np.ndarray]]
]:
    first = next(pieces, None)
    return first, pieces


def write_split(
    args: argparse.Namespace,
    split: str,
    pieces: Iterator[tuple[np.ndarray, np.ndarray]],
    num_classes: int | None,
) -> Manifest:
    """Stream ``pieces`` into ``OUT/<split>``."""
    from hethpc.data import DatasetError, DatasetWriter

    first, rest = _peek(pieces)
    if first is None:
        raise DatasetError(f"the {split} source holds no samples")
    x0, y0 = first
    if num_classes is None:
        # Labels beyond the first piece are checked by the writer against this count.
        num_classes = int(y0.max()) + 1
    w = DatasetWriter(
        f"{args.out}/{split}",
        sample_shape=x0.shape[1:],
        num_classes=num_classes,
        dtype=x0.dtype,
        name=args.name or args.source,
        split=split,
        shard_samples=args.shard_samples,
        chunk_samples=args.chunk_samples,
        compression=None if args.compression == "none" else args.compression,
        force=args.force,
        meta={"source": args.source, "argv": sys.argv[1:]},
    )
    with w:
        w.write(x0, y0)
        for x, y in rest:
            w.write(x, y)
    assert w.manifest is not None
    return w.manifest


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # Imported after parsing, so that --help answers without loading torch.
    from hethpc.data import DatasetError, load_mnist1d, sources

    nc = args.num_classes
    splits: list[tuple[str, Iterator[tuple[np.ndarray, np.ndarray]], int | None]] = []
    if args.source == "mnist1d":
        train, test = load_mnist1d(num_samples=args.samples, seed=args.seed)
        splits = [("train", sources.pieces_of(train.x, train.y), nc or 10),
                  ("test", sources.pieces_of(test.x, test.y), nc or 10)]
    elif args.source == "digits":
        from sklearn.datasets import load_digits

        d = load_digits()
        x, y = (d.data / 16.0).astype(np.float32), d.target.astype(np.int64)
        perm = np.random.default_rng(args.seed).permutation(len(y))
        k = int(round(len(y) * (1 - args.test_fraction)))
        splits = [("train", sources.pieces_of(x[perm[:k]], y[perm[:k]]), nc or 10)]
        if k < len(y):
            splits.append(("test", sources.pieces_of(x[perm[k:]], y[perm[k:]]), nc or 10))
    elif args.source == "npz":
        if nc is None:
            with np.load(args.path) as f:
                nc = int(f[args.y_key].max()) + 1 if args.y_key in f.files else None
        splits = [(args.split, sources.npz_pieces(args.path, x_key=args.x_key,
                                                  y_key=args.y_key), nc)]
    elif args.source == "npy":
        nc = nc or int(np.load(args.y, mmap_mode="r").max()) + 1
        splits = [(args.split, sources.npy_pieces(args.x, args.y), nc)]
    elif args.source == "idx":
        splits = [(args.split, sources.idx_pieces(args.images, args.labels), nc or 10)]
    elif args.source == "cifar":
        pieces, classes = sources.cifar_pieces(args.batches)
        splits = [("train", pieces, nc or classes)]
        if args.test:
            tpieces, _ = sources.cifar_pieces(args.test)
            splits.append(("test", tpieces, nc or classes))
    elif args.source == "synthetic":
        splits = [(args.split, sources.synthetic_pieces(
            args.samples, tuple(args.shape), num_classes=args.classes, seed=args.seed),
            nc or args.classes)]
    for split, pieces, classes in splits:
        try:
            m = write_split(args, split, pieces, classes)
        except DatasetError as e:
            print(f"convert: error: {e}", file=sys.stderr)
            return 2
        print(f"{args.out}/{split}: {m.num_samples} samples of shape {m.sample_shape} "
              f"({m.dtype}), {m.num_classes} classes, {len(m.shards)} shard(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
