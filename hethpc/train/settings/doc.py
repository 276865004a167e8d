"""The settings reference (``docs/settings.md``), rendered from :class:`TrainConfig`'s fields."""

from __future__ import annotations

import dataclasses
from typing import Any

from hethpc.train.settings.config import config_sections, config_tables

__all__ = ["settings_markdown"]

# What ``hethpc.fit`` takes as arguments rather than as these settings.
_FIT_ARGUMENTS = ("data", "samples", "data_seed", "model", "loss")

_HEAD = """\
# Settings

Every setting of a training run, one per row: a flag of `jobs/train.py` (`--batch-size 256`),
a key of its `--config` TOML file (`batch_size = 256`), and a keyword of `hethpc.fit`
(`batch_size=256`); later sources override earlier ones (defaults, then the file, then the
flags). In the file a key goes at the top, before any table, or under its group's table, named
in the group's heading (`[sync]` then `threshold = 0.5`); a key under another group's table is
refused, as it is most likely a mistake. Each setting is checked where it enters: a wrong
name, table, type, range or combination stops the job with one message naming it.

*local*: may differ between ranks (paths on node-local disks, display); every other setting
must be equal on every rank, and a difference is named before training. *resumable*: does not
change what is trained, so `--resume` accepts a new value; change any other with
`--resume-changes NAME,...`. In `hethpc.fit` the data and the model are arguments, so
{fit} are the command line's only.

Generated from `hethpc/train/settings/fields.py` by `make docs`; a test fails when it is stale."""


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _default(f: dataclasses.Field[Any]) -> str:
    return "(empty)" if f.default == "" else f"`{f.default!r}`".replace("'", "")


def _meaning(f: dataclasses.Field[Any]) -> str:
    text = f.metadata["help"]
    if f.metadata["choices"]:
        text += "; one of " + ", ".join(f"`{c}`" for c in f.metadata["choices"])
    tags = ["local"] if f.metadata["local"] else ["resumable"] if f.metadata["operational"] else []
    return _cell(text + "".join(f" *({t})*" for t in tags))


def settings_markdown() -> str:
    """``docs/settings.md``: a table per group of settings (flag and key, default, meaning)."""
    parts = [_HEAD.format(fit=", ".join(f"`{n}`" for n in _FIT_ARGUMENTS))]
    tables = config_tables()
    for section, fields in config_sections():
        table = tables[fields[0].name]
        parts.append(f"\n## {section[0].upper()}{section[1:]} (TOML table `[{table}]`)\n")
        parts.append("| flag / key | default | meaning |")
        parts.append("| --- | --- | --- |")
        for f in fields:
            flag = "--" + f.name.replace("_", "-")
            parts.append(f"| `{flag}` `{f.name}` | {_default(f)} | {_meaning(f)} |")
    return "\n".join(parts) + "\n"
