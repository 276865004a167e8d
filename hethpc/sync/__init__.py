"""Synchronisation policies for data-parallel training: SelSync, BSP, FedAvg, local only, SSP,
and, for those that average parameters, an outer optimizer (DiLoCo) and drift correction.

The policies and their registry are exported here; the outer optimizer, drift correction,
significance tracking, averaging and compression are imported from their modules."""

from __future__ import annotations

from hethpc.sync.bsp import BSP
from hethpc.sync.errors import SyncError
from hethpc.sync.factory import POLICIES, make_policy
from hethpc.sync.fedavg import FedAvg
from hethpc.sync.local_only import LocalOnly
from hethpc.sync.policy import SyncPolicy
from hethpc.sync.selsync import SelSync
from hethpc.sync.ssp import SSP

__all__ = [
    "BSP",
    "POLICIES",
    "SSP",
    "FedAvg",
    "LocalOnly",
    "SelSync",
    "SyncError",
    "SyncPolicy",
    "make_policy",
]
