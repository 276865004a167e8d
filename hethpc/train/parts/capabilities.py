"""Seams between the loop and the capability packages: each builder makes one part from a config.

The loop calls only ``make_*`` and the parts' documented methods, so a change in how a part
is built stays here.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from hethpc import comm
from hethpc.batching import BatchController, ControlSettings
from hethpc.batching.allocation import default_min_batch
from hethpc.batching.memory_cap import caps_for, measure_cap, parse_max_rank_batch
from hethpc.batching.slowdown import SlowdownSchedule
from hethpc.comm import Group
from hethpc.data import ArrayDataset, Injector, Loader, ShardedDataset, make_partitioner
from hethpc.data.balance import Rebalancer
from hethpc.data.transform import is_sequence, to_batch
from hethpc.sync import SyncPolicy
from hethpc.sync.drift import DriftCorrection
from hethpc.sync.factory import policy_class
from hethpc.sync.outer import OuterOptimizer
from hethpc.train.errors import ConfigError
from hethpc.train.parts.device import ranks_sharing
from hethpc.train.settings.config import TrainConfig
from hethpc.train.settings.policy import (
    averages_optimizer_state,
    corrects_drift,
    non_iid,
    policy_settings,
    rebalances,
)


def labels_of(dataset: ArrayDataset | ShardedDataset) -> np.ndarray:
    """Every sample's label."""
    return np.asarray(dataset.y if isinstance(dataset, ArrayDataset) else dataset.labels)


def make_loader(
    cfg: TrainConfig,
    train: ArrayDataset | ShardedDataset,
    *,
    rank: int,
    world_size: int,
    keep: np.ndarray | None = None,
) -> Loader:
    """This rank's training loader: IID or SelDP over all samples, or its own partition.

    ``keep``: the sample indices training may use (the rest are a held-out validation split);
    None: all of them. A partition is drawn over all samples, then filtered by it.

    Batches of an in-memory dataset are read in line (a copy of a few rows; a prefetch
    thread would only add thread hand-offs to every step); HDF5 shards are prefetched while
    the step computes (prefetch="auto").
    """
    prefetch: bool | str = "auto" if isinstance(train, ShardedDataset) else False
    if cfg.partition in ("iid", "seldp"):
        return Loader(
            train,
            rank=rank,
            world_size=world_size,
            mode=cfg.partition,
            indices=keep,
            seed=cfg.seed,
            prefetch=prefetch,
        )
    kw: dict[str, Any] = (
        {"labels_per_rank": cfg.labels_per_rank, "allow_uncovered": cfg.allow_uncovered}
        if cfg.partition == "labels"
        else site_settings(cfg, train) if cfg.partition == "site"
        else {"alpha": cfg.dirichlet_alpha}
    )  # fmt: skip
    partitioner = make_partitioner(cfg.partition, **kw)
    idx = partitioner.indices(labels_of(train), world_size, rank, cfg.seed)
    if keep is not None:
        idx = idx[np.isin(idx, keep)]
    return Loader(
        train,
        rank=rank,
        world_size=world_size,
        mode="partition",
        indices=idx,
        seed=cfg.seed,
        prefetch=prefetch,
    )


def site_settings(cfg: TrainConfig, train: ArrayDataset | ShardedDataset) -> dict[str, Any]:
    """The site partitioner's keywords: every sample's site and the site names.

    Raises:
        ConfigError: the training data has no site column.
    """
    if not isinstance(train, ShardedDataset) or train.manifest.sites is None:
        where = train.root if isinstance(train, ShardedDataset) else cfg.data
        raise ConfigError(
            f"partition = 'site' gives each rank whole sites, but the training data ({where}) "
            "has no site column; convert text with 'hethpc-convert text DIR --out OUT' (which "
            "stores each window's site) and train on --data OUT, or choose another partition",
            key="partition",
        )
    return {"sites": train.sites, "names": train.manifest.sites}


def make_rebalancer(
    cfg: TrainConfig, partition_lengths: np.ndarray | None, *, group: Group | None = None
) -> Rebalancer | None:
    """The batch rebalancer, ``rebalance`` with auto resolved
    (:func:`~hethpc.train.settings.policy.rebalances`); None when off or on IID data."""
    if partition_lengths is None or not rebalances(cfg):
        return None
    return Rebalancer(partition_lengths, group=group)


def make_injector(cfg: TrainConfig) -> Injector | None:
    """The data injector, or None when injection is off (alpha or beta is 0)."""
    if cfg.inject_alpha == 0 or cfg.inject_beta == 0:
        return None
    return Injector(cfg.inject_alpha, cfg.inject_beta, seed=cfg.seed)


def make_controller(
    cfg: TrainConfig,
    *,
    device: torch.device | None = None,
    group: Group | None = None,
    b_min: int | None = None,
) -> BatchController:
    """The batch controller: per-replica batch sizes that sum to the global batch.

    ``device`` is where the model computes: on CUDA the controller synchronises it before
    reading the clock. ``group``: the replicas sharing the global batch (default: the world).
    ``b_min``: a floor above ``cfg.b_min`` (a pipeline replica needs a row per micro-batch).
    """
    weights = [float(w) for w in cfg.weights.split(",")] if cfg.weights else None
    replicas = (comm.world() if group is None else group).size
    if weights is not None and len(weights) != replicas:
        raise ConfigError(
            f"weights = {cfg.weights!r} gives {len(weights)} weight(s), but {replicas} "
            "data-parallel rank(s) share the global batch; give one weight per rank",
            key="weights",
        )
    auto = 1
    if cfg.batching == "dynamic":
        auto = default_min_batch(cfg.batch_size, replicas, skewed=non_iid(cfg))
    floor = cfg.b_min or auto  # explicit static weights are never overridden
    return BatchController(
        cfg.batch_size,
        mode=cfg.batching,
        weights=weights if cfg.batching != "uniform" else None,
        settings=ControlSettings(interval=cfg.batch_interval, b_min=max(floor, b_min or 1)),
        slowdown=SlowdownSchedule.parse(cfg.slowdown) if cfg.slowdown else None,
        slowdown_mode=cfg.slowdown_mode,
        device=device,
        group=group,
    )


def drift_correction(cfg: TrainConfig) -> DriftCorrection | None:
    """The drift correction of a policy that averages parameters, ``drift_correction`` with
    auto resolved (:func:`~hethpc.train.settings.policy.corrects_drift`); None when off or when
    the policy averages no parameters."""
    return DriftCorrection(cfg.drift_smoothing) if corrects_drift(cfg) else None


def make_policy(cfg: TrainConfig, *, group: Group | None = None) -> SyncPolicy:
    """The synchronisation policy among ``group``'s replicas (default: the world), built with
    the settings its class reads from ``cfg``.

    The loop's weights ``b_k / B`` come from the batch controller's size vector, which every
    rank holds identically, so the policies that check them in a collective of their own
    (BSP, FedAvg) skip it (BSP then issues no control collective at all, only its gradient
    allreduce). The loop writes its own step records, so the policy keeps none. The outer
    optimizer, drift correction and optimizer-state averaging are off (``none``, None, False)
    unless the configuration's rules allow them for this policy.
    """
    policy = policy_class(cfg.sync)
    outer = None
    if cfg.outer_optimizer != "none":
        outer = OuterOptimizer(cfg.outer_optimizer, lr=cfg.outer_lr, momentum=cfg.outer_momentum)
    checks: dict[str, Any] = {"check_weights": False} if policy.separate_weight_check else {}
    return policy(
        **policy_settings(cfg), **checks, group=group, keep_records=False, outer=outer,
        drift=drift_correction(cfg), optimizer_state=averages_optimizer_state(cfg),
        compression=cfg.compression,
    )  # fmt: skip


def finish_policy(policy: SyncPolicy, model: nn.Module) -> None:
    """Average diverged replicas before evaluation (a no-op when they agree)."""
    policy.finish(model)


def policy_summary(policy: SyncPolicy) -> dict[str, Any]:
    """The policy's summary (fraction synchronised, bytes against BSP) as a dict."""
    return {**policy.summary().as_dict(), **policy.summary_fields()}


def first_rows(
    train: ArrayDataset | ShardedDataset, n: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``n`` training samples (all, if fewer) as the model's inputs and targets."""
    n = min(n, len(train))
    if isinstance(train, ArrayDataset):
        x, y = train.x[:n], train.y[:n]
    else:
        x, y = train.read(np.arange(n))
    return to_batch(np.asarray(x), np.asarray(y), sequence=is_sequence(train))


def make_caps(
    cfg: TrainConfig,
    model: nn.Module,
    device: torch.device,
    train: ArrayDataset | ShardedDataset,
    *,
    replicas: int,
) -> list[int | None]:
    """Every replica's cap on one pass (``max_rank_batch``; None: no cap), the same list on
    every rank: given, or measured by each rank at start (``auto``, a collective that raises on
    every rank when one rank cannot measure).

    Raises:
        ConfigError: a list of caps for another number of ranks, or ``auto`` without a known
            memory limit or with not one sample fitting (naming the rank).
    """
    spec = parse_max_rank_batch(cfg.max_rank_batch)
    if spec is None or cfg.pipeline_stages > 1:  # a pipeline's auto: its cut keeps to memory
        return [None] * replicas
    if isinstance(spec, tuple):
        try:
            return list(caps_for(spec, replicas))  # list[int] as list[int | None]
        except ValueError as e:
            raise ConfigError(str(e), key="max_rank_batch") from None
    mine: int | None | str
    try:
        rows = max(2, min(32, cfg.batch_size // max(replicas, 1)))
        gpus = torch.cuda.device_count() if device.type == "cuda" else 0
        mine = measure_cap(
            model, lambda n: first_rows(train, n), device, rows=rows,
            limit_gb=cfg.memory_limit_gb,
            sharing=ranks_sharing(comm.local_rank(), comm.local_size(), gpus),
        )  # fmt: skip
    except ValueError as e:
        mine = f"rank {comm.rank()}: {e}"
    every = comm.allgather_object(mine)  # every rank learns every cap, or every failure
    failed = [m for m in every if isinstance(m, str)]
    if failed:
        raise ConfigError("; ".join(failed), key="max_rank_batch")
    return [m for m in every if not isinstance(m, str)]  # data-parallel: a replica per rank
