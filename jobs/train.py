"""Train a model across MPI ranks with hethpc: data, batching, sync and checkpoints in one job.

    scripts/mpirun.sh -np 2 .venv/bin/python jobs/train.py --epochs 5
    scripts/mpirun.sh -np 2 .venv/bin/python jobs/train.py --config run.toml --sync selsync

Settings come from the defaults, then the TOML file given with --config (keys named like the
flags, with underscores), then the flags. Every rank checks that all ranks run the same
settings before training. Rank 0 shows progress and prints a summary table; per-rank metrics
go to <run-dir>/metrics/rank<k>.jsonl; plot them with jobs/report.py <run-dir>.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import torch

from hethpc import comm
from hethpc.train import Fault, TrainConfig, config_fields, format_summary, load_toml, train


def _bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def build_parser() -> argparse.ArgumentParser:
    """The command line: one flag per :class:`TrainConfig` field, plus the job's own."""
    p = argparse.ArgumentParser(
        prog="jobs/train.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", metavar="FILE.toml", help="read settings from this TOML file first")
    p.add_argument("--overwrite", action="store_true", help="replace a previous run in --run-dir")
    p.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="RANK:STEP:KIND",
        type=Fault.parse,
        help="testing only: make RANK kill itself/stall/raise/produce NaN (KIND) at STEP",
    )
    groups: dict[str, Any] = {}
    for f in config_fields():
        flag = "--" + f.name.replace("_", "-")
        text = f"{f.metadata['help']} (default: {f.default!r})".replace("%", "%%")
        kw: dict[str, Any] = {"dest": f.name, "help": text}
        if f.metadata["choices"]:
            kw["choices"] = f.metadata["choices"]
        if f.type in ("bool", bool):
            kw.update(type=_bool, nargs="?", const=True, metavar="BOOL")
        else:
            kw["type"] = {"int": int, "float": float, "str": str}[str(f.type)]
        section = f.metadata.get("section", "training settings")
        groups.setdefault(section, p.add_argument_group(section)).add_argument(flag, **kw)
    return p


def parse_config(argv: list[str] | None) -> tuple[TrainConfig, argparse.Namespace]:
    """Defaults, then the TOML file, then the flags."""
    parser = build_parser()
    args = parser.parse_args(argv)
    values: dict[str, Any] = {}
    if args.config:
        values.update(load_toml(args.config))
    for f in config_fields():
        v = getattr(args, f.name)
        if v is not None:
            values[f.name] = v
    if not values.get("cache_dir"):
        values["cache_dir"] = os.environ.get("HETHPC_CACHE", os.path.expanduser("~/.cache/hethpc"))
    return TrainConfig(**values), args


def main(argv: list[str] | None = None) -> int:
    comm.abort_on_exception()
    cfg, args = parse_config(argv)
    comm.init()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    result = train(cfg, faults=tuple(args.fault), overwrite=args.overwrite)
    if comm.rank() == 0:
        print()
        print(
            format_summary(
                [result.summary], names=[os.path.basename(os.path.normpath(cfg.run_dir))]
            )
        )
        print(f"\nmetrics: {cfg.run_dir}/metrics/   checkpoint: {result.checkpoint}")
        print(f"plots:   .venv/bin/python jobs/report.py {cfg.run_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
