"""Dynamic batching: per-rank batch sizes proportional to throughput, global batch fixed."""

from __future__ import annotations

from hethpc.batching.allocation import (
    AllocationError,
    allocate,
    default_min_batch,
    exceeds_deadband,
    max_relative_change,
    uniform_sizes,
)
from hethpc.batching.busy import CpuShare
from hethpc.batching.controller import MODES, BatchController, BatchingError
from hethpc.batching.decision import Adjustment, decide
from hethpc.batching.estimate import Estimate, TimeEstimator
from hethpc.batching.gradients import WeightError, weighted_gradient_allreduce
from hethpc.batching.settings import ControlSettings
from hethpc.batching.slowdown import (
    STRETCH_MODES,
    Slowdown,
    SlowdownError,
    SlowdownSchedule,
    stretch,
)

__all__ = [
    "CpuShare",
    "MODES",
    "STRETCH_MODES",
    "Adjustment",
    "AllocationError",
    "BatchController",
    "BatchingError",
    "ControlSettings",
    "Estimate",
    "PhaseFigures",
    "SimRank",
    "SimResult",
    "Slowdown",
    "SlowdownError",
    "SlowdownSchedule",
    "TimeEstimator",
    "WeightError",
    "allocate",
    "default_min_batch",
    "decide",
    "exceeds_deadband",
    "ideal_sizes",
    "max_relative_change",
    "simulate",
    "stretch",
    "uniform_sizes",
    "weighted_gradient_allreduce",
]
