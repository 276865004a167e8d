"""Build a pipeline over the world: its groups, its balance (given, by parameters or by time)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from hethpc.pipeline.balance import partition_by_params
from hethpc.pipeline.errors import PipelineError
from hethpc.pipeline.groups import PipelineGroups, make_pipeline_groups
from hethpc.pipeline.pipe import Pipeline, default_device
from hethpc.pipeline.profile import MemoryBudget, SpeedCosts, measure_speeds
from hethpc.pipeline.schedule import (
    V_SCHEDULES,
    chunk_in_flight,
    chunks_per_stage,
    make_schedule,
    v_chunks,
)
from hethpc.pipeline.stage import LossFn


def build_pipeline(
    model: nn.Sequential,
    *,
    stages: int,
    micro_batches: int,
    schedule: str = "1f1b",
    balance: Sequence[int] | str | None = None,
    sample: tuple[torch.Tensor, torch.Tensor] | None = None,
    loss_fn: LossFn | None = None,
    checkpoint: bool = False,
    device: torch.device | str | None = None,
    progress_interval: float | str | None = "auto",
    split_backward: bool = True,
    groups: PipelineGroups | None = None,
    average_replicas: bool = True,
    memory: MemoryBudget | None = None,
) -> Pipeline:
    """Cut ``model`` into ``stages`` across the world (world = stages x replicas).

    Every world rank calls it with the same arguments. Replicas average their gradients, unless
    ``average_replicas`` is False (the caller then synchronises them: the training job's sync
    policy does).

    Args:
        model: the whole model, built identically (same seed) on every rank.
        stages: P; must divide the world size.
        micro_batches: m.
        schedule: "1f1b", "gpipe", "zb" or "zbv" (its ``2 * stages`` chunks are what "params"
            and "time" balance, and what a given balance lists).
        balance: layers per stage; or "params" (default, also None): balanced by parameter
            count; or "time": balanced by each layer's measured time on one micro-batch of
            ``sample`` on the rank that will run it (:func:`~hethpc.pipeline.profile.
            partition_by_speed`: every rank measures, the profiles are gathered, so every rank
            cuts alike and a slower rank gets fewer layers; the loss and the input gradients
            that stages after the first compute are counted).
        sample: with ``balance="time"``: a batch ``(x [N, ...], y [N, ...])`` like the
            training batches; its first ``N // micro_batches`` rows are timed.
        loss_fn: with ``balance="time"``: the training loss, timed on the last stage's output
            (None: not counted).
        checkpoint: recompute activations in the backward pass.
        device: default ``cuda:<local rank>`` when present, else CPU.
        progress_interval: see :class:`Pipeline` (None: no progress thread).
        split_backward: see :class:`Pipeline`.
        groups: the pipeline and replica groups, made by the caller with
            :func:`~hethpc.pipeline.groups.make_pipeline_groups` (default: made here).
        average_replicas: the replicas average their gradients in :meth:`Pipeline.train_step`.
        memory: with ``balance="time"``: keep each chunk within its ranks' memory, e.g.
            ``memory_budget(memory_left(device), stages=..., schedule=..., micro_batches=...,
            state_copies=4)`` for Adam (:func:`memory_budget`,
            :func:`hethpc.batching.memory_cap.memory_left`); None: memory not counted.

    Raises:
        PipelineError: ``stages`` does not divide the world size, bad settings,
            ``balance="time"`` without a ``sample``, or ``memory`` with another balance.
        BalanceError: the model cannot be cut that way (or not within ``memory``).
    """
    if groups is None:
        groups = make_pipeline_groups(stages)
    if isinstance(balance, str) or balance is None:
        balance = choose_balance(
            model, stages=stages, schedule=schedule, balance=balance, micro_batches=micro_batches,
            sample=sample, loss_fn=loss_fn, device=device, memory=memory,
        )  # fmt: skip
    return Pipeline(
        model,
        balance=balance,
        micro_batches=micro_batches,
        schedule=schedule,
        stage_group=groups.stage_group,
        dp_group=groups.dp_group if average_replicas else None,
        checkpoint=checkpoint,
        device=device,
        progress_interval=progress_interval,
        split_backward=split_backward,
    )


def choose_balance(
    model: nn.Sequential,
    *,
    stages: int,
    schedule: str,
    balance: str | None,
    micro_batches: int = 1,
    sample: tuple[torch.Tensor, torch.Tensor] | None = None,
    loss_fn: LossFn | None = None,
    device: torch.device | str | None = None,
    memory: MemoryBudget | None = None,
) -> tuple[int, ...]:
    """The layers per chunk (in chunk order) that ``balance`` gives: "params" (also None) or
    "time" (see :func:`build_pipeline`, whose arguments these are), with "time" each chunk
    within its ranks' ``memory`` (:func:`memory_budget`; None: memory not counted).

    Raises:
        PipelineError: an unknown ``balance``, "time" without a ``sample``, or ``memory``
            with "params".
        BalanceError: the model cannot be cut into that many chunks, or not within memory.
    """
    parts = stages * chunks_per_stage(schedule)
    if memory is not None and balance != "time":
        raise PipelineError("a cut within the ranks' memory measures the layers: use "
                            'balance="time"')  # fmt: skip
    if balance is None or balance == "params":
        return tuple(partition_by_params(model, parts))
    if balance == "time":
        return speed_costs(
            model, stages=stages, schedule=schedule, micro_batches=micro_batches, sample=sample,
            loss_fn=loss_fn, device=device, memory=memory,
        ).balance()  # fmt: skip
    raise PipelineError(f"balance must be 'params', 'time' or layers per stage, got {balance!r}")


def speed_costs(
    model: nn.Sequential,
    *,
    stages: int,
    schedule: str,
    micro_batches: int = 1,
    sample: tuple[torch.Tensor, torch.Tensor] | None = None,
    loss_fn: LossFn | None = None,
    device: torch.device | str | None = None,
    memory: MemoryBudget | None = None,
) -> SpeedCosts:
    """Each layer's measured cost on each chunk's ranks, on one micro-batch of ``sample`` (a
    collective over the world: :func:`~hethpc.pipeline.profile.measure_speeds`), and with
    ``memory`` its bytes there and each chunk's limit; what ``balance="time"`` cuts by, and
    what a resumed run weighs its saved cut with.

    Raises:
        PipelineError: no ``sample``.
    """
    if sample is None:
        raise PipelineError('balance="time" times the layers on a sample batch; pass sample=(x, y)')
    dev = torch.device(device) if device is not None else default_device()
    rows = max(1, sample[0].shape[0] // micro_batches)
    parts = stages * chunks_per_stage(schedule)
    placement = v_chunks(stages) if schedule in V_SCHEDULES else list(range(stages))
    assert len(placement) == parts
    return measure_speeds(
        model, placement, sample[0][:rows].to(dev), target=sample[1][:rows].to(dev),
        loss_fn=loss_fn, memory=memory,
    )  # fmt: skip


def memory_budget(
    left: int | None, *, stages: int, schedule: str, micro_batches: int, state_copies: float
) -> MemoryBudget:
    """The :class:`~hethpc.pipeline.profile.MemoryBudget` of this rank under ``schedule``:
    ``left`` bytes (None: not known), each chunk holding the activations of as many
    micro-batches as the schedule keeps in flight on it, and ``state_copies`` bytes per byte
    of trainable parameter (parameter, gradient, optimizer state)."""
    table = make_schedule(schedule, stages, micro_batches)
    chunks = stages * chunks_per_stage(schedule)
    return MemoryBudget(left, tuple(chunk_in_flight(table, c) for c in range(chunks)),
                        state_copies)  # fmt: skip
