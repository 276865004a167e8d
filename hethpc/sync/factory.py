"""Build a sync policy from its name: the one setting that selects the method."""

from __future__ import annotations

from typing import Any

from hethpc.sync.bsp import BSP
from hethpc.sync.fedavg import FedAvg
from hethpc.sync.local_only import LocalOnly
from hethpc.sync.policy import SyncPolicy
from hethpc.sync.selsync import SelSync
from hethpc.sync.ssp import SSP

POLICIES: dict[str, type[SyncPolicy]] = {
    "bsp": BSP,
    "selsync": SelSync,
    "fedavg": FedAvg,
    "local": LocalOnly,
    "ssp": SSP,
}


def make_policy(name: str, **kwargs: Any) -> SyncPolicy:
    """A policy by name: ``"bsp"``, ``"selsync"``, ``"fedavg"``, ``"local"`` or ``"ssp"``.

    Args:
        name: the policy (case-insensitive; ``"local_only"`` is accepted for ``"local"``).
        **kwargs: the policy's keyword settings, e.g. ``threshold=0.5`` or ``period=20``.

    Raises:
        ValueError: the name is unknown.
        TypeError: a setting does not belong to that policy.
    """
    key = name.lower().replace("-", "_")
    key = "local" if key == "local_only" else key
    if key not in POLICIES:
        raise ValueError(f"unknown sync policy {name!r}; choose one of {sorted(POLICIES)}")
    return POLICIES[key](**kwargs)
