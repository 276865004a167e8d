"""Console scripts (``hethpc-train`` and the rest): each runs its script of the source tree.

The command-line programs live beside the package, in ``jobs/`` and ``data_tools/`` (the
library never reads ``sys.argv``); these entry points run exactly those files, so
``hethpc-train ...`` and ``python jobs/train.py ...`` are the same program. They need the
source tree, as ``scripts/setup.sh`` installs it (``pip install -e .``). Their parsers share
:class:`ArgumentParser`: no abbreviated flags, and a suggestion for an unknown one.
"""

from __future__ import annotations

import argparse
import difflib
import runpy
import sys
from pathlib import Path
from typing import Any, NoReturn

_ROOT = Path(__file__).resolve().parents[1]


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser without abbreviations, suggesting the flag meant for an unknown one.

    ``--epoch 2`` is refused as unknown (``did you mean --epochs?``) instead of read as
    ``--epochs 2``: a typo is named, and a flag added later cannot change what a shortened one
    meant. Sub-command parsers are of the same class.
    """

    def __init__(self, **kw: Any) -> None:
        super().__init__(allow_abbrev=False, **kw)

    def error(self, message: str) -> NoReturn:
        super().error(message + flag_hint(self, message))


def flag_hint(parser: argparse.ArgumentParser, message: str) -> str:
    """``"; did you mean --epochs?"`` for the unknown flags of an argparse message, or ``""``.

    The candidates are the flags of ``parser`` and of its sub-commands. An unknown flag that
    begins a few (a shortened one, ``--sync-w``) is offered them, another the closest spelling.
    """
    if "unrecognized arguments" not in message:
        return ""
    flags = sorted(set(_flags(parser)))
    words = [w.split("=")[0] for w in message.split(":", 1)[1].split() if w.startswith("--")]
    close: list[str] = []
    for w in words:
        longer = [f for f in flags if f.startswith(w) and len(w) > 2]
        if 0 < len(longer) <= 3:
            close.append(" or ".join(longer))
        else:
            close += difflib.get_close_matches(w, flags, n=1)
    return f"; did you mean {', '.join(close)}?" if close else ""


def _flags(parser: argparse.ArgumentParser) -> list[str]:
    out = []
    for action in parser._actions:
        out += [o for o in action.option_strings if o.startswith("--")]
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out += _flags(sub)
    return out


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
