"""Tensor collectives through mpi4py: the ``"mpi"`` transport (``comm.init(transport="mpi")``).

Horovod is then never started, so no background thread polls MPI: a small allreduce costs
what MPI takes (about 0.1-0.2 ms for 32 KB between two ranks on the 2-core host) instead of
waiting for Horovod's cycle (about 1.2 ms; ``benchmarks/NOTES.md``). Tensors are reduced in
place in their own memory (CPU; a GPU tensor is staged through a host copy). 16-bit floats
(float16, bfloat16) travel as 16 bits, summed by an MPI operation of hethpc's own (MPI has no
16-bit float sum): what a compressed average sends is what crosses the link. Nonblocking allreduces
(``Iallreduce``) must be started in the same order on every rank, which hethpc's callers do
(gradient hooks fire in the model's order, the optimizer state after the parameters).
"""

from __future__ import annotations

from typing import Any

import torch

from hethpc.comm import staging, waiting

_HALF = (torch.float16, torch.bfloat16)
# The MPI operations that combine 16-bit floats, by (dtype, op), created on first use.
_half_ops: dict[tuple[torch.dtype, str], Any] = {}


def _half_op(mpi: Any, dtype: torch.dtype, op: str) -> Any:
    """An MPI operation combining ``dtype`` elements carried as 16-bit integers; each partial
    result is rounded to ``dtype`` (as Horovod's float16 sum does)."""
    key = (dtype, op)
    if key not in _half_ops:
        combine = {
            "sum": torch.Tensor.add_,
            "average": torch.Tensor.add_,
            "min": lambda b, a: torch.minimum(b, a, out=b),
            "max": lambda b, a: torch.maximum(b, a, out=b),
        }[op]

        def apply(inbuf: Any, inoutbuf: Any, datatype: Any) -> None:
            if not len(inoutbuf):  # MPI may combine empty pieces (a ring's, of few elements)
                return
            combine(torch.frombuffer(inoutbuf, dtype=dtype), torch.frombuffer(inbuf, dtype=dtype))

        _half_ops[key] = mpi.Op.Create(apply, commute=True)
    return _half_ops[key]


def _op(mpi: Any, op: str, dtype: torch.dtype = torch.float32) -> Any:
    if dtype in _HALF:
        return _half_op(mpi, dtype, op)
    return {"sum": mpi.SUM, "average": mpi.SUM, "min": mpi.MIN, "max": mpi.MAX}[op]


class _Work:
    """A tensor prepared for MPI: the buffer MPI reduces, and how the result gets back."""

    def __init__(self, tensor: torch.Tensor, prescale: float) -> None:
        self.tensor = tensor
        if tensor.is_cuda:
            buf = staging.host_copy(tensor)
        elif not tensor.is_contiguous():
            buf = tensor.detach().clone().contiguous()
        else:
            buf = tensor.detach()
        if prescale != 1.0:
            buf.mul_(prescale)
        self.buf = buf

    def array(self, mpi: Any) -> Any:
        """The buffer as MPI takes it: 16-bit floats as 16-bit integers, which
        :func:`_half_op` reads back as floats."""
        if self.buf.dtype in _HALF:
            return [self.buf.view(torch.int16).numpy(), mpi.INT16_T]
        return self.buf.numpy()

    def finish(self, op: str, size: int) -> torch.Tensor:
        if op == "average":
            self.buf.div_(size)
        t = self.tensor
        if self.buf.data_ptr() == t.data_ptr() and self.buf.dtype == t.dtype:
            return t
        if t.is_cuda:
            staging.copy_back(t, self.buf.to(t.dtype))
        else:
            with torch.no_grad():
                t.copy_(self.buf.view_as(t))
        return t


def allreduce_(mpi: Any, comm: Any, tensor: torch.Tensor, op: str, prescale: float) -> None:
    """Reduce ``tensor`` in place over ``comm`` (returns when done; waits without spinning)."""
    work = _Work(tensor, prescale)
    waiting.arrive(comm)
    reduce = _op(mpi, op, work.buf.dtype)
    waiting.wait(comm.Iallreduce(mpi.IN_PLACE, work.array(mpi), op=reduce))
    work.finish(op, comm.Get_size())


class Request:
    """A nonblocking in-place allreduce; :meth:`wait` completes it."""

    def __init__(self, work: _Work, request: Any, op: str, size: int) -> None:
        self._work, self._request, self._op, self._size = work, request, op, size

    def wait(self) -> None:
        waiting.wait(self._request)
        self._work.finish(self._op, self._size)


def allreduce_async_(mpi: Any, comm: Any, tensor: torch.Tensor, op: str) -> Request:
    """Start reducing ``tensor`` in place over ``comm``; returns at once."""
    work = _Work(tensor, 1.0)
    request = comm.Iallreduce(mpi.IN_PLACE, work.array(mpi), op=_op(mpi, op, work.buf.dtype))
    return Request(work, request, op, comm.Get_size())


def broadcast_(comm: Any, tensors: list[torch.Tensor], root: int) -> None:
    """Copy ``tensors`` from group rank ``root`` to every rank of ``comm``, as raw bytes."""
    for t in tensors:
        host = staging.host_copy(t) if t.is_cuda else t.detach()
        contiguous = host if host.is_contiguous() else host.contiguous()
        comm.Bcast(contiguous.reshape(-1).view(torch.uint8).numpy(), root=root)
        if t.is_cuda:
            staging.copy_back(t, contiguous)
        elif contiguous.data_ptr() != t.data_ptr():
            with torch.no_grad():
                t.copy_(contiguous)
