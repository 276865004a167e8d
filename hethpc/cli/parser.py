"""The parsers of hethpc's commands: no abbreviated flags, a suggestion for an unknown one."""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path
from typing import Any, NoReturn


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
    begins a few (a shortened one, ``--sync-w``) is offered them, another the closest spelling;
    a flag the command has, given in another sub-command's place, is told so.
    """
    if "unrecognized arguments" not in message:
        return ""
    flags = sorted(set(_flags(parser)))
    words = [w.split("=")[0] for w in message.split(":", 1)[1].split() if w.startswith("--")]
    close: list[str] = []
    misplaced = [w for w in words if w in flags]  # a flag of the command, given where it is not
    for w in words:
        if w in misplaced:
            continue
        longer = [f for f in flags if f.startswith(w) and len(w) > 2]
        if 0 < len(longer) <= 3:
            close.append(" or ".join(longer))
        else:
            close += difflib.get_close_matches(w, flags, n=1)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    if misplaced:
        hint += (f"; {', '.join(misplaced)} is not taken there: see {parser.prog} --help, and "
                 "each sub-command's --help, for where it goes")  # fmt: skip
    return hint


def _flags(parser: argparse.ArgumentParser) -> list[str]:
    out = []
    for action in parser._actions:
        out += [o for o in action.option_strings if o.startswith("--")]
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out += _flags(sub)
    return out


def command_name(argv: list[str] | None, default: str) -> str:
    """The name the user ran the program by, for its messages (``hethpc-convert: error: ...``)
    and the commands it prints (a resume line).

    ``hethpc-train`` and the other console scripts by their own name when the program reads its
    command line from ``sys.argv`` (``argv`` is None); else ``default``, the file as run from the
    repository's root (``jobs/train.py``), whatever path the launcher gave (an sbatch script
    runs it by its absolute path).
    """
    if argv is None and sys.argv and sys.argv[0] not in ("", "-c"):
        name = Path(sys.argv[0]).name
        if name.startswith("hethpc-"):
            return name
    return default
