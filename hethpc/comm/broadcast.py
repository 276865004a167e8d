"""Copy a model's parameters and an optimizer's state from one rank to every rank."""

from __future__ import annotations

import torch

from hethpc.comm import mpi_tensors, staging
from hethpc.comm.collectives import _needs_staging
from hethpc.comm.groups import Group, resolve
from hethpc.comm.objects import on_host
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
        sd = on_host(sd)
    optimizer.load_state_dict(g.mpi_comm.bcast(sd, root=root))
