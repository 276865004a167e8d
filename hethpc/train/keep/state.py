"""What a checkpoint holds, gathered from every rank, and how it is restored on any world size.

Same world size: every rank gets back exactly its own state (RNG streams, loader position,
SelSync tracker, its replica when replicas may differ), so the run continues bit-identically.

Different world size (a smaller or larger allocation): the global batch is kept and
re-split by the batch controller, which starts afresh (throughput estimates are per rank and
cannot carry over; dynamic batching re-learns them within a few adjustments). Per-rank RNG
streams are re-derived from ``(seed, rank, step)``. The model is the average of the saved
replicas (they are identical under BSP), the optimizer state is rank 0's, the loader position
is rank 0's (the same global stream for IID, whatever the world size; for a
partition, the start of rank 0's epoch), and the synchronisation policy starts with empty
trackers.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from hethpc import comm
from hethpc.batching import BatchController
from hethpc.data import Loader
from hethpc.sync import SyncPolicy
from hethpc.train.keep.rng import get_rng_state, seed_rank, set_rng_state

FORMAT = 1


@dataclass(frozen=True)
class Components:
    """The stateful components of one rank's training run: what a checkpoint saves and restores."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any  # a torch LR scheduler
    loader: Loader
    controller: BatchController
    policy: SyncPolicy
    # Data injection and rebalancing need no state: injection picks its senders from (seed,
    # step), rebalancing follows the batch sizes.


def gather_state(
    components: Components,
    *,
    step: int,
    elapsed_s: float,
    config: dict[str, Any],
    replicas_differ: bool,
    counters: dict[str, float] | None = None,
) -> dict[str, Any] | None:
    """Collect the checkpoint state from every rank (a collective); returned on rank 0 only.

    ``counters`` are the job's own tallies (synchronised and skipped steps, seconds spent
    evaluating), kept as they are.
    """
    model, optimizer = components.model, components.optimizer
    mine: dict[str, Any] = {
        "rng": get_rng_state(),
        "loader": components.loader.state_dict(),
        "policy": components.policy.state_dict(),
    }
    if replicas_differ:
        mine["model"] = model.state_dict()
        mine["optimizer"] = optimizer.state_dict()
    ranks = comm.allgather_object(comm.on_host(mine))  # GPU state as CPU tensors (as loaded)
    if comm.rank() != 0:
        return None
    return {
        "format": FORMAT,
        "step": step,
        "elapsed_s": elapsed_s,
        "world_size": comm.size(),
        "config": config,
        "counters": dict(counters or {}),
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": components.scheduler.state_dict(),
        "controller": components.controller.state_dict(),
        "ranks": ranks,
    }


def _average(states: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    out = {}
    for k, v in states[0].items():
        if v.is_floating_point():
            out[k] = torch.stack([s[k] for s in states]).mean(0).to(v.dtype)
        else:
            out[k] = v
    return out


def restore_state(state: dict[str, Any], components: Components, *, seed: int) -> bool:
    """Load ``state`` into this rank's components; returns whether the world size was the same."""
    model, optimizer, loader = components.model, components.optimizer, components.loader
    rank, size = comm.rank(), comm.size()
    saved = state["ranks"]
    same = state["world_size"] == size
    components.scheduler.load_state_dict(state["scheduler"])
    if same:
        mine = saved[rank]
        model.load_state_dict(mine.get("model", state["model"]))
        optimizer.load_state_dict(mine.get("optimizer", state["optimizer"]))
        loader.load_state_dict(mine["loader"])
        components.controller.load_state_dict(state["controller"])
        components.policy.load_state_dict(mine["policy"])
        set_rng_state(mine["rng"])
        return True
    if "model" in saved[0]:
        model.load_state_dict(_average([s["model"] for s in saved]))
    else:
        model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    old = dict(saved[0]["loader"])
    if "length" in old and old["length"] != loader.length:
        # A partition changes with the world size: keep the epoch, restart within it.
        old["pos"] = int(old["pos"]) // int(old["length"]) * loader.length
        old["step_in_epoch"] = 0
    old.update(world_size=size, length=loader.length)
    try:
        loader.load_state_dict(old)
    except (KeyError, ValueError) as e:
        warnings.warn(
            f"loader position not restored on {size} ranks ({e}); starting afresh", stacklevel=2
        )
    seed_rank(seed, rank, int(state["step"]))
    return False
