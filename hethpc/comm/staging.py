"""Pinned host buffers for GPU tensors that MPI or Horovod cannot read themselves.

Used only for CUDA tensors when MPI is not CUDA-aware (point-to-point) or Horovod was built
without GPU operations (collectives): CPU tensors never come here. Buffers are page-locked
(pinned), so copies to and from the GPU run asynchronously, and are reused across steps: a
buffer goes back to its pool when a *fence* (a CUDA event recorded after the last copy that
reads or writes it) has passed. A send's device-to-host copy runs on a side stream, so the
caller's stream goes on computing while its bytes leave the GPU.

The copies also accept CPU tensors (then plain, synchronous copies with fences that have
already passed), so the pooling and ordering logic is tested on machines without a GPU.
"""

from __future__ import annotations

import logging
import threading
from typing import Protocol

import torch

log = logging.getLogger("hethpc.comm")


class Fence(Protocol):
    """Something that passes once the copies before it are done (a ``torch.cuda.Event``)."""

    def query(self) -> bool: ...

    def synchronize(self) -> None: ...


class Passed:
    """A fence that has passed already (copies between host buffers are synchronous)."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None


PASSED = Passed()


class HostBuffers:
    """Byte buffers on the host, by size, each reusable once the fence given back with it passes.

    Args:
        pin: page-locked memory (needs CUDA); False gives plain memory (tests on CPU).
    """

    def __init__(self, *, pin: bool) -> None:
        self.pin = pin
        self.allocated = 0  # buffers made so far (reuse keeps it flat across steps)
        self._free: dict[int, list[torch.Tensor]] = {}
        self._fenced: list[tuple[Fence, torch.Tensor]] = []
        self._lock = threading.Lock()  # the progress thread and the caller share the pool

    def take(self, nbytes: int) -> torch.Tensor:
        """A uint8 buffer of ``nbytes`` (``[nbytes]``), reused when one is free."""
        with self._lock:
            if self._fenced:
                still = []
                for fence, buf in self._fenced:
                    if fence.query():
                        self._free.setdefault(buf.numel(), []).append(buf)
                    else:
                        still.append((fence, buf))
                self._fenced = still
            free = self._free.get(nbytes)
            if free:
                return free.pop()
            self.allocated += 1
        if self.pin:
            try:
                return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
            except RuntimeError as e:  # page-locking refused (a container's memlock limit)
                self.pin = False
                say_once("pin", f"pinned host memory unavailable ({e}); staging through "
                                "pageable memory instead (its copies are not asynchronous)")
        return torch.empty(nbytes, dtype=torch.uint8)

    def give(self, buffer: torch.Tensor, fence: Fence = PASSED) -> None:
        """Return ``buffer`` (from :meth:`take`), reusable once ``fence`` has passed."""
        with self._lock:
            self._fenced.append((fence, buffer))

    def cached(self) -> int:
        """Buffers held by the pool (free or awaiting their fence)."""
        with self._lock:
            return sum(len(v) for v in self._free.values()) + len(self._fenced)


_pool: HostBuffers | None = None
_copy_streams: dict[torch.device, torch.cuda.Stream] = {}
_said: set[str] = set()


def pool() -> HostBuffers:
    """The process's pool: pinned when CUDA is present."""
    global _pool
    if _pool is None:
        _pool = HostBuffers(pin=torch.cuda.is_available())
    return _pool


def say_once(key: str, message: str) -> None:
    """Log ``message`` (a warning of logger ``hethpc.comm``) the first time ``key`` comes."""
    if key not in _said:
        _said.add(key)
        log.warning("hethpc.comm: %s", message)


def bytes_of(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s bytes as a flat uint8 tensor (a view when it is contiguous)."""
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)


def to_host(tensor: torch.Tensor, buffers: HostBuffers) -> tuple[torch.Tensor, Fence]:
    """Start copying ``tensor``'s bytes into a buffer of ``buffers``.

    On CUDA the copy runs on a side stream that first waits for the caller's stream; the
    caller's stream is not held up. The tensor must not change until the fence has passed.

    Returns:
        The buffer (uint8 ``[nbytes]``) and the fence after which it holds the bytes.
    """
    flat = bytes_of(tensor)
    host = buffers.take(flat.numel())
    if not flat.is_cuda:
        host.copy_(flat)
        return host, PASSED
    dev = flat.device
    side = _copy_streams.get(dev)
    if side is None:
        side = _copy_streams[dev] = torch.cuda.Stream(device=dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        host.copy_(flat, non_blocking=True)
        done = torch.cuda.Event()
        done.record(side)
    flat.record_stream(side)  # the allocator keeps the memory until the side stream is past it
    return host, done


def ready_fence(tensor: torch.Tensor) -> Fence:
    """A fence that passes when the work queued so far on ``tensor``'s device stream is done."""
    if not tensor.is_cuda:
        return PASSED
    done = torch.cuda.Event()
    done.record(torch.cuda.current_stream(tensor.device))
    return done


def to_device(
    host: torch.Tensor,
    dtype: torch.dtype,
    shape: tuple[int, ...],
    device: torch.device,
    buffers: HostBuffers,
) -> torch.Tensor:
    """A tensor on ``device`` with ``host``'s bytes; ``host`` goes back to ``buffers``.

    The copy is queued on ``device``'s current stream, so the caller's next kernels see the
    data without the host waiting; the buffer is reused once the copy is done.
    """
    if device.type != "cuda":
        out = host.clone()
        buffers.give(host)
    else:
        out = torch.empty(host.numel(), dtype=torch.uint8, device=device)
        out.copy_(host, non_blocking=True)
        done = torch.cuda.Event()
        done.record(torch.cuda.current_stream(device))
        buffers.give(host, done)
    return out.view(dtype).reshape(shape)


def host_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A host tensor of ``tensor``'s dtype and shape holding its values (copy finished).

    For collectives on a Horovod without GPU operations: Horovod reads the host tensor from its
    own thread, so the copy must be complete on return. Give the result back with
    :func:`copy_back`.
    """
    host, fence = to_host(tensor, pool())
    fence.synchronize()
    return host.view(tensor.dtype).reshape(tensor.shape)


def copy_back(tensor: torch.Tensor, host: torch.Tensor) -> None:
    """Queue the copy of ``host`` (from :func:`host_copy`) into ``tensor``; recycle ``host``.

    Outside autograd: ``tensor`` may be a parameter (a leaf that requires grad), reduced or
    broadcast in place."""
    with torch.no_grad():
        tensor.copy_(host, non_blocking=tensor.is_cuda)
    pool().give(bytes_of(host), ready_fence(tensor))
