"""Build a sync policy from its name: the one setting that selects the method."""

from __future__ import annotations

from typing import Any

from hethpc.sync.bsp import BSP
from hethpc.sync.fedavg import FedAvg
from hethpc.sync.local_only import LocalOnly
from hethpc.sync.policy import SyncPolicy
from hethpc.sync.selsync import SelSync
from hethpc.sync.ssp import SSP

# The registry of policies by name: the choices of the ``sync`` setting, in this order.
POLICIES: dict[str, type[SyncPolicy]] = {
    policy.name: policy for policy in (BSP, SelSync, FedAvg, LocalOnly, SSP)
}


def policy_class(name: str) -> type[SyncPolicy]:
    """The policy class of a name: ``"bsp"``, ``"selsync"``, ``"fedavg"``, ``"local"`` or ``"ssp"``.

    Args:
        name: the policy (case-insensitive; ``"local_only"`` is accepted for ``"local"``).

    Raises:
        ValueError: the name is unknown.
    """
    key = name.lower().replace("-", "_")
    key = "local" if key == "local_only" else key
    if key not in POLICIES:
        raise ValueError(f"unknown sync policy {name!r}; choose one of {sorted(POLICIES)}")
    return POLICIES[key]


def make_policy(name: str, **kwargs: Any) -> SyncPolicy:
    """A policy by name (see :func:`policy_class`).

    Args:
        name: the policy (case-insensitive; ``"local_only"`` is accepted for ``"local"``).
        **kwargs: the policy's keyword settings, e.g. ``threshold=0.5`` or ``period=20``.

    Raises:
        ValueError: the name is unknown.
        TypeError: a setting does not belong to that policy.
    """
    return policy_class(name)(**kwargs)
