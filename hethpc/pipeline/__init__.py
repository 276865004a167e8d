"""Pipeline parallelism: cut an ``nn.Sequential`` into stages across ranks, with replicas."""

from __future__ import annotations

from hethpc.pipeline.errors import PartitionError, PipelineError, ScheduleError
from hethpc.pipeline.groups import Layout, PipelineGroups, make_pipeline_groups, pipeline_layout
from hethpc.pipeline.memory import ActivationMeter
from hethpc.pipeline.partition import (
    balance_costs,
    layer_times,
    partition_by_counts,
    partition_by_params,
    partition_by_time,
    split_model,
)
from hethpc.pipeline.pipe import Pipeline, StepStats, build_pipeline, default_device
from hethpc.pipeline.schedule import (
    SCHEDULES,
    Task,
    bubble_fraction,
    clock,
    gpipe_order,
    gpipe_schedule,
    idle_fraction,
    make_schedule,
    makespan,
    one_f_one_b_order,
    one_f_one_b_schedule,
    peak_in_flight,
    stage_tasks,
)

__all__ = [
    "SCHEDULES",
    "ActivationMeter",
    "Layout",
    "PartitionError",
    "Pipeline",
    "PipelineError",
    "PipelineGroups",
    "ScheduleError",
    "StepStats",
    "Task",
    "balance_costs",
    "bubble_fraction",
    "build_pipeline",
    "clock",
    "default_device",
    "gpipe_order",
    "gpipe_schedule",
    "idle_fraction",
    "layer_times",
    "make_pipeline_groups",
    "make_schedule",
    "makespan",
    "one_f_one_b_order",
    "one_f_one_b_schedule",
    "partition_by_counts",
    "partition_by_params",
    "partition_by_time",
    "peak_in_flight",
    "pipeline_layout",
    "split_model",
    "stage_tasks",
]
