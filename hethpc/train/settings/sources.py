"""Settings from where they are given (a mapping, a TOML file); errors name the source."""

from __future__ import annotations

import difflib
import re
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from hethpc.train.errors import ConfigError
from hethpc.train.settings.config import TrainConfig, config_fields, config_tables


def did_you_mean(unknown: Iterable[str], known: Iterable[str]) -> str:
    """``" (did you mean 'batch_size'?)"`` for the close matches of ``unknown``, or ``""``."""
    names = sorted(known)
    close = [m for u in unknown for m in difflib.get_close_matches(u, names, n=1)]
    return f" (did you mean {', '.join(repr(m) for m in close)}?)" if close else ""


def make_config(
    values: Mapping[str, Any],
    sources: Mapping[str, str] | None = None,
    *,
    also: Iterable[str] = (),
) -> TrainConfig:
    """A :class:`TrainConfig` from ``values``; an error names where the faulty value came from.

    Args:
        values: settings by field name.
        sources: where each value was set, e.g. ``{"lr": "--lr", "epochs": "run.toml line 3"}``.
        also: other names the caller takes (``fit``'s own keywords), suggested for a typo.

    Raises:
        ConfigError: an unknown or invalid setting, with its source appended.
    """
    known = {f.name for f in config_fields()}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(
            f"unknown setting(s) {unknown}{did_you_mean(unknown, known | set(also))}; the "
            "settings are TrainConfig's fields (jobs/train.py --help, with - for _)"
        )
    try:
        return TrainConfig(**values)
    except ConfigError as e:
        where = (sources or {}).get(e.key or "")
        if where:
            raise ConfigError(f"{e} (set by {where})", key=e.key) from None
        raise


def load_toml(path: str | Path) -> dict[str, Any]:
    """Read settings from a TOML file: ``key = value`` pairs named like the fields.

    A key is either at the top, before any table, or under its group's table (``[data]``,
    ``[model]``, ``[sync]``, ``[batching]``, ``[pipeline]``, ``[output]``: see
    :func:`~hethpc.train.settings.config.config_tables`); a key under another table is refused,
    as it is most likely a mistake. Dashes in keys are read as underscores (``batch-size`` =
    ``batch_size``).

    Raises:
        ConfigError: the file cannot be parsed, a key is not a setting, a table is not a
            group's, or a key is under another group's table; the message names the file, the
            key and its line.
    """
    path = Path(path)
    try:
        text = path.read_text()
        raw = tomllib.loads(text)
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"cannot read config file {path}: {e}") from e
    lines = _key_lines(text)
    tables = config_tables()
    names = list(dict.fromkeys(tables.values()))
    flat: dict[str, Any] = {}
    where: dict[str, str] = {}
    unknown: list[tuple[str, str]] = []  # (name, where and what it may be), to name them all
    for key, value in raw.items():
        table = key if isinstance(value, dict) else ""
        if table and table not in names:
            close = difflib.get_close_matches(table, names, n=1)
            hint = f" (did you mean [{close[0]}]?)" if close else ""
            raise ConfigError(
                f"{path}{_at(lines.get((table, '')))}: unknown table [{table}]{hint}; the tables "
                f"are {', '.join(f'[{t}]' for t in names)}, one per group of settings "
                "(docs/settings.md); or put the keys at the top, before any table"
            )
        for k, v in value.items() if table else [(key, value)]:
            name = k.replace("-", "_")
            place = f"[{table}] {k}" if table else k
            line = lines.get((table, k))
            if name in flat:
                raise ConfigError(
                    f"{path}: {name} is set twice ({where[name]} and {place}); keep one"
                )
            if name not in tables:
                hints = [f"line {line}"] if line else []
                close = difflib.get_close_matches(name, list(tables), n=1)
                hints += [f"did you mean {m!r}?" for m in close]
                unknown.append((name, f"{place} ({'; '.join(hints)})" if hints else place))
            elif table and tables[name] != table:
                raise ConfigError(
                    f"{path}{_at(line)}: {k} is under [{table}], but belongs to "
                    f"[{tables[name]}]; move it there, or to the top before any table"
                )
            flat[name], where[name] = v, place
    if unknown:
        raise ConfigError(
            f"{path}: unknown setting(s) {sorted(n for n, _ in unknown)}: "
            f"{', '.join(w for _, w in unknown)}; see 'jobs/train.py --help' (with _ for -) or "
            "docs/settings.md for the names"
        )
    return flat


def _at(line: int | None) -> str:
    return f" line {line}" if line else ""


_TABLE = re.compile(r"""^\s*\[\s*["']?([A-Za-z0-9_.-]+)["']?\s*\]""")


_TOML_KEY = re.compile(r"""^\s*["']?([A-Za-z0-9_-]+)["']?\s*=""")


def toml_sources(path: str | Path) -> dict[str, str]:
    """Where each key of a TOML file is set, as ``{"lr": "run.toml line 3"}`` (for messages)."""
    out: dict[str, str] = {}
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return out
    for number, line in enumerate(lines, start=1):
        m = _TOML_KEY.match(line)
        if m:
            out.setdefault(m.group(1).replace("-", "_"), f"{path} line {number}")
    return out


def _key_lines(text: str) -> dict[tuple[str, str], int]:
    """The line of each key, ``{(table, key): line}``, and of each table, ``{(table, ""): line}``.

    ``table`` is ``""`` at the top; for messages only (a key TOML spells otherwise is not found).
    """
    out: dict[tuple[str, str], int] = {}
    table = ""
    for number, line in enumerate(text.splitlines(), start=1):
        t = _TABLE.match(line)
        if t:
            table = t.group(1)
            out.setdefault((table, ""), number)
            continue
        m = _TOML_KEY.match(line)
        if m:
            out.setdefault((table, m.group(1)), number)
    return out
