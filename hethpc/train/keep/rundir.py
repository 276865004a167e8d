"""The run directory: hethpc writes only into directories it made, marked as its own."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from hethpc.train.errors import RunDirError

MARKER = ".hethpc-run"
# What hethpc writes into a run directory; --overwrite removes these and nothing else.
OWN_FILES = ("config.json", "summary.json")
# Its subdirectories and the names it writes there: a user's file in them stays.
OWN_DIRS: dict[str, tuple[str, ...]] = {
    "metrics": ("rank*.jsonl",),
    "checkpoints": ("ckpt-*.pt", "ckpt-*.pt.sha256", "ckpt-*.corrupt", ".ckpt-*.tmp"),
    "heartbeat": ("rank*.json", ".rank*.json.tmp", "stacks-rank*.txt"),
    "csv": ("metrics.csv",),
    "tensorboard": ("events.out.tfevents.*",),
}


def is_run_dir(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` holds hethpc's marker (it was made by a hethpc run)."""
    return (Path(path) / MARKER).is_file()


def holds_run(path: Path) -> bool:
    """Whether a hethpc run directory holds any output of an earlier run."""
    return any((path / n).exists() for n in OWN_FILES) or any(
        (path / d).is_dir() and any((path / d).iterdir()) for d in OWN_DIRS
    )


def next_run_dir(root: str | os.PathLike[str] = "runs", *, name: str = "run") -> Path:
    """The first ``root/<name>-<N>`` (N = 1, 2, ...) that does not exist yet."""
    root = Path(root)
    n = 1
    while (root / f"{name}-{n}").exists():
        n += 1
    return root / f"{name}-{n}"


def clear_run(path: Path) -> None:
    """Remove an earlier run's output from a hethpc run directory; other files stay.

    In hethpc's own subdirectories only the files it names so are removed (a user's notes
    there stay), and a subdirectory left empty goes too.
    """
    for n in OWN_FILES:
        (path / n).unlink(missing_ok=True)
    for d, patterns in OWN_DIRS.items():
        sub = path / d
        if not sub.is_dir():
            continue
        for pattern in patterns:
            for f in sub.glob(pattern):
                if f.is_file() or f.is_symlink():
                    f.unlink()
        if not any(sub.iterdir()):
            sub.rmdir()


def claim(path: str | os.PathLike[str], *, digest: str, resume: bool, overwrite: bool) -> Path:
    """Make ``path`` this run's directory, or refuse; the marker is written first.

    - missing or empty: created and marked;
    - not empty and unmarked (the user's own files): always refused, nothing is touched;
    - marked and holding an earlier run: ``resume`` continues it, ``overwrite`` removes
      hethpc's own files from it (never another file), otherwise refused.

    Args:
        path: the run directory.
        digest: the config digest, recorded in the marker.
        resume: this run continues the one in ``path``.
        overwrite: this fresh run may replace the one in ``path``.

    Raises:
        RunDirError: naming the directory and what to do instead.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise RunDirError(f"--run-dir {path} is a file, not a directory; choose another path")
    if path.is_dir() and any(path.iterdir()) and not is_run_dir(path):
        raise RunDirError(
            f"--run-dir {path} is not empty and was not made by hethpc (it has no {MARKER} "
            "file); hethpc never writes into such a directory. Choose a new or empty directory"
        )
    replace = is_run_dir(path) and holds_run(path) and not resume
    if replace and not overwrite:
        raise RunDirError(
            f"--run-dir {path} already holds a run; pass --resume (fit: resume=True) to "
            "continue it or --overwrite (fit: overwrite=True) to replace it (files hethpc "
            "did not write are kept)"
        )
    marker = {"hethpc_run": 1, "config_digest": digest, "created": time.time()}
    try:
        if replace:
            clear_run(path)
        path.mkdir(parents=True, exist_ok=True)
        if resume and is_run_dir(path):
            marker = {**json.loads((path / MARKER).read_text() or "{}"), "resumed": time.time()}
        (path / MARKER).write_text(json.dumps(marker) + "\n")
    except OSError as e:
        raise RunDirError(
            f"--run-dir {path}: cannot write into it ({e.strerror or e}: "
            f"{e.filename or path}); choose a directory this user can write, or fix its "
            "permissions"
        ) from None
    return path
