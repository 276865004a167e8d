"""``hethpc-convert text``: text files as byte windows, split by file, each window with its site.

    hethpc-convert text --out data/stdlib
    hethpc-convert text src/ docs/ --suffix .py .md --context 256 --stride 128 --out data/mine

With no DIR, the running interpreter's standard library (``sysconfig``'s ``stdlib`` path)
is read. Every file under the DIRs whose name ends in a ``--suffix`` (default ``.py``) is read
as bytes; folders named ``site-packages`` or ``__pycache__`` and hidden ones are never entered,
folders of tests (``test``, ``tests``, ``idle_test``) only with ``--tests``. A file whose first
8 KiB hold a NUL byte is skipped as binary and a file that cannot be read is skipped as
unreadable; the summary counts both and names the first. A missing DIR is refused.

A sample is a window of ``--context`` + 1 bytes of one file (uint8, ``sample_shape``
``(context + 1,)``), one every ``--stride`` bytes (default: ``--context``, so that each byte is
a target once): the model reads the first ``context`` bytes and predicts the last
``context``. The label ``y`` is the window's last byte (256 classes: the vocabulary). Each
window's *site* (the first folder of its file's path under DIR, e.g. ``email`` or
``asyncio``; for a file directly in DIR its own name, e.g. ``argparse``) is stored as the
shards' ``site`` column, the names in the manifest's ``sites``, so that ``--partition site``
can give each rank whole sites. Files, not windows, are held out: ``--val-fraction`` and
``--test-fraction`` of the windows (default 0.1 each), whole files taken in a ``--seed``-ed
order, go to ``OUT/val`` and ``OUT/test``; no window of theirs is in ``OUT/train``. Every split
lists its sites (the same list in each) and its files (``meta.files``).
"""

from __future__ import annotations

import argparse
import sys
import sysconfig
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

SPLITS = ("train", "val", "test")
HELD_OUT = 0.1


class TextUsageError(ValueError):
    """An option of ``text`` that cannot be used; the message starts with the option."""


def add_parser(
    sub: argparse._SubParsersAction[Any],
    common: Callable[..., None],
) -> None:
    """The ``text`` sub-command's options on ``sub`` (argparse sub-parsers); ``common(p)`` adds
    the options every source shares."""
    p = sub.add_parser("text", help="text files (default: the standard library's .py files) as "
                                    "byte windows with their sites, split by file",
                       description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dirs", nargs="*", metavar="DIR",
                   help="directories to read (default: this Python's standard library)")
    p.add_argument("--suffix", nargs="+", default=[".py"],
                   help="file name endings to read (default .py; DIRs go before it)")
    p.add_argument("--tests", action="store_true",
                   help="also read folders of tests (test, tests, idle_test)")
    p.add_argument("--context", type=int, default=128,
                   help="bytes a model reads; a window is context + 1 bytes (default 128)")
    p.add_argument("--stride", type=int, default=None,
                   help="bytes between window starts (default: --context)")
    p.add_argument("--val-fraction", type=float, default=HELD_OUT,
                   help=f"share of the windows held out as OUT/val, by file (default {HELD_OUT})")
    p.add_argument("--test-fraction", type=float, default=HELD_OUT,
                   help=f"share of the windows held out as OUT/test, by file (default {HELD_OUT})")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the choice of held-out files (default 0)")
    common(p, classes=False)


def check_options(args: argparse.Namespace) -> None:
    """Refuse ``text`` option values before anything is read.

    Raises:
        TextUsageError: the first bad value, named by its option.
    """
    if args.context < 1:
        raise TextUsageError(f"--context {args.context}: must be >= 1; pass the bytes a model "
                             "reads, e.g. 128")
    if args.stride is not None and args.stride < 1:
        raise TextUsageError(f"--stride {args.stride}: must be >= 1; pass the bytes between "
                             "window starts, e.g. the --context")
    for flag, f in (("--val-fraction", args.val_fraction), ("--test-fraction", args.test_fraction)):
        if not 0 <= f < 1:
            raise TextUsageError(f"{flag} {f}: must be in [0, 1); pass e.g. 0.1, or 0 for none")
    if args.val_fraction + args.test_fraction >= 1:
        raise TextUsageError(f"--val-fraction {args.val_fraction} and --test-fraction "
                             f"{args.test_fraction} leave nothing to train on; their sum must "
                             "be below 1")
    if args.seed < 0:
        raise TextUsageError(f"--seed {args.seed}: must be >= 0; pass a non-negative seed")
    if any(not s for s in args.suffix):
        raise TextUsageError("--suffix '': an empty ending matches every file; pass e.g. .py")


def _files(names: list[str], limit: int = 3) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names)} in all)" if len(names) > limit else "")


def run(args: argparse.Namespace) -> int:
    """Read, split and write; prints one line per split and a summary.

    Raises:
        SourceError: a DIR is missing, or no file was read.
        TextUsageError: the held-out fractions leave a split empty.
        DatasetError: OUT cannot be written (see :class:`~hethpc.data.DatasetWriter`).
    """
    from hethpc.data import DatasetWriter, sources
    from hethpc.data.sources.text import VOCAB, num_windows

    t0 = time.perf_counter()
    roots = args.dirs or [sysconfig.get_paths()["stdlib"]]
    stride = args.stride or args.context
    corpus = sources.read_corpus(roots, suffixes=tuple(args.suffix), tests=args.tests)
    counts = np.array([num_windows(len(t), context=args.context, stride=stride)
                       for t in corpus.texts], dtype=np.int64)
    fractions = (args.val_fraction, args.test_fraction)
    split_of = sources.holdout_files(counts, fractions=fractions, seed=args.seed)
    plan = [(name, np.flatnonzero(split_of == j)) for j, name in enumerate(SPLITS)
            if j == 0 or fractions[j - 1] > 0]
    for name, files in plan:
        if not counts[files].sum():
            raise TextUsageError(
                f"--context {args.context}: the {name} split gets no window ({int(counts.sum())} "
                f"windows in {len(corpus.files)} files in all); pass more files, a shorter "
                "--context, or smaller --val-fraction/--test-fraction"
            )
    for name, _ in plan:  # before anything is written, so that no split is left half done
        out = Path(args.out) / name
        if out.exists() and not args.force:
            raise TextUsageError(f"{out} already exists; pass --force to replace it")
        if out.exists() and not (out / "manifest.json").is_file():
            raise TextUsageError(f"{out} exists and is not a hethpc dataset (no manifest.json); "
                                 "refusing to replace it even with --force; pass another --out")
    meta = {"source": "text", "argv": sys.argv[1:], "roots": [str(r) for r in roots],
            "task": "next-byte", "context": args.context, "stride": stride, "vocab": VOCAB,
            "seed": args.seed, "val_fraction": args.val_fraction,
            "test_fraction": args.test_fraction}
    for name, files in plan:
        w = DatasetWriter(
            f"{args.out}/{name}", sample_shape=(args.context + 1,), num_classes=VOCAB,
            dtype="uint8", label_dtype="uint8", name=args.name or "text", split=name,
            shard_samples=args.shard_samples, chunk_samples=args.chunk_samples,
            compression=None if args.compression == "none" else args.compression,
            force=args.force, sites=corpus.sites,
            meta={**meta, "files": [corpus.files[i] for i in files.tolist()]},
        )
        with w:
            for x, y, site in sources.text_pieces(corpus, files, context=args.context,
                                                  stride=stride):
                w.write(x, y, site)
        m = w.manifest
        assert m is not None
        held = sorted({corpus.sites[corpus.site_of[i]] for i in files.tolist() if counts[i]})
        print(f"{args.out}/{name}: {m.num_samples} windows of {args.context + 1} bytes from "
              f"{int((counts[files] > 0).sum())} files of {len(held)} sites, "
              f"{len(m.shards)} shard(s)")
    skipped = []
    if corpus.binary:
        skipped.append(f"{len(corpus.binary)} binary-looking ({_files(corpus.binary)})")
    if corpus.unreadable:
        skipped.append(f"{len(corpus.unreadable)} unreadable ({_files(corpus.unreadable)})")
    short = int((counts == 0).sum())
    print(f"read {len(corpus.files)} files ({corpus.num_bytes / 1e6:.1f} MB) under "
          f"{', '.join(map(str, roots))}: {len(corpus.sites)} sites; {short} file(s) shorter "
          f"than a window; skipped {', '.join(skipped) or 'none'}; "
          f"{time.perf_counter() - t0:.1f} s")
    return 0
