"""Synchronisation policies for data-parallel training: SelSync, BSP, FedAvg, local only, SSP,
and, for those that average parameters, an outer optimizer (DiLoCo) and drift correction."""

from __future__ import annotations

from hethpc.sync.agreement import agree
from hethpc.sync.averaging import average_gradients_, average_model_
from hethpc.sync.bsp import BSP
from hethpc.sync.drift import DriftCorrection
from hethpc.sync.errors import SyncError
from hethpc.sync.factory import POLICIES, make_policy, policy_class
from hethpc.sync.fedavg import FedAvg
from hethpc.sync.local_only import LocalOnly
from hethpc.sync.outer import OuterOptimizer, outer_update
from hethpc.sync.policy import SyncPolicy
from hethpc.sync.records import SyncRecord, SyncSummary
from hethpc.sync.selsync import SelSync
from hethpc.sync.significance import Significance, SignificanceTracker, gradient_norm
from hethpc.sync.ssp import SSP
from hethpc.sync.traits import Traits

__all__ = [
    "BSP",
    "DriftCorrection",
    "POLICIES",
    "FedAvg",
    "LocalOnly",
    "OuterOptimizer",
    "SSP",
    "SelSync",
    "Significance",
    "SignificanceTracker",
    "SyncError",
    "SyncPolicy",
    "SyncRecord",
    "SyncSummary",
    "Traits",
    "agree",
    "average_gradients_",
    "average_model_",
    "gradient_norm",
    "make_policy",
    "outer_update",
    "policy_class",
]
