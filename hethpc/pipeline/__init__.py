"""Pipeline parallelism: cut an ``nn.Sequential`` into stages across ranks, with replicas.

What users call is exported here; the schedules' task lists and clocks are internals of
:mod:`hethpc.pipeline.schedule`."""

from __future__ import annotations

from hethpc.pipeline.balance import (
    balance_costs,
    partition_by_counts,
    partition_by_params,
    split_model,
    stage_costs,
)
from hethpc.pipeline.build import build_pipeline
from hethpc.pipeline.errors import BalanceError, PipelineError, ScheduleError
from hethpc.pipeline.groups import Layout, PipelineGroups, make_pipeline_groups, pipeline_layout
from hethpc.pipeline.memory import ActivationMeter
from hethpc.pipeline.pipe import Pipeline, default_device
from hethpc.pipeline.profile import LayerProfile, layer_times, partition_by_time, profile_layers
from hethpc.pipeline.runner import StepStats
from hethpc.pipeline.schedule import SCHEDULES, bubble_fraction, idle_fraction, make_schedule

__all__ = [
    "SCHEDULES",
    "ActivationMeter",
    "BalanceError",
    "LayerProfile",
    "Layout",
    "Pipeline",
    "PipelineError",
    "PipelineGroups",
    "ScheduleError",
    "StepStats",
    "balance_costs",
    "bubble_fraction",
    "build_pipeline",
    "default_device",
    "idle_fraction",
    "layer_times",
    "make_pipeline_groups",
    "make_schedule",
    "partition_by_counts",
    "partition_by_params",
    "partition_by_time",
    "pipeline_layout",
    "profile_layers",
    "split_model",
    "stage_costs",
]
