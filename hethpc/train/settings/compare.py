"""Settings compared: across the ranks of a job, and against a checkpoint's."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from hethpc import comm
from hethpc.comm import Group
from hethpc.train.errors import ConfigError
from hethpc.train.settings.config import TrainConfig, config_fields


def resume_differences(saved: Mapping[str, Any], config: TrainConfig) -> list[str]:
    """The settings that change the result and differ from a checkpoint's, as ``name: a -> b``.

    Operational settings (paths, checkpoint cadence, watchdog, display) and those named in
    ``config.resume_changes`` may differ. A setting the checkpoint does not know (added
    since) counts as different only when it is not at its default.
    """
    allowed = set(config.resume_change_set())
    out = []
    for f in config_fields():
        if f.metadata["operational"] or f.name in allowed:
            continue
        now = getattr(config, f.name)
        before = saved.get(f.name, f.default)
        if json.dumps(before) != json.dumps(now):
            out.append(f"{f.name}: {before!r} -> {now!r}")
    return out


def check_same_config(config: TrainConfig, group: Group | None = None) -> None:
    """Refuse to train unless every rank has the same settings (compared by digest first).

    Raises:
        ConfigError: on every rank, naming each differing setting and the ranks' values.
    """
    digests = comm.allgather_object(config.digest(), group)
    if len(set(digests)) == 1:
        return
    shared = comm.allgather_object(config.shared(), group)
    diffs = []
    for name in shared[0]:
        values = [s[name] for s in shared]
        if len({json.dumps(v) for v in values}) > 1:
            per_rank = ", ".join(f"rank {r}: {v!r}" for r, v in enumerate(values))
            diffs.append(f"{name} ({per_rank})")
    raise ConfigError(
        "the ranks run different configurations; differing settings: "
        + "; ".join(diffs)
        + ". Launch every rank with the same flags and config file."
    )
