"""Pipeline parallelism: cut an ``nn.Sequential`` into stages across ranks, with replicas.

What users call is exported here; balance, layout, profiling and the schedules' task lists and
clocks are imported from their modules, e.g. :mod:`hethpc.pipeline.schedule`."""

from __future__ import annotations

from hethpc.pipeline.build import build_pipeline
from hethpc.pipeline.errors import BalanceError, PipelineError, ScheduleError
from hethpc.pipeline.pipe import Pipeline
from hethpc.pipeline.schedule import SCHEDULES

__all__ = [
    "SCHEDULES",
    "BalanceError",
    "Pipeline",
    "PipelineError",
    "ScheduleError",
    "build_pipeline",
]
