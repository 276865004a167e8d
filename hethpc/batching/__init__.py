"""Dynamic batching: per-rank batch sizes proportional to throughput, global batch fixed.

What users call is exported here; the allocation, decision, estimate and slowdown mechanics are
imported from their modules, e.g. :func:`hethpc.batching.allocation.allocate`.
"""

from __future__ import annotations

from hethpc.batching.allocation import AllocationError
from hethpc.batching.controller import BatchController, BatchingError
from hethpc.batching.gradients import weighted_gradient_allreduce
from hethpc.batching.settings import ControlSettings

__all__ = [
    "AllocationError",
    "BatchController",
    "BatchingError",
    "ControlSettings",
    "weighted_gradient_allreduce",
]
