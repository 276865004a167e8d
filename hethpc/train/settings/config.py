"""The training configuration: the settings (:mod:`~hethpc.train.settings.fields`) checked by
their rules (:mod:`~hethpc.train.settings.rules`) when built, with their groups and digest.

Reading it from TOML is in :mod:`~hethpc.train.settings.sources`, the cross-rank and resume
comparisons in :mod:`~hethpc.train.settings.compare`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from hethpc.train.errors import ConfigError
from hethpc.train.settings.fields import Settings
from hethpc.train.settings.rules import validate

__all__ = ["ConfigError", "TrainConfig", "config_fields", "config_sections", "config_tables"]


@dataclass(frozen=True)
class TrainConfig(Settings):
    """Every setting of a training run (:class:`~hethpc.train.settings.fields.Settings`),
    checked at construction: a combination the rules refuse raises :class:`ConfigError`
    naming the settings and the fix. Each field is one ``--flag`` of ``jobs/train.py``.

    Defaults give a small, quick MNIST-1D run that works on one or more CPU ranks.
    """

    def __post_init__(self) -> None:
        validate(self)

    def to_dict(self) -> dict[str, Any]:
        """All settings as a plain dict (JSON- and TOML-friendly)."""
        return dataclasses.asdict(self)

    def shared(self) -> dict[str, Any]:
        """The settings every rank must agree on (all but the node-local ones)."""
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if not f.metadata["local"]
        }

    def digest(self) -> str:
        """sha256 of :meth:`shared` in canonical JSON: equal digests mean equal settings."""
        blob = json.dumps(self.shared(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()


# The first field of each group of settings, in declaration order, the group's TOML table and
# its title.
SECTIONS = (
    ("data", "data", "data"),
    ("model", "model", "model and optimisation"),
    ("sync", "sync", "synchronisation"),
    ("batching", "batching", "batching"),
    ("pipeline_stages", "pipeline", "pipeline"),
    ("eval_every", "output", "reliability and output"),
)


def config_fields() -> list[dataclasses.Field[Any]]:
    """The fields of :class:`TrainConfig`, in declaration order."""
    return list(dataclasses.fields(TrainConfig))


def config_sections() -> list[tuple[str, list[dataclasses.Field[Any]]]]:
    """The fields of :class:`TrainConfig` in their groups (data, model, ...), in order."""
    starts = {first: title for first, _, title in SECTIONS}
    out: list[tuple[str, list[dataclasses.Field[Any]]]] = []
    for f in config_fields():
        if f.name in starts:
            out.append((starts[f.name], []))
        out[-1][1].append(f)
    return out


def config_tables() -> dict[str, str]:
    """The TOML table of each setting (``{"threshold": "sync", ...}``): its group's."""
    starts = {first: table for first, table, _ in SECTIONS}
    out: dict[str, str] = {}
    table = ""
    for f in config_fields():
        table = starts.get(f.name, table)
        out[f.name] = table
    return out
