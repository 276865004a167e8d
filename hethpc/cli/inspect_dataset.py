"""Summarise, verify and plot an HDF5-sharded dataset, per shard and per rank of a partition.

    python data_tools/inspect_dataset.py data/mnist1d/train
    python data_tools/inspect_dataset.py data/mnist1d/train --verify
    python data_tools/inspect_dataset.py data/mnist1d/train --partition dirichlet \\
        --dirichlet-alpha 0.3 --world-size 4 --plot ranks.png
    python data_tools/inspect_dataset.py data/mnist1d/train --partition labels \\
        --labels-per-rank 5 --world-size 2
    python data_tools/inspect_dataset.py data/stdlib/train --partition site --world-size 4

``--partition``, ``--labels-per-rank`` and ``--dirichlet-alpha`` mean what they mean to
``jobs/train.py``, with the same defaults, so a partition can be looked at before training on
it. ``--partition labels`` refuses a split that leaves classes on no rank (it names them and
the ``--labels-per-rank`` that covers them all) unless ``--allow-uncovered`` is given.

A dataset with sites (``convert.py text``) is shown by site instead of by label: samples per
shard, and per site (with a column per rank under ``--partition``); ``--partition site`` gives
each rank whole sites and lists them, and ``--plot`` stacks the bars by site.

A dataset, partition or option at fault ends the run with one line,
``inspect_dataset.py: error: <what is wrong>; <the fix>``, and exit code 2.

(Named inspect_dataset.py, not inspect.py: a script called inspect.py would shadow Python's
own ``inspect`` module, which torch and dataclasses import.)
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np

from hethpc.cli.parser import ArgumentParser, command_name, flag_hint

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from hethpc.data import Manifest, ShardedDataset

# The name the user ran the program by (hethpc-inspect or inspect_dataset.py), set by main().
PROG = "inspect_dataset.py"
#: ``--partition`` choices: hethpc.data.PARTITIONERS' names, the job's ``partition`` setting
#: (written out, so that --help answers without importing torch; a test compares them).
PARTITIONS = ("iid", "seldp", "labels", "dirichlet", "site")
#: Flags of earlier versions, and what replaced them.
RENAMED = {"--partitioner": "--partition", "--alpha": "--dirichlet-alpha"}


class UsageError(ValueError):
    """An option value that cannot be used; the message starts with the option."""


class _Parser(ArgumentParser):
    """Reports a bad command line in the one-line form of every other error."""

    def error(self, message: str) -> NoReturn:
        hints = [f"{old} is now {new}" for old, new in RENAMED.items() if old in message.split()]
        hint = f" ({', '.join(hints)})" if hints else flag_hint(self, message)
        self.exit(2, f"{PROG}: error: {message}{hint}; see {PROG} --help\n")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = _Parser(
        prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("path", help="dataset directory (holds manifest.json)")
    ap.add_argument("--verify", action="store_true",
                    help="check every shard's sha256, size, shapes and labels against the manifest")
    ap.add_argument("--partition", default=None, choices=PARTITIONS,
                    help="also show the label histogram per rank of this partition "
                         "(as jobs/train.py --partition; site: whole sites per rank, for data "
                         "with sites)")
    ap.add_argument("--world-size", type=int, default=2, help="ranks of the partition (default 2)")
    ap.add_argument("--seed", type=int, default=0, help="partition seed (default 0)")
    ap.add_argument("--labels-per-rank", type=int, default=2,
                    help="labels each rank holds with --partition labels (default 2)")
    ap.add_argument("--allow-uncovered", action="store_true",
                    help="--partition labels: accept classes on no rank (the other partitions "
                         "always cover every class)")
    ap.add_argument("--dirichlet-alpha", type=float, default=0.5,
                    help="concentration with --partition dirichlet, small = skewed (default 0.5)")
    ap.add_argument("--min-size", type=int, default=10,
                    help="smallest share with --partition dirichlet (default 10)")
    ap.add_argument("--plot", default=None, metavar="PNG", help="write histograms to this PNG")
    ap.add_argument("--no-locking", action="store_true",
                    help="open files without HDF5 locking (shared filesystems)")
    return ap.parse_args(argv)


def check_options(args: argparse.Namespace) -> None:
    """Refuses option values no partition can use, naming the option.

    Raises:
        UsageError: an out-of-range ``--world-size``, ``--labels-per-rank``,
            ``--dirichlet-alpha`` or ``--min-size``; a ``--plot`` file in no directory or of a
            format matplotlib does not write.
    """
    if args.world_size < 1:
        raise UsageError(f"--world-size {args.world_size}: must be >= 1; pass the number of ranks")
    if args.labels_per_rank < 1:
        raise UsageError(f"--labels-per-rank {args.labels_per_rank}: must be >= 1")
    if not args.dirichlet_alpha > 0:
        raise UsageError(f"--dirichlet-alpha {args.dirichlet_alpha}: must be > 0")
    if args.min_size < 0:
        raise UsageError(f"--min-size {args.min_size}: must be >= 0")
    if args.plot is not None:
        parent = os.path.dirname(os.path.abspath(args.plot))
        if not os.path.isdir(parent):
            raise UsageError(f"--plot {args.plot}: no directory {parent}; create it first")
        suffix = os.path.splitext(args.plot)[1][1:].lower()
        from matplotlib.backend_bases import FigureCanvasBase

        formats = sorted(FigureCanvasBase.get_supported_filetypes())
        if suffix and suffix not in formats:
            raise UsageError(f"--plot {args.plot}: matplotlib cannot write .{suffix} files; "
                             f"end the name with .png (or one of {', '.join(formats)})")


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def describe_partition(args: argparse.Namespace) -> str:
    """The partition's settings as a phrase: ``labels, 2 ranks, seed 0, 5 labels per rank``."""
    text = f"{args.partition}, {_n(args.world_size, 'rank')}, seed {args.seed}"
    if args.partition == "labels":
        text += f", {_n(args.labels_per_rank, 'label')} per rank"
    elif args.partition == "dirichlet":
        text += f", alpha {args.dirichlet_alpha:g}, min size {args.min_size}"
    return text


def _row(name: str, counts: np.ndarray) -> str:
    return f"{name:>18} {int(counts.sum()):>9}  " + " ".join(f"{int(c):>6}" for c in counts)


def _partition(args: argparse.Namespace, ds: ShardedDataset) -> list[np.ndarray]:
    from hethpc.data import make_partitioner

    m = ds.manifest
    kw: dict[str, Any] = {}
    if args.partition == "labels":
        kw = {"labels_per_rank": args.labels_per_rank, "num_classes": m.num_classes,
              "allow_uncovered": args.allow_uncovered}
    elif args.partition == "dirichlet":
        kw = {"alpha": args.dirichlet_alpha, "min_size": args.min_size}
    elif args.partition == "site":
        kw = {"sites": None if m.sites is None else ds.sites, "names": m.sites}
    part = make_partitioner(args.partition, **kw)
    return part.all_indices(ds.labels, args.world_size, args.seed)


def figure(
    m: Manifest, per_rank: np.ndarray | None, title: str, *, unit: str = "label"
) -> Figure:
    """Stacked label (or site) histograms per shard (and per rank), one panel each, legend
    outside.

    Args:
        m: the dataset's manifest (shard histograms, classes, sites).
        per_rank: label counts per rank, shape ``[world_size, num_classes]``, or None; with
            ``unit="site"``, site counts, shape ``[world_size, len(m.sites)]``.
        title: the figure's title.
        unit: ``label``, or ``site`` to stack by the manifest's sites.
    """
    import matplotlib
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    by_site = unit == "site" and m.sites is not None
    c = len(m.sites) if by_site and m.sites is not None else m.num_classes
    names = m.sites if by_site and m.sites is not None else [str(v) for v in range(c)]
    cmap = matplotlib.colormaps["tab10" if c <= 10 else "tab20" if c <= 20 else "viridis"]
    colors = [cmap(i if c <= 20 else i / max(c - 1, 1)) for i in range(c)]
    shards = [s.site_counts or [] if by_site else s.label_counts for s in m.shards]
    panels = [("shard", np.array(shards).reshape(-1, c))]
    if per_rank is not None:
        panels.append(("rank", per_rank))
    fig = Figure(figsize=(5.5 * len(panels) + 1.5, 4.5), layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (where, counts) in zip(axes, panels, strict=True):
        bottom = np.zeros(len(counts))
        for label in range(c):
            ax.bar(range(len(counts)), counts[:, label], bottom=bottom, color=colors[label],
                   label=names[label])
            bottom += counts[:, label]
        # Zero-height bars on top of a stack would pin the axis to the tallest bar's top.
        ax.set_ylim(0, 1.05 * max(float(bottom.max(initial=0)), 1.0))
        ax.set_title(f"{unit.capitalize()} histogram per {where}")
        ax.set_xlabel(where)
        ax.set_ylabel("samples")
        if len(counts) <= 16:
            ax.set_xticks(range(len(counts)))
        else:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    if c <= 20:
        handles, shown = axes[0].get_legend_handles_labels()
        fig.legend(handles, shown, title=unit, loc="outside right upper", fontsize="small",
                   ncol=1 if c <= 10 else 2)
    else:  # a legend of that many labels would not fit
        fig.colorbar(ScalarMappable(Normalize(0, c - 1), cmap), ax=list(axes), label=unit)
    fig.suptitle(title)
    return fig


def plot(
    path: str, m: Manifest, per_rank: np.ndarray | None, title: str, *, unit: str = "label"
) -> None:
    """:func:`figure`, written to ``path`` (its suffix picks the format).

    Raises:
        UsageError: matplotlib cannot write that format.
    """
    try:
        figure(m, per_rank, title, unit=unit).savefig(path, dpi=100)
    except ValueError as e:  # an image format matplotlib does not write
        raise UsageError(f"--plot {path}: {e}") from e


def _fail(message: str) -> int:
    print(f"{PROG}: error: {' '.join(line.strip() for line in message.splitlines())}",
          file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    """Prints the summary (and writes the plot) that ``args`` ask for.

    Raises:
        DatasetError: the dataset is missing, malformed or (``--verify``) damaged.
        PartitionError: the partition cannot be made as asked.
        UsageError: see :func:`plot`.
    """
    from hethpc.data import open_dataset

    ds = open_dataset(args.path, verify=args.verify, locking=False if args.no_locking else None)
    m = ds.manifest
    parts = _partition(args, ds) if args.partition else None
    print(f"{ds.root}: {m.name} ({m.split}), {len(ds)} samples of shape {m.sample_shape} "
          f"{m.dtype}, {m.num_classes} classes, {_n(len(m.shards), 'shard')}, chunk "
          f"{m.chunk_samples} samples, compression {m.compression}")
    if args.verify:
        print("verify: OK (sha256, sizes, shapes, dtypes and label histograms match)")
    if m.sites is not None:
        return _run_sites(args, ds, parts)
    header = f"{'':>18} {'samples':>9}  " + " ".join(f"{c:>6}" for c in range(m.num_classes))
    print("\nlabel histogram per shard\n" + header)
    for s in m.shards:
        print(_row(s.file, np.asarray(s.label_counts)))
    title = f"{m.name} ({m.split}): {len(ds)} samples, {m.num_classes} classes"
    per_rank = None
    if parts is not None:
        per_rank = np.array([np.bincount(ds.labels[p], minlength=m.num_classes) for p in parts])
        print(f"\nlabel histogram per rank ({describe_partition(args)})\n" + header)
        for r, counts in enumerate(per_rank):
            print(_row(f"rank {r}", counts))
        title += f"\npartition {describe_partition(args)}"
        total = np.bincount(ds.labels, minlength=m.num_classes)
        missing = np.flatnonzero((total > 0) & (per_rank.sum(0) == 0)).tolist()
        covered = len(np.unique(np.concatenate(parts)))
        if covered < len(ds):
            print(f"note: {len(ds) - covered} samples are in no rank's share"
                  + (f" (classes {missing} are on no rank)" if missing else ""))
        if missing:
            named = f"classes {missing}" if len(missing) <= 12 else f"{len(missing)} classes"
            title += f"; {named} on no rank"
    if args.plot:
        # matplotlib writes a name without a suffix as PNG, adding ".png".
        path = args.plot if os.path.splitext(args.plot)[1] else args.plot + ".png"
        plot(path, m, per_rank, title)
        print(f"wrote {path}")
    return 0


def _run_sites(args: argparse.Namespace, ds: ShardedDataset, parts: list[np.ndarray] | None) -> int:
    """:func:`run`'s report of a dataset with sites: samples per shard, per site (and rank)."""
    m = ds.manifest
    names = m.sites or []
    total = np.bincount(ds.sites, minlength=len(names))
    held = np.flatnonzero(total)
    print(f"{len(held)} of the {_n(len(names), 'site')} hold samples of this split "
          f"(the manifest's sites name those of every split)")
    print(f"\nsamples per shard\n{'':>18} {'samples':>9}")
    for sh in m.shards:
        print(f"{sh.file:>18} {sh.num_samples:>9}")
    title = f"{m.name} ({m.split}): {len(ds)} samples, {_n(len(held), 'site')}"
    per_rank = None
    ranks = ""
    if parts is not None:
        per_rank = np.array([np.bincount(ds.sites[p], minlength=len(names)) for p in parts])
        ranks = " ".join(f"{f'rank {r}':>8}" for r in range(len(parts)))
        title += f"\npartition {describe_partition(args)}"
    width = max(18, *(len(names[i]) for i in held))
    print(f"\nsamples per site{f' and rank ({describe_partition(args)})' if ranks else ''}\n"
          f"{'':>{width}} {'samples':>9}  {ranks}")
    for i in held[np.argsort(-total[held], kind="stable")]:
        cols = "" if per_rank is None else " ".join(f"{int(c):>8}" for c in per_rank[:, i])
        print(f"{names[i]:>{width}} {int(total[i]):>9}  {cols}".rstrip())
    if per_rank is not None and parts is not None:
        print()
        for r, counts in enumerate(per_rank):
            mine = np.flatnonzero(counts)
            listed = ", ".join(names[i] for i in mine[:8]) + (", ..." if len(mine) > 8 else "")
            print(f"rank {r}: {int(counts.sum())} samples ({100 * counts.sum() / len(ds):.1f} %) "
                  f"of {_n(len(mine), 'site')}: {listed}")
    if args.plot:
        path = args.plot if os.path.splitext(args.plot)[1] else args.plot + ".png"
        plot(path, m, per_rank, title, unit="site")
        print(f"wrote {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    global PROG
    PROG = command_name(argv, "inspect_dataset.py")
    args = parse_args(argv)
    try:
        check_options(args)
    except UsageError as e:
        return _fail(str(e))
    # Imported after parsing, so that --help answers without loading torch.
    from hethpc.data import DatasetError, PartitionError

    try:
        return run(args)
    except (DatasetError, PartitionError, UsageError) as e:
        return _fail(str(e))
    except OSError as e:
        what = f"{e.filename}: {e.strerror}" if e.filename is not None and e.strerror else str(e)
        return _fail(f"{what}; check that the path exists and that its permissions allow this")


if __name__ == "__main__":
    sys.exit(main())
