"""Console scripts (``hethpc-train`` and the rest): each runs its script of the source tree.

The command-line programs live beside the package, in ``jobs/`` and ``data_tools/`` (the
library never reads ``sys.argv``); these entry points run exactly those files, so
``hethpc-train ...`` and ``python jobs/train.py ...`` are the same program. They need the
source tree, as ``scripts/setup.sh`` installs it (``pip install -e .``).
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]


def _run(relative: str) -> None:
    path = _ROOT / relative
    if not path.is_file():
        sys.exit(
            f"{Path(sys.argv[0]).name}: {path} is missing: the console scripts run the programs "
            "of hethpc's source tree; install hethpc from its repository with 'pip install -e .'"
        )
    command = Path(sys.argv[0]).name
    sys.argv[0] = str(path)
    sys.path.insert(0, str(path.parent))
    # COMMAND: the name the user typed, for the program's messages (hethpc-convert: error: ...).
    runpy.run_path(str(path), init_globals={"COMMAND": command}, run_name="__main__")


def train() -> None:
    """``hethpc-train``: ``jobs/train.py``."""
    _run("jobs/train.py")


def report() -> None:
    """``hethpc-report``: ``jobs/report.py``."""
    _run("jobs/report.py")


def convert() -> None:
    """``hethpc-convert``: ``data_tools/convert.py``."""
    _run("data_tools/convert.py")


def testbed() -> None:
    """``hethpc-testbed``: ``jobs/testbed.py``."""
    _run("jobs/testbed.py")


def inspect() -> None:
    """``hethpc-inspect``: ``data_tools/inspect_dataset.py``."""
    _run("data_tools/inspect_dataset.py")
