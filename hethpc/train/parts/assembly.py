"""Assembling a run's parts: the step engine, the loader, batching, sync and the optimizer."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from hethpc import comm
from hethpc.batching import BatchController
from hethpc.comm import ReduceOp
from hethpc.data import ArrayDataset, Injector, Loader, ShardedDataset
from hethpc.data.balance import Rebalancer
from hethpc.sync import SyncPolicy
from hethpc.train.keep.state import Components
from hethpc.train.parts.capabilities import (
    first_rows,
    make_caps,
    make_controller,
    make_injector,
    make_loader,
    make_policy,
    make_rebalancer,
)
from hethpc.train.parts.engine import Engine, make_engine
from hethpc.train.parts.optim import GradientClip, make_optimizer
from hethpc.train.settings.config import ConfigError, TrainConfig
from hethpc.train.watch.guards import check_same_model


@dataclass(frozen=True)
class RunParts:
    """Everything one rank's run is made of, built once before the first step.

    Attributes:
        engine: the step engine (data-parallel or a pipeline stage).
        module: what this rank trains (the whole model, or its pipeline stage).
        loader: this replica's batches.
        partition_lengths: each replica's partition length, for skewed partitions (else None).
        controller: the per-replica batch sizes.
        policy: the synchronisation policy.
        injector: data injection, or None.
        rebalancer: partition rebalancing, or None.
        steps_per_epoch: steps in an epoch (the smallest over the ranks).
        total: the run's steps.
        optimizer: over ``module``'s parameters.
        scheduler: the per-step learning-rate schedule.
        components: what a checkpoint saves and restores.
        clip: the gradient clipping in ``optimizer``'s steps (``clip_grad_norm``), or None.
        caps: each replica's cap on the samples of one pass (``max_rank_batch``; None: none).
    """

    engine: Engine
    module: nn.Module
    loader: Loader
    partition_lengths: np.ndarray | None
    controller: BatchController
    policy: SyncPolicy
    injector: Injector | None
    rebalancer: Rebalancer | None
    steps_per_epoch: int
    total: int
    optimizer: torch.optim.Optimizer
    scheduler: Any
    components: Components
    clip: GradientClip | None = None
    caps: list[int | None] | None = None  # each replica's cap on one pass (max_rank_batch)


def assemble(
    cfg: TrainConfig,
    model: nn.Module,
    train_set: ArrayDataset | ShardedDataset,
    test_set: ArrayDataset | None,
    *,
    keep: np.ndarray | None = None,
    run_dir: Path | None = None,
) -> RunParts:
    """Check the model, broadcast rank 0's weights and build the run's parts (a collective).

    ``keep``: the training samples the loaders may use (the others are held out for
    validation); None: all. ``run_dir``: where a pipeline keeps its cut for a resumed run.

    Raises:
        ModelMismatchError: the ranks built different models.
        ConfigError: a pipeline run without test data, or a batch larger than the data.
    """
    check_same_model(model)
    comm.broadcast_model(model)  # the whole model, before a pipeline cuts it into stages
    engine = make_engine(cfg, model, sample=lambda n: first_rows(train_set, n), run_dir=run_dir)
    module = engine.module
    if test_set is None and engine.collective_eval:
        raise ConfigError("pipeline runs need test data to evaluate (test_data)")
    loader = make_loader(
        cfg, train_set, rank=engine.replica, world_size=engine.replicas, keep=keep
    )
    partition_lengths = (
        None
        if cfg.partition in ("iid", "seldp")
        else np.asarray(comm.allgather_object(loader.length))[engine.replica_leaders]
    )
    controller = make_controller(
        cfg, device=engine.device, group=engine.group, b_min=engine.min_batch
    )
    policy = make_policy(cfg, group=engine.group)
    injector = make_injector(cfg)
    rebalancer = make_rebalancer(cfg, partition_lengths)
    spe = int(
        comm.allreduce_array(np.array([loader.steps_per_epoch(cfg.batch_size)]), ReduceOp.MIN)[0]
    )
    if spe < 1:
        raise ConfigError(
            f"batch_size = {cfg.batch_size} (--batch-size) is larger than the training set of "
            f"{len(train_set) if keep is None else len(keep)} samples; use a smaller batch"
        )
    total = cfg.epochs * spe if cfg.max_steps == 0 else min(cfg.epochs * spe, cfg.max_steps)
    caps = make_caps(cfg, module, engine.device, train_set, replicas=engine.replicas)
    optimizer, scheduler = make_optimizer(cfg, module, total)
    clip = GradientClip(optimizer, cfg.clip_grad_norm) if cfg.clip_grad_norm > 0 else None
    components = Components(module, optimizer, scheduler, loader, controller, policy)
    return RunParts(
        engine=engine, module=module, loader=loader, partition_lengths=partition_lengths,
        controller=controller, policy=policy, injector=injector, rebalancer=rebalancer,
        steps_per_epoch=spe, total=total, optimizer=optimizer, scheduler=scheduler,
        components=components, clip=clip, caps=caps,
    )  # fmt: skip
