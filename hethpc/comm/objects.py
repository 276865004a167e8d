"""Control collectives through mpi4py: barriers, small objects, numpy arrays and votes.

Small messages through mpi4py cost microseconds, where a Horovod collective waits for its
background cycle (about 1 ms); tensors go through :mod:`hethpc.comm.collectives`.
"""

from __future__ import annotations

import time
from typing import Any, TypeVar

import numpy as np
import torch

from hethpc.comm.collectives import ReduceOp
from hethpc.comm.errors import CommError
from hethpc.comm.groups import Group, resolve
from hethpc.comm.link import emulate_collective
from hethpc.comm.runtime import state
from hethpc.comm.waiting import arrive

T = TypeVar("T")


def barrier(group: Group | None = None) -> None:
    """Wait until every rank of ``group`` (default: the world) gets here."""
    g = resolve(group)
    if g.size > 1:
        t0 = time.perf_counter()
        arrive(g.mpi_comm)
        emulate_collective(t0, "allreduce", 0, g.size)


def on_host(obj: Any) -> Any:
    """``obj`` with every tensor in it (through dicts, lists and tuples) detached and on the
    CPU: what a GPU rank sends through the object collectives, which pickle tensors with their
    device (a receiver would otherwise load them onto the sender's GPU index)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: on_host(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(on_host(v) for v in obj)
    return obj


def allgather_object(obj: T, group: Group | None = None) -> list[T]:
    """Every rank's ``obj`` (small and picklable), in group-rank order, on every rank."""
    g = resolve(group)
    if g.size == 1:
        return [obj]
    t0 = time.perf_counter()
    arrive(g.mpi_comm)
    out = list(g.mpi_comm.allgather(obj))
    emulate_collective(t0, "allgather", 0, g.size)  # objects: control messages, latency only
    return out


def broadcast_object(obj: T, root: int = 0, group: Group | None = None) -> T:
    """``obj`` of group rank ``root``, on every rank of the group."""
    g = resolve(group)
    if g.size == 1:
        return obj
    t0 = time.perf_counter()
    arrive(g.mpi_comm)
    out: T = g.mpi_comm.bcast(obj, root=root)
    emulate_collective(t0, "broadcast", 0, g.size)  # objects: control messages, latency only
    return out


def allgather_array(array: np.ndarray, group: Group | None = None) -> np.ndarray:
    """Stack every rank's array: shape ``[group size, *array.shape]``, on every rank.

    Raises:
        CommError: the ranks' arrays differ in shape or dtype (raised on every rank).
    """
    g = resolve(group)
    a = np.ascontiguousarray(array)
    if g.size == 1:
        return a[None].copy()
    t0 = time.perf_counter()
    arrive(g.mpi_comm)
    metas = g.mpi_comm.allgather((a.shape, a.dtype.str))
    if len(set(metas)) != 1:
        detail = ", ".join(f"rank {r}: shape {s} dtype {d}" for r, (s, d) in enumerate(metas))
        raise CommError(
            f"allgather_array needs the same shape and dtype on every rank; got {detail}"
        )
    out = np.empty((g.size, *a.shape), dtype=a.dtype)
    g.mpi_comm.Allgather(a, out)
    emulate_collective(t0, "allgather", a.nbytes, g.size)
    return out


def allreduce_array(
    array: np.ndarray, op: ReduceOp = ReduceOp.SUM, group: Group | None = None
) -> np.ndarray:
    """Reduce a small numpy array through mpi4py (microseconds; use it for votes and counts)."""
    g = resolve(group)
    a = np.ascontiguousarray(array)
    if g.size == 1:
        return a.copy()
    mpi = state().mpi
    out = np.empty_like(a)
    t0 = time.perf_counter()
    arrive(g.mpi_comm)
    mpi_op = {ReduceOp.SUM: mpi.SUM, ReduceOp.AVERAGE: mpi.SUM, ReduceOp.MIN: mpi.MIN,
              ReduceOp.MAX: mpi.MAX}[op]  # fmt: skip
    g.mpi_comm.Allreduce(a, out, op=mpi_op)
    emulate_collective(t0, "allreduce", a.nbytes, g.size)
    return out / g.size if op is ReduceOp.AVERAGE else out
