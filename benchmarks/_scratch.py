"""Run directories for the benchmarks' training jobs, in one temporary folder removed at the end."""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from _launch import SCRATCH_ENV

from hethpc import comm


@contextlib.contextmanager
def scratch(prefix: str) -> Iterator[Callable[[str], str]]:
    """A factory of fresh run directory paths (not created) under one temporary folder.

    Rank 0 makes the folder (under ``HETHPC_SCRATCH`` where the launching process set it: it
    removes that after the launch, whatever ended it) and broadcasts its path; on leaving,
    every rank meets at a barrier and rank 0 removes the folder with every run in it (runs
    write checkpoints: about 5 MB each). On an exception the folder is removed without the
    barrier: the job is ending.
    """
    parent = os.environ.get(SCRATCH_ENV) or None
    made = tempfile.mkdtemp(prefix=prefix, dir=parent) if comm.rank() == 0 else ""
    root = Path(comm.broadcast_object(made))
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
