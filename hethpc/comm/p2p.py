"""Point-to-point tensor transfer (mpi4py) with shape and dtype sent along.

GPU tensors are staged through host memory, so any MPI library works, CUDA-aware or not.
A message is a small header (shape, dtype, and the send time under link emulation) followed
by the raw bytes of the tensor.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from hethpc.comm.errors import CommError
from hethpc.comm.groups import Group, resolve
from hethpc.comm.link import arrival, current_link, hold_until

_DTYPES: dict[str, torch.dtype] = {
    str(d): d
    for d in (
        torch.float64,
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
    )
}


def _check_peer(g: Group, peer: int, what: str) -> None:
    if g.size == 1:
        raise CommError(f"{what} needs a peer, but the group has a single rank")
    if not 0 <= peer < g.size or peer == g.rank:
        raise CommError(
            f"{what}: peer {peer} must be another rank of the group (0..{g.size - 1}, "
            f"not this rank {g.rank})"
        )


def _as_bytes(tensor: torch.Tensor) -> Any:
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy()


@dataclass
class Request:
    """A pending :func:`isend_tensor`; call :meth:`wait` before reusing the tensor's memory."""

    _requests: list[Any] = field(default_factory=list)
    _keep: list[Any] = field(default_factory=list)  # buffers that must outlive the send

    def wait(self) -> None:
        """Block until the send has completed."""
        for r in self._requests:
            r.Wait()
        self._requests.clear()
        self._keep.clear()

    def test(self) -> bool:
        """Whether the send has completed (does not block)."""
        done = all(r.Test() for r in self._requests)
        if done:
            self._requests.clear()
            self._keep.clear()
        return done


def isend_tensor(
    tensor: torch.Tensor, dest: int, *, tag: int = 0, group: Group | None = None
) -> Request:
    """Start sending ``tensor`` (any shape, dtype, device) to group rank ``dest``.

    Raises:
        CommError: ``dest`` is not another rank of the group, or the dtype is unsupported.
    """
    g = resolve(group)
    _check_peer(g, dest, "isend_tensor")
    if str(tensor.dtype) not in _DTYPES:
        raise CommError(f"isend_tensor: dtype {tensor.dtype} is not supported")
    payload = _as_bytes(tensor)
    # The send time travels along under link emulation: the receiver hands the tensor over no
    # earlier than it would arrive on the emulated link.
    header = (tuple(tensor.shape), str(tensor.dtype), time.time() if current_link() else None)
    comm = g.mpi_comm
    r1 = comm.isend(header, dest=dest, tag=2 * tag)
    r2 = comm.Isend(payload, dest=dest, tag=2 * tag + 1)
    return Request([r1, r2], [payload])


def send_tensor(
    tensor: torch.Tensor, dest: int, *, tag: int = 0, group: Group | None = None
) -> None:
    """Send ``tensor`` to group rank ``dest`` and wait until its buffer may be reused."""
    isend_tensor(tensor, dest, tag=tag, group=group).wait()


def recv_tensor(
    source: int,
    *,
    tag: int = 0,
    device: torch.device | str | None = None,
    group: Group | None = None,
) -> torch.Tensor:
    """Receive a tensor sent by group rank ``source`` with the same ``tag``.

    Args:
        source: the sender's rank in the group.
        tag: must match the sender's.
        device: where the result lives (default: CPU).

    Returns:
        A new tensor with the sender's shape and dtype.
    """
    g = resolve(group)
    _check_peer(g, source, "recv_tensor")
    comm = g.mpi_comm
    shape, dtype_name, sent_at = comm.recv(source=source, tag=2 * tag)
    dtype = _DTYPES[dtype_name]
    numel = 1
    for s in shape:
        numel *= s
    out = torch.empty(numel, dtype=dtype)
    comm.Recv(out.view(torch.uint8).numpy(), source=source, tag=2 * tag + 1)
    nbytes = out.numel() * out.element_size()
    hold_until(arrival(sent_at, nbytes), nbytes)
    out = out.reshape(shape)
    if device is not None and torch.device(device).type != "cpu":
        out = out.to(device, non_blocking=False)
    return out


class RecvRequest:
    """A pending :func:`irecv_tensor`: :meth:`test` moves it on, :meth:`wait` returns the tensor.

    Like an MPI request, use it from one thread at a time.
    """

    def __init__(self, comm: Any, source: int, tag: int, device: torch.device | str | None) -> None:
        self._comm = comm
        self._source = source
        self._tag = tag
        self._device = device
        self._header = comm.irecv(source=source, tag=2 * tag)
        self._payload: Any = None
        self._out: torch.Tensor | None = None
        self._shape: tuple[int, ...] = ()
        self._arrives: float | None = None  # the emulated arrival (wall time), if any
        self._nbytes = 0

    def _post_payload(self, header: tuple[tuple[int, ...], str, float | None]) -> None:
        shape, dtype_name, sent_at = header
        numel = 1
        for s in shape:
            numel *= s
        self._shape = tuple(shape)
        self._out = torch.empty(numel, dtype=_DTYPES[dtype_name])
        self._nbytes = self._out.numel() * self._out.element_size()
        self._arrives = arrival(sent_at, self._nbytes)
        self._payload = self._comm.Irecv(
            self._out.view(torch.uint8).numpy(), source=self._source, tag=2 * self._tag + 1
        )

    def test(self) -> bool:
        """Whether the tensor has fully arrived (does not block; makes progress)."""
        if self._payload is None:
            done, header = self._header.test()
            if not done:
                return False
            self._post_payload(header)
        if not self._payload.Test():
            return False
        return self._arrives is None or time.time() >= self._arrives

    def wait(self) -> torch.Tensor:
        """Block until the tensor has arrived; returns it (shape and dtype of the sender's)."""
        if self._payload is None:
            self._post_payload(self._header.wait())
        self._payload.Wait()
        hold_until(self._arrives, self._nbytes)
        self._arrives = None
        assert self._out is not None
        out = self._out.reshape(self._shape)
        if self._device is not None and torch.device(self._device).type != "cpu":
            out = out.to(self._device, non_blocking=False)
        return out


def irecv_tensor(
    source: int,
    *,
    tag: int = 0,
    device: torch.device | str | None = None,
    group: Group | None = None,
) -> RecvRequest:
    """Start receiving a tensor sent by group rank ``source`` with the same ``tag``.

    Posting receives early lets a large message arrive while this rank computes (when
    something calls :meth:`RecvRequest.test` now and then), instead of when it asks for it.

    Args:
        source: the sender's rank in the group.
        tag: must match the sender's.
        device: where the result of :meth:`RecvRequest.wait` lives (default: CPU).

    Raises:
        CommError: ``source`` is not another rank of the group.
    """
    g = resolve(group)
    _check_peer(g, source, "irecv_tensor")
    return RecvRequest(g.mpi_comm, source, tag, device)
