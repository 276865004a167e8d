"""Every command in the README and the docs runs as written (shrunk by flags where it trains).

The shell blocks of ``README.md``, ``docs/*.md``, ``slurm/README.md`` and ``CONTRIBUTING.md``
are read in order; each command line runs from a scratch directory that links the checkout's
programs (``.venv``, ``scripts``, ``jobs``, ...), so what a command writes (``data/``,
``runs/``) lands there, and the commands of one file see what its earlier ones made. Training runs
get ``--samples 2000 --epochs 1`` appended (the last flag wins). A command that cannot run here
is listed in ``ELSEWHERE`` with where it is tested instead; every other command is run, so the
docs cannot gain an untested one.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from hethpc.testbed.kernel import missing

ROOT = Path(__file__).resolve().parents[1]
TESTBED_LACKS = missing()  # the testbed's commands need root on Linux
FILES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")),
         "slurm/README.md", "CONTRIBUTING.md"]  # fmt: skip
PROGRAMS = (".venv", "scripts", "jobs", "data_tools", "tests", "slurm", "examples", "hethpc",
            "benchmarks", "setup.cfg", "Makefile")  # fmt: skip
SHRINK = ["--samples", "2000", "--epochs", "1"]
# Commands that do not run here, by their start, and where they are exercised instead.
ELSEWHERE = {
    "make": "the Makefile's targets: CI runs make test, and the demo is run by hand before a stop",
    "sbatch": "tests/test_slurm.py submits every script to a real two-node SLURM cluster",
    "srun": "tests/test_slurm.py (srun --mpi=pmix inside the scripts)",
    "ompi_info": "a diagnostic of the site's MPI, printed as is",
    "scripts/mpirun.sh -np 2 .venv/bin/python -m mpi4py -m pytest tests/mpi": "make test-mpi",
    ".venv/bin/hethpc-convert idx": "needs the user's IDX files; tests/test_data_convert.py",
    ".venv/bin/python benchmarks/bench_evidence.py --only": "a scenario of the protocol takes "
    "about 30 minutes; tests/test_bench_evidence.py runs the protocol in miniature (--quick)",
    ".venv/bin/python benchmarks/bench_evidence.py --quick": "tests/test_bench_evidence.py "
    "runs these commands as written (--quick and --quick-peers) and checks what they print",
    "scripts/mpirun.sh -np 2 .venv/bin/python jobs/train.py --data data/stdlib": "scores the "
    "whole standard library's val/ and test/ (19 k windows), past this test's time limit; "
    "tests/test_examples.py trains the same way on two of its packages (examples/text)",
    "scripts/device_check.sh": "a GPU check; tests/test_device_check.py runs it with --cpu --small",
    "scripts/device_prep.sh": "downloads about 13 MB from the package registries for a GPU "
    "machine without them; tests/test_device_check.py checks what the check picks from them",
    "scripts/mpirun.sh -np 2 .venv/bin/python jobs/train.py --device cuda": "needs a GPU; "
    "scripts/device_check.sh runs jobs/train.py --device cuda there (on CPU: --device cpu)",
}


def commands(path: str) -> list[str]:
    """The command lines of the shell blocks of ``path`` (continuations joined, comments cut)."""
    blocks, lang, lines = [], None, []
    for raw in (ROOT / path).read_text().splitlines():
        if raw.startswith("```"):
            if lang is None:  # an opening fence and its language
                lang, lines = raw[3:].strip(), []
            else:
                if lang in ("bash", "sh", ""):
                    blocks.append("\n".join(lines))
                lang = None
        elif lang is not None:
            lines.append(raw)
    out = []
    for block in blocks:
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line and not line.startswith("#"):
                out.append(line)
    return [c for c in out if c.split()[0].startswith(("make", "scripts/", ".venv/", "sbatch",
                                                         "srun", "ompi_info"))]  # fmt: skip


def elsewhere(cmd: str) -> str | None:
    return next((why for start, why in ELSEWHERE.items() if cmd.startswith(start)), None)


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    """A directory of one doc file's commands, with the checkout's programs linked in."""
    d = tmp_path
    for name in PROGRAMS:
        if (ROOT / name).exists():
            (d / name).symlink_to(ROOT / name)
    return d


@pytest.mark.skipif("OMPI_COMM_WORLD_SIZE" in os.environ, reason="launches mpirun itself")
@pytest.mark.parametrize("path", FILES)
def test_every_command_runs_as_written(path: str, scratch: Path) -> None:
    ran = []
    for cmd in commands(path):
        if elsewhere(cmd):
            continue
        if cmd.startswith(".venv/bin/hethpc-testbed") and TESTBED_LACKS:
            continue  # tests/test_testbed.py says what this host lacks
        argv = shlex.split(cmd)
        if any(a.endswith("jobs/train.py") for a in argv):
            argv += SHRINK
        proc = subprocess.run(
            argv, cwd=scratch, capture_output=True, text=True, timeout=300,
            env={**os.environ, "OMP_NUM_THREADS": "1", "HETHPC_MPIRUN_TIMEOUT": "280"},
        )  # fmt: skip
        assert proc.returncode == 0, f"{path}: {cmd}\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
        ran.append(cmd)
    if not ran:
        assert all(elsewhere(c) for c in commands(path))


def test_the_commands_not_run_here_are_still_in_the_docs() -> None:
    """Every ELSEWHERE entry still matches a command (no stale exemptions)."""
    every = [c for f in FILES for c in commands(f)]
    for start in ELSEWHERE:
        assert any(c.startswith(start) for c in every), f"no command starts with {start!r}"
