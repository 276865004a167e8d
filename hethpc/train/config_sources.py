"""Settings from where they are given (a mapping, a TOML file); errors name the source."""

from __future__ import annotations

import difflib
import re
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from hethpc.train.config import TrainConfig, config_fields
from hethpc.train.errors import ConfigError


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
    """Read settings from a TOML file: top-level ``key = value`` pairs named like the fields.

    Tables (``[sync]``) are allowed for grouping; their keys are read as if top-level.
    Dashes in keys are read as underscores (``batch-size`` = ``batch_size``).

    Raises:
        ConfigError: the file cannot be parsed, or a key is not a setting.
    """
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"cannot read config file {path}: {e}") from e
    flat: dict[str, Any] = {}
    where: dict[str, str] = {}
    for key, value in raw.items():
        items = value.items() if isinstance(value, dict) else [(key, value)]
        for k, v in items:
            name = k.replace("-", "_")
            place = f"[{key}] {k}" if isinstance(value, dict) else k
            if name in flat:
                raise ConfigError(
                    f"{path}: {name} is set twice ({where[name]} and {place}); keep one"
                )
            flat[name], where[name] = v, place
    known = {f.name for f in config_fields()}
    unknown = sorted(set(flat) - known)
    if unknown:
        raise ConfigError(
            f"{path}: unknown setting(s) {unknown}{did_you_mean(unknown, known)}; see "
            "'jobs/train.py --help' for the names"
        )
    return flat


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
