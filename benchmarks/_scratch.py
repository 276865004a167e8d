"""Run directories for the benchmarks' training jobs, in one temporary folder removed at the end."""

from __future__ import annotations

import contextlib
import itertools
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from hethpc import comm


@contextlib.contextmanager
def scratch(prefix: str) -> Iterator[Callable[[str], str]]:
    """A factory of fresh run directory paths (not created) under one temporary folder.

    Rank 0 makes the folder and broadcasts its path; on leaving, every rank meets at a barrier
    and rank 0 removes the folder with every run in it (runs write checkpoints: about 5 MB
    each). On an exception the folder is removed without the barrier: the job is ending.
    """
    root = Path(comm.broadcast_object(tempfile.mkdtemp(prefix=prefix) if comm.rank() == 0 else ""))
    count = itertools.count()
    ok = False
    try:
        yield lambda name: str(root / f"{next(count)}-{name}")
        ok = True
    finally:
        if ok:
            comm.barrier()
        if comm.rank() == 0:
            shutil.rmtree(root, ignore_errors=True)
