"""Train a model across MPI ranks with hethpc: data, batching, sync and checkpoints in one job.

    scripts/mpirun.sh -np 2 .venv/bin/python jobs/train.py --epochs 5
    scripts/mpirun.sh -np 2 .venv/bin/python jobs/train.py --config run.toml --sync selsync

Settings come from the defaults, then the TOML file given with --config (keys named like the
flags, with underscores, at the top or under their group's table: [sync] for threshold), then
the flags. Every rank checks that all ranks run the same settings before training. Rank 0 shows
progress and prints a summary table; per-rank metrics go to <run-dir>/metrics/rank<k>.jsonl;
plot them with jobs/report.py <run-dir>. Every setting, grouped as below, with its default and
which may differ between ranks: docs/settings.md.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys
import time
import warnings
from pathlib import Path
from typing import Any, NoReturn, TextIO

import torch

import hethpc
from hethpc import comm
from hethpc.cli.parser import ArgumentParser, command_name, flag_hint
from hethpc.train import (
    ConfigError,
    Fault,
    TrainConfig,
    TrainingInterrupted,
    config_fields,
    config_sections,
    config_tables,
    format_summary,
    load_toml,
    make_config,
    this_device,
    toml_sources,
    train,
)

PROG = "jobs/train.py"
# Environment variables that hold this process's rank under the common launchers; read before
# MPI starts, so that a mistake in the flags is reported once, by rank 0.
_RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID")


class UsageError(Exception):
    """A flag the parser cannot read (an unknown flag, a value of the wrong type)."""


class _Parser(ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def launch_rank() -> tuple[int, int]:
    """``(rank, size)``: from MPI once it runs, otherwise from the launcher's environment."""
    if comm.is_initialized():
        return comm.rank(), comm.size()
    for var in _RANK_VARS:
        if var in os.environ:
            size = os.environ.get("OMPI_COMM_WORLD_SIZE") or os.environ.get("SLURM_NTASKS") or "2"
            return int(os.environ[var]), int(size)
    return 0, 1


def is_user_error(exc: BaseException) -> bool:
    """Whether ``exc`` reports the user's mistake (hethpc's own error classes), not a bug."""
    return type(exc).__module__.startswith("hethpc.") and isinstance(
        exc, (ValueError, RuntimeError, FloatingPointError)
    ) or isinstance(exc, UsageError)


def fail(message: str, *, code: int = 2, grace_s: float = 5.0) -> NoReturn:
    """Report a user's mistake once and end every rank with ``code``, without a traceback.

    Rank 0 prints and exits; the launcher then ends the other ranks. Another rank waits
    ``grace_s`` first, so that a mistake every rank found (a bad flag) is printed once, and
    one found by this rank alone (a file missing on its node) still ends the job, named.
    """
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the launcher ending this rank ends it
    rank, size = launch_rank()
    if size > 1 and rank != 0:
        time.sleep(grace_s)
        message = f"[rank {rank}] {message}"
    print(message, file=sys.stderr, flush=True)
    sys.stdout.flush()
    if size > 1:
        os._exit(code)  # without MPI_Finalize: a peer may be waiting in a collective
    raise SystemExit(code)


_BOOL_WORDS = ("1", "true", "yes", "on", "0", "false", "no", "off")


def _bool(text: str) -> bool:
    if text.lower() in _BOOL_WORDS[:4]:
        return True
    if text.lower() in _BOOL_WORDS[4:]:
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def build_parser() -> argparse.ArgumentParser:
    """The command line: one flag per :class:`TrainConfig` field, plus the job's own."""
    p = _Parser(
        prog=PROG,
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
    tables = config_tables()
    for section, fields in config_sections():
        group = p.add_argument_group(f"{section} (TOML table [{tables[fields[0].name]}])")
        for f in fields:
            # An empty default is "none", or a choice the help describes: "(default: '')" is noise.
            shown = f" (default: {f.default!r})" if f.default != "" else ""
            text = f"{f.metadata['help']}{shown}".replace("%", "%%")
            kw: dict[str, Any] = {"dest": f.name, "help": text}
            if f.metadata["choices"]:
                kw["choices"] = f.metadata["choices"]
            if f.type in ("bool", bool):
                kw.update(type=_bool, nargs="?", const=True, metavar="BOOL")
            else:
                kw["type"] = {"int": int, "float": float, "str": str}[str(f.type)]
            group.add_argument("--" + f.name.replace("_", "-"), **kw)
    return p


def parse_config(argv: list[str] | None) -> tuple[TrainConfig, argparse.Namespace]:
    """Defaults, then the TOML file, then the flags.

    Raises:
        UsageError: a flag cannot be parsed.
        ConfigError: a setting is invalid; the message says where it was set.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    if args.config:
        values.update(load_toml(args.config))
        sources.update(toml_sources(args.config))
    for f in config_fields():
        v = getattr(args, f.name)
        if v is not None:
            values[f.name] = v
            sources[f.name] = "--" + f.name.replace("_", "-")
    if not values.get("cache_dir"):
        values["cache_dir"] = os.environ.get("HETHPC_CACHE", os.path.expanduser("~/.cache/hethpc"))
    return make_config(values, sources), args


_PACKAGE = str(Path(hethpc.__file__).resolve().parent)
_show_python_warning = warnings.showwarning


def _show_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: TextIO | None = None,
    line: str | None = None,
) -> None:
    """hethpc's own warnings (a damaged checkpoint skipped, ...) as one plain line on stderr;
    other libraries' as Python shows them (file, line and source)."""
    if str(Path(filename).resolve()).startswith(_PACKAGE):
        print(f"{PROG}: warning: {message}", file=file or sys.stderr, flush=True)
    else:
        _show_python_warning(message, category, filename, lineno, file, line)


def resume_command(argv: list[str], run_dir: Path | str) -> str:
    """The command line that continues a stopped run: ``argv`` without its ``--run-dir``,
    ``--resume`` and ``--overwrite`` (which would replace the run), then ``--run-dir run_dir
    --resume``; quoted for a shell."""
    kept: list[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        i += 1
        if a == "--run-dir":
            i += 1  # and its value
        elif a == "--resume":
            if i < len(argv) and argv[i].lower() in _BOOL_WORDS:
                i += 1  # --resume false
        elif a != "--overwrite" and not a.startswith(("--run-dir=", "--resume=")):
            kept.append(a)
    return shlex.join([PROG, *kept, "--run-dir", str(run_dir), "--resume"])


def stopped_message(e: TrainingInterrupted, argv: list[str]) -> str:
    """Rank 0's word on a run stopped by a signal: how far it got, what it kept, how to go on."""
    kept = (
        f"checkpoint kept: {e.checkpoint}"
        if e.checkpoint is not None
        else "no checkpoint kept (--checkpoint-every N keeps one every N steps), so --resume "
        "starts afresh"
    )
    return (
        f"{PROG}: stopped by {e.signal} after step {e.step} of {e.total}; {kept}; to continue: "
        f"{resume_command(argv, e.run_dir)}"
    )


def _interrupt(signum: int, _frame: object) -> None:
    """SIGTERM (a scheduler's cancel, the launcher passing on Ctrl-C) as Ctrl-C is: an
    interrupt the training loop reports; once: a second SIGTERM ends the process."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    raise KeyboardInterrupt(signal.Signals(signum).name)


def stop(message: str | None, code: int) -> NoReturn:
    """End this rank after a signal: rank 0 says ``message``; no collective, no MPI_Finalize
    (a peer may be stopped, or waiting in a collective this rank will never join)."""
    rank, size = launch_rank()
    if message and rank == 0:
        print(f"\n{message}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    if size > 1:
        os._exit(code)
    raise SystemExit(code)


def main(argv: list[str] | None = None) -> int:
    """The job; a user's mistake ends it with one message and exit code 2 (a bug: traceback).

    Ctrl-C or SIGTERM ends it with exit code 130 or 143 and, from rank 0, one line: the step
    reached, the checkpoint kept and the command that resumes the run.
    """
    global PROG
    PROG = command_name(argv, "jobs/train.py")
    comm.abort_on_exception()
    warnings.showwarning = _show_warning
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        return run(argv)
    except TrainingInterrupted as e:
        code = 128 + (signal.SIGTERM if e.signal == "SIGTERM" else signal.SIGINT)
        stop(stopped_message(e, sys.argv[1:] if argv is None else argv), code)
    except KeyboardInterrupt as e:  # before the first step: nothing to resume
        name = str(e) or "SIGINT"
        code = 128 + (signal.SIGTERM if name == "SIGTERM" else signal.SIGINT)
        stop(f"{PROG}: stopped by {name} before training started", code)
    except UsageError as e:
        hint = flag_hint(build_parser(), str(e))
        fail(f"{PROG}: error: {e}{hint} (see '{PROG} --help' for every setting)")
    except Exception as e:
        if not is_user_error(e):
            raise
        fail(f"{PROG}: error: {e}")


def run(argv: list[str] | None) -> int:
    """Parse, check and train; see :func:`main`."""
    cfg, args = parse_config(argv)
    comm.init(transport=cfg.transport)
    size = comm.size()
    outside = sorted({f.rank for f in args.fault if not 0 <= f.rank < size})
    if outside:
        raise ConfigError(
            f"--fault names rank(s) {outside}, but the job has ranks 0-{size - 1}"
        )
    this_device(cfg.device, comm.local_rank())  # --device cuda without a GPU: stop before starting
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    result = train(cfg, faults=tuple(args.fault), overwrite=args.overwrite)
    if comm.rank() == 0:
        print()
        print(format_summary([result.summary], names=[result.run_dir.name]))
        saved = f"   checkpoint: {result.checkpoint}" if result.checkpoint else ""
        print(f"\nmetrics: {result.run_dir}/metrics/{saved}")
        print(f"plots:   .venv/bin/python jobs/report.py {result.run_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
