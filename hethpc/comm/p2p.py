"""Point-to-point tensor transfer (mpi4py) with shape and dtype sent along.

A message is a small header (shape, dtype, and the send time under link emulation) followed
by the raw bytes of the tensor. CPU tensors go to MPI as they are. CUDA tensors go to MPI
directly when it is CUDA-aware (:mod:`hethpc.comm.cuda_aware`, probed once); otherwise they
are staged through pinned host buffers reused across steps (:mod:`hethpc.comm.staging`), the
device-to-host copy of a send running on a side stream while the caller computes, and the
fallback is logged once. Either way a CUDA send's bytes go to MPI only once the kernels that
produced them are done: a poster thread (:mod:`hethpc.comm.poster`, started at the first CUDA
send) waits for each send's CUDA event and posts its payload, in the order the sends were
started, so the caller never blocks on the GPU and the send moves on even while the caller is
in another MPI call.

One concept: the send and receive requests of one message format, for CPU and
CUDA tensors alike.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from hethpc.comm import staging
from hethpc.comm.cuda_aware import cuda_awareness
from hethpc.comm.errors import CommError
from hethpc.comm.groups import Group, resolve
from hethpc.comm.link import arrival, current_link, hold_until
from hethpc.comm.poster import Payload as _Payload
from hethpc.comm.poster import buffer_of as _buffer
from hethpc.comm.poster import poster as _poster

# How a CUDA tensor travels: handed to a CUDA-aware MPI, or staged through pinned host memory.
DIRECT, STAGED = "direct", "staged"

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


def cuda_route() -> str:
    """How this process moves CUDA tensors: :data:`DIRECT` or :data:`STAGED` (probed once)."""
    aware = cuda_awareness()
    if aware.aware:
        return DIRECT
    staging.say_once(
        "p2p",
        f"MPI is not CUDA-aware ({aware.source}): point-to-point CUDA tensors are staged "
        "through pinned host buffers (the fallback path)",
    )
    return STAGED


@dataclass
class Request:
    """A pending :func:`isend_tensor`; call :meth:`wait` before reusing the tensor's memory."""

    _requests: list[Any] = field(default_factory=list)
    _keep: list[Any] = field(default_factory=list)  # buffers that must outlive the send
    _payload: _Payload | None = None  # a CUDA send's payload, posted once its bytes are ready
    _release: Callable[[], None] | None = None  # gives a staging buffer back to its pool

    def _posted(self, block: bool) -> bool:
        p = self._payload
        assert p is not None
        if not p.posted.is_set():
            if not block:
                return False
            p.posted.wait()
        if p.error is not None:
            raise CommError(
                f"isend_tensor: posting a CUDA tensor to rank {p.dest} failed: {p.error}"
            ) from p.error
        self._requests.append(p.request)
        self._keep.append(p.buf)  # MPI reads it until the send completes
        self._release = p.release
        self._payload = None
        return True

    def _finish(self) -> None:
        self._requests.clear()
        self._keep.clear()
        if self._release is not None:
            self._release()
            self._release = None

    def wait(self) -> None:
        """Block until the send has completed."""
        if self._payload is not None:
            self._posted(block=True)
        for r in self._requests:
            r.Wait()
        self._finish()

    def test(self) -> bool:
        """Whether the send has completed (does not block)."""
        if self._payload is not None and not self._posted(block=False):
            return False
        done = all(r.Test() for r in self._requests)
        if done:
            self._finish()
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
    if tensor.is_cuda:
        return _isend_cuda(tensor, dest, tag, g, cuda_route())
    payload = _as_bytes(tensor)
    # The send time travels along under link emulation: the receiver hands the tensor over no
    # earlier than it would arrive on the emulated link.
    header = (tuple(tensor.shape), str(tensor.dtype), time.time() if current_link() else None)
    comm = g.mpi_comm
    r1 = comm.isend(header, dest=dest, tag=2 * tag)
    r2 = comm.Isend(payload, dest=dest, tag=2 * tag + 1)
    return Request([r1, r2], [payload])


def _isend_cuda(tensor: torch.Tensor, dest: int, tag: int, g: Group, route: str) -> Request:
    """A CUDA tensor's send (also used with CPU tensors by tests of the ordering logic)."""
    release: Callable[[], None] | None = None
    if route == DIRECT:
        buf = staging.bytes_of(tensor)
        fence = staging.ready_fence(buf)
    else:
        pool = staging.pool()
        buf, fence = staging.to_host(tensor, pool)
        release = functools.partial(pool.give, buf)
    header = (tuple(tensor.shape), str(tensor.dtype), time.time() if current_link() else None)
    comm = g.mpi_comm
    r1 = comm.isend(header, dest=dest, tag=2 * tag)
    payload = _Payload(comm, buf, fence, dest, 2 * tag + 1, release)
    _poster.put(payload)
    return Request([r1], [tensor], payload)


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
    if device is not None and torch.device(device).type == "cuda":
        return RecvRequest(g.mpi_comm, source, tag, device).wait()
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
        out = out.to(device, non_blocking=False)  # a device of another kind than CUDA
    return out


class RecvRequest:
    """A pending :func:`irecv_tensor`: :meth:`test` moves it on, :meth:`wait` returns the tensor.

    Like an MPI request, use it from one thread at a time.
    """

    def __init__(
        self, comm: Any, source: int, tag: int, device: torch.device | str | None,
        route: str | None = None,
    ) -> None:  # fmt: skip
        self._comm = comm
        self._source = source
        self._tag = tag
        self._device = torch.device(device) if device is not None else None
        # CUDA results: straight into device memory, or through a pinned buffer (``_host``).
        if route is None and self._device is not None and self._device.type == "cuda":
            route = cuda_route()
        self._route = route
        self._host: torch.Tensor | None = None
        self._dtype = torch.uint8
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
        dtype = self._dtype = _DTYPES[dtype_name]
        buf: Any
        if self._route is None:
            self._out = torch.empty(numel, dtype=dtype)
            buf = self._out.view(torch.uint8).numpy()
        elif self._route == DIRECT:
            self._out = torch.empty(numel, dtype=dtype, device=self._device)
            buf = _buffer(self._out.view(torch.uint8))
        else:
            nbytes = numel * dtype.itemsize
            self._host = staging.pool().take(nbytes)
            self._out = self._host  # its bytes, until wait() moves them to the device
            buf = _buffer(self._host)
        self._nbytes = self._out.numel() * self._out.element_size()
        self._arrives = arrival(sent_at, self._nbytes)
        self._payload = self._comm.Irecv(buf, source=self._source, tag=2 * self._tag + 1)

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
        if self._host is not None:
            assert self._device is not None
            host, self._host = self._host, None
            return staging.to_device(host, self._dtype, self._shape, self._device, staging.pool())
        out = self._out.reshape(self._shape)
        if self._route is None and self._device is not None and self._device.type != "cpu":
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
