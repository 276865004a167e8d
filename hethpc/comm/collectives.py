"""Tensor collectives through Horovod (or mpi4py with transport "mpi"): allreduce (blocking,
in place, async, grouped).

GPU tensors go to Horovod directly when it was built with GPU operations (NCCL or CUDA-aware
MPI); otherwise they are staged through pinned host buffers reused across calls
(:mod:`hethpc.comm.staging`), so any Horovod build works, and the fallback is logged once.
bfloat16 tensors always go through mpi4py (:mod:`hethpc.comm.mpi_tensors`): Horovod's PyTorch
binding refuses them.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Sequence
from typing import Any

import torch

from hethpc.comm import mpi_tensors, staging
from hethpc.comm.buffers import transfer_buffer
from hethpc.comm.groups import Group, resolve
from hethpc.comm.link import emulate_collective
from hethpc.comm.runtime import state
from hethpc.comm.waiting import arrive


class ReduceOp(enum.Enum):
    """How an allreduce combines the ranks' tensors."""

    SUM = "sum"
    AVERAGE = "average"
    MIN = "min"
    MAX = "max"


def _hvd_op(op: ReduceOp) -> Any:
    hvd = state().hvd
    assert hvd is not None
    return {
        ReduceOp.SUM: hvd.Sum,
        ReduceOp.AVERAGE: hvd.Average,
        ReduceOp.MIN: hvd.Min,
        ReduceOp.MAX: hvd.Max,
    }[op]


def _needs_staging(tensors: Sequence[torch.Tensor]) -> bool:
    """Whether GPU tensors must go through host memory: Horovod was built without GPU ops."""
    if not any(t.is_cuda for t in tensors):
        return False
    hvd = state().hvd
    if hvd.nccl_built() or getattr(hvd, "cuda_built", lambda: False)():
        return False
    staging.say_once(
        "allreduce",
        "Horovod was built without GPU operations: CUDA tensors are reduced through pinned "
        "host buffers (the fallback path; scripts/setup.sh on a GPU node builds it with NCCL)",
    )
    return True


_NOT_HOROVOD = (torch.bfloat16, torch.int8)


def _horovod(tensors: Sequence[torch.Tensor]) -> Any:
    """horovod.torch when it carries these tensors; None when mpi4py does (transport "mpi",
    or a bfloat16 or int8 tensor, which Horovod's torch API refuses)."""
    hvd = state().hvd
    if hvd is None or any(t.dtype in _NOT_HOROVOD for t in tensors):
        return None
    return hvd


def _nbytes(tensors: Sequence[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def allreduce(
    tensor: torch.Tensor,
    op: ReduceOp = ReduceOp.AVERAGE,
    *,
    prescale: float = 1.0,
    group: Group | None = None,
    name: str | None = None,
) -> torch.Tensor:
    """Allreduce one tensor with Horovod; returns a new tensor.

    Args:
        tensor: any shape; the same shape and dtype on every rank.
        op: how to combine (Horovod's Sum, Average, Min, Max).
        prescale: each rank's tensor is multiplied by this before the reduction, inside
            Horovod's fused buffer. It must be the same on every rank (Horovod refuses
            mismatched factors); for per-rank weights, scale the tensor before the call.
        group: the ranks taking part (default: the world).
        name: a name for Horovod's timeline and error messages. Calls are blocking, so a fixed
            default name is safe, and it lets Horovod's response cache reuse its entries.
    """
    g = resolve(group)
    if g.size == 1:
        return tensor * prescale if prescale != 1.0 else tensor.clone()
    hvd = _horovod([tensor])
    if hvd is None:
        return allreduce_(tensor.detach().clone(), op, prescale=prescale, group=g, name=name)
    if _needs_staging([tensor]):
        host = staging.host_copy(tensor)
        allreduce_(host, op, prescale=prescale, group=g, name=name)  # emulated there
        out = torch.empty_like(tensor)
        staging.copy_back(out, host)
        return out
    t0 = time.perf_counter()
    arrive(g.mpi_comm)
    result: torch.Tensor = hvd.allreduce(
        tensor,
        op=_hvd_op(op),
        prescale_factor=prescale,
        process_set=g.process_set,
        name=name or "hethpc.allreduce",
    )
    emulate_collective(t0, "allreduce", _nbytes([tensor]), g.size)
    return result


def allreduce_(
    tensor: torch.Tensor,
    op: ReduceOp = ReduceOp.AVERAGE,
    *,
    prescale: float = 1.0,
    group: Group | None = None,
    name: str | None = None,
) -> torch.Tensor:
    """In-place :func:`allreduce`; returns ``tensor``."""
    g = resolve(group)
    if g.size == 1:
        return tensor.mul_(prescale) if prescale != 1.0 else tensor
    st = state()
    t0 = time.perf_counter()
    hvd = _horovod([tensor])
    if hvd is None:
        mpi_tensors.allreduce_(st.mpi, g.mpi_comm, tensor, op.value, prescale)
        emulate_collective(t0, "allreduce", _nbytes([tensor]), g.size)
        return tensor
    staged = _needs_staging([tensor])
    target = staging.host_copy(tensor) if staged else tensor
    arrive(g.mpi_comm)
    hvd.allreduce_(
        target,
        op=_hvd_op(op),
        prescale_factor=prescale,
        process_set=g.process_set,
        name=name or "hethpc.allreduce",
    )
    if staged:
        staging.copy_back(tensor, target)
    emulate_collective(t0, "allreduce", _nbytes([tensor]), g.size)
    return tensor


class Pending:
    """An in-place allreduce in flight (:func:`allreduce_async_`); :meth:`wait` completes it."""

    def __init__(
        self, tensor: torch.Tensor, target: torch.Tensor, handle: Any, t0: float, g: Group
    ) -> None:
        self._tensor, self._target, self._handle, self._t0, self._g = tensor, target, handle, t0, g

    def wait(self) -> torch.Tensor:
        """Block until the result is in the tensor (under link emulation, at least as long
        after the start as on the emulated link); returns the tensor."""
        if self._handle is not None:
            if isinstance(self._handle, mpi_tensors.Request):
                self._handle.wait()
            else:
                state().hvd.synchronize(self._handle)
            self._handle = None
            if self._target is not self._tensor:
                staging.copy_back(self._tensor, self._target)
            emulate_collective(self._t0, "allreduce", _nbytes([self._tensor]), self._g.size)
        return self._tensor


def allreduce_async_(
    tensor: torch.Tensor,
    op: ReduceOp = ReduceOp.SUM,
    *,
    group: Group | None = None,
    name: str,
) -> Pending:
    """Start an in-place Horovod allreduce of one contiguous tensor; returns at once.

    Horovod's background thread carries it while this thread goes on (the backward pass, when
    gradient hooks start it). Every rank must start the same names; call :meth:`Pending.wait`
    before reading the tensor. GPU tensors without GPU operations in Horovod are staged.

    Args:
        tensor: contiguous; overwritten with the result by :meth:`Pending.wait`.
        op: how to combine.
        group: the ranks taking part (default: the world).
        name: the operation's name, unique among those in flight, the same on every rank.
    """
    g = resolve(group)
    t0 = time.perf_counter()
    if g.size == 1:
        return Pending(tensor, tensor, None, t0, g)
    st = state()
    hvd = _horovod([tensor])
    if hvd is None:
        request = mpi_tensors.allreduce_async_(st.mpi, g.mpi_comm, tensor, op.value)
        return Pending(tensor, tensor, request, t0, g)
    target = staging.host_copy(tensor) if _needs_staging([tensor]) else tensor
    handle = hvd.allreduce_async_(target, op=_hvd_op(op), process_set=g.process_set, name=name)
    return Pending(tensor, target, handle, t0, g)


def grouped_allreduce(
    tensors: Sequence[torch.Tensor],
    op: ReduceOp = ReduceOp.AVERAGE,
    *,
    prescale: float = 1.0,
    group: Group | None = None,
    name: str | None = None,
) -> list[torch.Tensor]:
    """Allreduce a list of tensors as one fused Horovod operation; returns new tensors."""
    g = resolve(group)
    if g.size == 1:
        return [t * prescale if prescale != 1.0 else t.clone() for t in tensors]
    if not tensors:
        return []
    hvd = _horovod(tensors)
    if hvd is None or _needs_staging(tensors):
        outs = [t.detach().clone() for t in tensors]
        return grouped_allreduce_(outs, op, prescale=prescale, group=g, name=name)
    t0 = time.perf_counter()
    arrive(g.mpi_comm)
    results = list(
        hvd.grouped_allreduce(
            list(tensors),
            op=_hvd_op(op),
            prescale_factor=prescale,
            process_set=g.process_set,
            name=name or "hethpc.grouped_allreduce",
        )
    )
    emulate_collective(t0, "allreduce", _nbytes(tensors), g.size)
    return results


def grouped_allreduce_(
    tensors: Sequence[torch.Tensor],
    op: ReduceOp = ReduceOp.AVERAGE,
    *,
    prescale: float = 1.0,
    group: Group | None = None,
    name: str | None = None,
) -> list[torch.Tensor]:
    """In-place :func:`grouped_allreduce`; returns ``tensors``.

    The tensors are packed into one contiguous buffer per dtype and device (reused between
    calls of the same ``name``), reduced by ONE Horovod allreduce each, and unpacked: measured
    on the 2-core host (``benchmarks/bench_comm.py``), Horovod's own fusion of a list costs
    1.8x a single flat tensor at 16-64 MB, the copies into and out of its fusion buffer
    included.
    """
    g = resolve(group)
    if g.size == 1:
        if prescale != 1.0:
            for t in tensors:
                t.mul_(prescale)
        return list(tensors)
    if not tensors:
        return []
    if len(tensors) == 1 and tensors[0].is_contiguous():
        allreduce_(tensors[0], op, prescale=prescale, group=g, name=name)
        return list(tensors)
    kinds: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
    for t in tensors:
        kinds.setdefault((t.dtype, t.device), []).append(t)
    label = name or "hethpc.grouped_allreduce"
    for (dtype, device), same in kinds.items():
        flat = _flat_buffer(label, dtype, device, sum(t.numel() for t in same))
        torch.cat([t.reshape(-1) for t in same], out=flat)
        allreduce_(flat, op, prescale=prescale, group=g, name=f"{label}.{dtype}")
        offset = 0
        for t in same:
            t.copy_(flat[offset : offset + t.numel()].view_as(t))
            offset += t.numel()
    return list(tensors)


# Packing buffers of grouped_allreduce_, reused by calls of the same name (a few per job).
_flat_buffers: dict[tuple[str, torch.dtype, torch.device], torch.Tensor] = {}


def _flat_buffer(name: str, dtype: torch.dtype, device: torch.device, n: int) -> torch.Tensor:
    key = (name, dtype, device)
    buf = _flat_buffers.get(key)
    if buf is None or buf.numel() != n:
        buf = _flat_buffers[key] = transfer_buffer(n, dtype, device)
    return buf
