"""Convert data into hethpc's HDF5-sharded format (one directory per split).

    python data_tools/convert.py mnist1d --out data/mnist1d --samples 20000
    python data_tools/convert.py digits --out data/digits
    python data_tools/convert.py npz data.npz --out data/mine
    python data_tools/convert.py npy x.npy y.npy --out data/mine --test-fraction 0.1 --seed 3
    python data_tools/convert.py idx train-images.gz train-labels.gz --out data/mnist
    python data_tools/convert.py cifar cifar-10/data_batch_* --test cifar-10/test_batch --out c10
    python data_tools/convert.py synthetic --out /tmp/synth --samples 100000 --shape 1024
    python data_tools/convert.py text --out data/stdlib

Each split is written to ``OUT/<split>/`` (``manifest.json`` + ``shard-*.h5``), so that
``jobs/train.py --data OUT`` finds both ``OUT/train`` and ``OUT/test``. mnist1d has its own
80/20 split and cifar takes its test split from ``--test`` files. Every other source (and
cifar without ``--test``) holds out ``--test-fraction`` of its samples (default 0.2) as
``test``, chosen by a ``--seed``-ed permutation (default 0: the same files give the same
split); each split keeps the source's order. ``--test-fraction 0`` writes everything to
``OUT/train``, and ``--split NAME`` (npz, npy, idx, synthetic) writes everything to
``OUT/NAME`` only, without a test split. ``text`` reads text files as byte windows and holds
out whole files as ``OUT/val`` and ``OUT/test`` (``convert.py text --help``).

Source files are only read, and they are not trusted: CIFAR pickles may name only the numpy
globals a real batch needs, ``.npy``/``.npz`` arrays are read without pickle, and IDX headers
are checked against the file's length. A source or option at fault ends the run with one line,
``convert.py: error: <file or option>: <what is wrong>; <what was expected>`` (``hethpc-convert:``
when run by that name), and exit code 2. An existing dataset is replaced only with ``--force``.
Labels must count from 0; the number of classes is ``--num-classes``, else the source's own,
else the largest label + 1, with a warning that names any class left without samples.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, NoReturn

import numpy as np

from hethpc.cli import convert_text
from hethpc.cli.parser import ArgumentParser, command_name, flag_hint

if TYPE_CHECKING:
    from hethpc.data import Manifest

# The name the user ran the program by (hethpc-convert or convert.py), set by main().
PROG = "convert.py"
TEST_FRACTION = 0.2

Split = tuple[str, Iterator[tuple[np.ndarray, np.ndarray]], int | None]


class UsageError(ValueError):
    """An option value no conversion can use; the message starts with the option."""


class _Parser(ArgumentParser):
    """Reports a bad command line in the one-line form of every other error."""

    def error(self, message: str) -> NoReturn:
        hint = flag_hint(self, message)
        self.exit(2, f"{PROG}: error: {message}{hint}; see {self.prog} --help\n")


def _common(p: argparse.ArgumentParser, *, classes: bool = True) -> None:
    p.add_argument("--out", required=True, help="output directory; splits go in OUT/<split>/")
    p.add_argument("--name", default=None, help="dataset name in the manifest (default: source)")
    p.add_argument("--shard-samples", type=int, default=65_536, help="samples per shard file")
    p.add_argument("--chunk-samples", type=int, default=None,
                   help="samples per HDF5 chunk (default: about 1 MiB)")
    p.add_argument("--compression", choices=["none", "gzip", "lzf"], default="none",
                   help="HDF5 compression filter")
    if classes:
        p.add_argument("--num-classes", type=int, default=None,
                       help="number of classes (default: from the source or max label + 1)")
    p.add_argument("--force", action="store_true", help="replace an existing dataset at OUT")


def _holdout(p: argparse.ArgumentParser, *, seed: bool = True, split: bool = True) -> None:
    p.add_argument("--test-fraction", type=float, default=None,
                   help=f"fraction held out as OUT/test (default {TEST_FRACTION}; 0: none)")
    if seed:
        p.add_argument("--seed", type=int, default=0,
                       help="seed of the train/test split (default 0)")
    if split:
        p.add_argument("--split", default=None,
                       help="write every sample to OUT/SPLIT only, with no test split")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = _Parser(prog=PROG, description=__doc__,
                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="source", required=True)
    p = sub.add_parser("mnist1d", help="MNIST-1D generated locally by the mnist1d package")
    p.add_argument("--samples", type=int, default=5000, help="train + test samples (80/20)")
    p.add_argument("--seed", type=int, default=42, help="generator seed")
    _common(p)
    p = sub.add_parser("digits", help="scikit-learn's 8x8 digits (1797 samples)")
    _holdout(p, split=False)
    _common(p)
    p = sub.add_parser("npz", help="an .npz archive with sample and label arrays")
    p.add_argument("path", help=".npz file")
    p.add_argument("--x-key", default="x", help="array of samples")
    p.add_argument("--y-key", default="y", help="array of labels")
    _holdout(p)
    _common(p)
    p = sub.add_parser("npy", help="a pair of .npy files (samples, labels), memory-mapped")
    p.add_argument("x", help="samples .npy")
    p.add_argument("y", help="labels .npy")
    _holdout(p)
    _common(p)
    p = sub.add_parser("idx", help="MNIST IDX image and label files, plain or gzipped")
    p.add_argument("images", help="IDX images file")
    p.add_argument("labels", help="IDX labels file")
    _holdout(p)
    _common(p)
    p = sub.add_parser("cifar", help="CIFAR-10/100 python pickle batches")
    p.add_argument("batches", nargs="+", help="training batch files")
    p.add_argument("--test", nargs="*", default=[],
                   help="test batch files (without them, --test-fraction of the batches)")
    _holdout(p, split=False)
    _common(p)
    p = sub.add_parser("synthetic", help="seeded synthetic data of any shape and size")
    p.add_argument("--samples", type=int, default=10_000, help="number of samples")
    p.add_argument("--shape", type=int, nargs="+", default=[64], help="sample shape")
    p.add_argument("--classes", type=int, default=10, help="number of classes")
    p.add_argument("--seed", type=int, default=0, help="generator and train/test split seed")
    _holdout(p, seed=False)
    _common(p)
    convert_text.add_parser(sub, _common)
    return ap.parse_args(argv)


def check_options(args: argparse.Namespace) -> None:
    """Refuse option values no source can use, before anything is read.

    Raises:
        UsageError: the first bad value, named by its option.
    """
    def positive(option: str, value: int | None, what: str) -> None:
        if value is not None and value < 1:
            raise UsageError(f"{option} {value}: must be >= 1; pass the number of {what}")

    positive("--shard-samples", args.shard_samples, "samples per shard file")
    positive("--chunk-samples", args.chunk_samples, "samples per HDF5 chunk")
    positive("--num-classes", getattr(args, "num_classes", None), "classes")
    if args.source == "text":
        convert_text.check_options(args)
        return
    if args.source == "mnist1d" and args.samples < 10:
        raise UsageError(f"--samples {args.samples}: must be >= 10; pass train + test samples")
    if args.source == "synthetic":
        positive("--samples", args.samples, "samples")
        positive("--classes", args.classes, "classes")
        if min(args.shape) < 1:
            raise UsageError(f"--shape {' '.join(map(str, args.shape))}: every size must be "
                             ">= 1; pass the sample shape, e.g. --shape 3 32 32")
    if getattr(args, "seed", 0) < 0:
        raise UsageError(f"--seed {args.seed}: must be >= 0; pass a non-negative seed")
    f = getattr(args, "test_fraction", None)
    if f is not None and not (math.isfinite(f) and 0 <= f < 1):
        raise UsageError(f"--test-fraction {f}: must be finite and in [0, 1); pass e.g. 0.2, "
                         "or 0 for no test split")
    split = getattr(args, "split", None)
    if split is not None:
        if split in ("", ".", "..") or "/" in split or os.sep in split:
            raise UsageError(f"--split {split!r}: not a directory name; pass e.g. train or val")
        if f:
            raise UsageError(f"--split {split}: writes one split, so --test-fraction {f} cannot "
                             "hold out a test split; pass only one of them")
    if args.source == "cifar" and args.test and f is not None:
        raise UsageError(f"--test-fraction {f}: the --test files are the test split already; "
                         "pass only one of them")


def plan_splits(args: argparse.Namespace, num_samples: int) -> list[tuple[str, np.ndarray | None]]:
    """The splits to write and the sample indices of each (None: every sample, in order).

    ``--split NAME`` or ``--test-fraction 0`` give one split; otherwise train and test, with
    ``--test-fraction`` (default 0.2) of the samples held out by a ``--seed``-ed permutation.

    Raises:
        UsageError: the fraction leaves the train or the test split empty.
    """
    from hethpc.data import sources

    split = getattr(args, "split", None)
    f = TEST_FRACTION if args.test_fraction is None else args.test_fraction
    if split is not None or f == 0:
        return [(split or "train", None)]
    train, test = sources.holdout(num_samples, test_fraction=f, seed=args.seed)
    if not len(train) or not len(test):
        raise UsageError(f"--test-fraction {f}: of {num_samples} samples leaves {len(train)} to "
                         f"train and {len(test)} to test; pass a fraction that leaves both some, "
                         "or 0 for no test split")
    return [("train", train), ("test", test)]


def _counts(labels: np.ndarray, counts: np.ndarray) -> str:
    """``"7: 1 sample, 9: 2 samples"``."""
    pairs = zip(labels, counts, strict=True)
    return ", ".join(f"{v}: {n} sample{'s' if n != 1 else ''}" for v, n in pairs)


def check_labels(
    y: np.ndarray, what: str, num_classes: int | None, *, default: int | None = None,
    source: str = "",
) -> int:
    """The number of classes for the labels ``y`` that ``what`` names.

    ``num_classes`` is ``--num-classes`` (None: not given); ``default`` the count of the
    ``source`` (10 for MNIST, ...; None: the largest label + 1). Labels inferred that way leave
    no class silently empty: a warning names the empty classes and every label's count.

    Raises:
        UsageError: a label is negative (no class count covers it), or lies beyond the classes
            given or the source's; the message names the labels and their counts.
    """
    y = np.asarray(y).reshape(-1)
    if not len(y):
        return num_classes or default or 1
    if y.min() < 0:
        neg, n = np.unique(y[y < 0], return_counts=True)
        raise UsageError(
            f"{what}: negative labels ({_counts(neg, n)}); class labels count from 0, and no "
            "--num-classes covers a negative one: map the labels to 0, 1, 2, ... first"
        )
    top = int(y.max())
    limit = num_classes if num_classes is not None else default
    if limit is not None:
        if top >= limit:
            over, n = np.unique(y[y >= limit], return_counts=True)
            whose = (
                f"--num-classes {limit}" if num_classes is not None
                else f"the {limit} classes of {source}"
            )
            raise UsageError(
                f"{what}: labels beyond {whose} (0..{limit - 1}): {_counts(over, n)}; pass "
                f"--num-classes {top + 1} if they are classes, or drop those samples"
            )
        return limit
    counts = np.bincount(y.astype(np.int64), minlength=top + 1)
    empty = np.flatnonzero(counts == 0)
    if len(empty):
        present = np.flatnonzero(counts)
        shown = present if len(present) <= 12 else present[np.argsort(counts[present])[:6]]
        listed = _counts(shown, counts[shown]) + ("" if len(present) <= 12 else ", ...")
        names = ", ".join(map(str, empty[:12])) + (", ..." if len(empty) > 12 else "")
        print(f"{PROG}: warning: {what}: the largest label, {top}, makes {top + 1} classes, but "
              f"{len(empty)} of them have no samples (labels {names}); label counts: {listed}. "
              "If a label is stray, drop its samples; if the classes are right, pass "
              f"--num-classes {top + 1}", file=sys.stderr)
    return top + 1


def _array_splits(
    args: argparse.Namespace, x: np.ndarray, y: np.ndarray, num_classes: int | None
) -> list[Split]:
    from hethpc.data import sources

    return [(split, sources.pieces_of(x, y, index=index), num_classes)
            for split, index in plan_splits(args, len(y))]


def source_splits(args: argparse.Namespace) -> list[Split]:
    """Read (or generate) the source and plan its splits; nothing is written yet.

    Raises:
        SourceError: a source file is missing a part, malformed or truncated.
        UsageError: the options do not fit the source.
        OSError: a source file cannot be read.
    """
    from hethpc.data import load_mnist1d, sources

    nc = args.num_classes
    # mnist1d and synthetic labels are generated (the writer checks them against --num-classes).
    if args.source == "mnist1d":
        train, test = load_mnist1d(num_samples=args.samples, seed=args.seed)
        return [("train", sources.pieces_of(train.x, train.y), nc or 10),
                ("test", sources.pieces_of(test.x, test.y), nc or 10)]
    if args.source == "digits":
        from sklearn.datasets import load_digits

        d = load_digits()
        x, y = (d.data / 16.0).astype(np.float32), d.target.astype(np.int64)
        nc = check_labels(y, "digits", nc, default=10, source="the digits")
        return _array_splits(args, x, y, nc)
    if args.source in ("npz", "npy"):
        if args.source == "npz":
            x, y = sources.read_npz(args.path, x_key=args.x_key, y_key=args.y_key)
            what = f"{args.path}: array {args.y_key!r}"
        else:
            x, y = sources.read_npy_pair(args.x, args.y)
            what = f"{args.y}: the label array"
        # From every label, so that train and test agree on the number of classes.
        return _array_splits(args, x, y, check_labels(y, what, nc))
    if args.source == "idx":
        x, y = sources.read_idx_pair(args.images, args.labels)
        nc = check_labels(y, args.labels, nc, default=10, source="MNIST")
        return _array_splits(args, x, y, nc)
    if args.source == "cifar":
        x, y, classes = sources.read_cifar(args.batches)
        source = f"CIFAR-{classes}"
        classes = check_labels(y, "the training batches", nc, default=classes, source=source)
        if not args.test:
            return _array_splits(args, x, y, classes)
        xt, yt, _ = sources.read_cifar(args.test)
        check_labels(yt, "the --test batches", nc, default=classes, source=source)
        return [("train", sources.pieces_of(x, y), classes),
                ("test", sources.pieces_of(xt, yt), classes)]
    assert args.source == "synthetic", args.source  # argparse admits no other
    n, shape, nc = args.samples, tuple(args.shape), nc or args.classes
    # Generated only while written; a held-out sample is the one the full stream would hold.
    return [(split, sources.synthetic_pieces(n, shape, num_classes=args.classes, seed=args.seed,
                                             index=index), nc)
            for split, index in plan_splits(args, n)]


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
    out = f"{args.out}/{split}"
    if os.path.lexists(out) and not args.force:
        raise UsageError(f"{out} already exists; pass --force to replace it")
    if os.path.lexists(out) and not os.path.isfile(f"{out}/manifest.json"):
        raise UsageError(f"{out} exists and is not a hethpc dataset (no manifest.json); "
                         "refusing to replace it even with --force; pass another --out")
    if num_classes is None:
        # Labels beyond the first piece are checked by the writer against this count.
        num_classes = int(y0.max()) + 1
    w = DatasetWriter(
        out,
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


def _fail(message: str) -> int:
    print(f"{PROG}: error: {' '.join(message.splitlines())}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    global PROG
    PROG = command_name(argv, "convert.py")
    args = parse_args(argv)
    try:
        check_options(args)
    except (UsageError, convert_text.TextUsageError) as e:
        return _fail(str(e))
    # Imported after parsing, so that --help answers without loading torch.
    from hethpc.data import DatasetError

    try:
        if args.source == "text":
            return convert_text.run(args)
        # Every source is read before anything is written, so a bad test file leaves no train.
        for split, pieces, classes in source_splits(args):
            m = write_split(args, split, pieces, classes)
            print(f"{args.out}/{split}: {m.num_samples} samples of shape {m.sample_shape} "
                  f"({m.dtype}), {m.num_classes} classes, {len(m.shards)} shard(s)")
    except (DatasetError, UsageError, convert_text.TextUsageError) as e:
        return _fail(str(e))
    except OSError as e:
        what = f"{e.filename}: {e.strerror}" if e.filename is not None and e.strerror else str(e)
        return _fail(f"{what}; check that the path exists and that its permissions allow this")
    return 0


if __name__ == "__main__":
    sys.exit(main())
