"""Copy a model's parameters and an optimizer's state from one rank to every rank."""

from __future__ import annotations

from typing import Any

import torch

from hethpc.comm import mpi_tensors, staging
from hethpc.comm.collectives import _needs_staging
from hethpc.comm.groups import Group, resolve
from hethpc.comm.runtime import state


def broadcast_model(model: torch.nn.Module, root: int = 0, group: Group | None = None) -> None:
    """Copy ``model``'s parameters and buffers from group rank ``root`` to every group rank."""
    g = resolve(group)
    if g.size == 1:
        return
    hvd = state().hvd
    sd = model.state_dict(keep_vars=False)
    if hvd is None:
        mpi_tensors.broadcast_(g.mpi_comm, list(sd.values()), root)
        return
    staged = _needs_staging(list(sd.values()))
    items = {k: (staging.host_copy(t) if staged else t) for k, t in sd.items()}
    handles = [
        hvd.broadcast_async_(t, g.ranks[root], name=f"hethpc.bcast.{k}", process_set=g.process_set)
        for k, t in items.items()
    ]
    for h in handles:
        hvd.synchronize(h)
    if staged:
        for k, t in sd.items():
            staging.copy_back(t, items[k])


def broadcast_optimizer_state(
    optimizer: torch.optim.Optimizer, root: int = 0, group: Group | None = None
) -> None:
    """Copy ``optimizer``'s state and hyper-parameters from group rank ``root`` to every rank.

    The state travels as one pickled object (mpi4py), moved to the CPU first.
    """
    g = resolve(group)
    if g.size == 1:
        return
    sd = optimizer.state_dict() if g.rank == root else None
    if sd is not None:
        sd = _to_cpu(sd)
    optimizer.load_state_dict(g.mpi_comm.bcast(sd, root=root))


def _to_cpu(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj
