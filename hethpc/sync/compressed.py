"""Allreduces through a codec: a flat buffer compressed, summed on the wire, decompressed.

The communicating half of :mod:`~hethpc.sync.compression`. Each function counts what it
would have sent uncompressed and what it sent in the codec's :class:`Tally`, and returns the
bytes on the wire. A world of size 1 sends nothing and rounds nothing (the bytes are still
counted, so a run's figures do not depend on its size).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate

import torch

from hethpc import comm
from hethpc.comm import Group, Pending, ReduceOp, transfer_buffer
from hethpc.sync.agreement import group_size
from hethpc.sync.compression import Codec
from hethpc.sync.int8 import Int8, chunk_absmax, dequantize, levels, quantize

# Flat and wire buffers by collective name, dtype and device, reused from call to call.
_buffers: dict[tuple[str, torch.dtype, torch.device], torch.Tensor] = {}


def _buffer(name: str, dtype: torch.dtype, device: torch.device, numel: int) -> torch.Tensor:
    key = (name, dtype, device)
    buf = _buffers.get(key)
    if buf is None or buf.numel() != numel:
        buf = _buffers[key] = transfer_buffer(numel, dtype, device)
    return buf


class PendingFlat:
    """A compressed allreduce in flight; :meth:`wait` completes it into the flat buffer."""

    def __init__(
        self, pending: Pending | None, wire: torch.Tensor, flat: torch.Tensor, codec: Codec
    ) -> None:
        self._pending, self._wire, self._flat, self._codec = pending, wire, flat, codec

    def wait(self) -> torch.Tensor:
        """Block until the sum has arrived and is decompressed; returns the flat buffer."""
        if self._pending is not None:
            self._pending.wait()
            self._pending = None
            self._codec.decompress(self._wire, self._flat)
        return self._flat


def allreduce_flat_async_(
    flat: torch.Tensor,
    op: ReduceOp,
    codec: Codec,
    *,
    group: Group | None = None,
    name: str,
    wire: torch.Tensor | None = None,
) -> tuple[PendingFlat, int]:
    """Start reducing the 1-D ``flat`` in place through ``codec``; returns the pending
    operation and the bytes on the wire.

    Args:
        flat: contiguous, 1-D; overwritten with the (decompressed) result by ``wait``.
        op: SUM or AVERAGE.
        codec: how it travels.
        group: the ranks taking part (default: the world).
        name: the collective's name, unique among those in flight, the same on every rank.
        wire: where the compressed copy goes (of the codec's wire dtype, ``flat``'s size);
            None: a buffer kept under ``name``.
    """
    nbytes = codec.wire_bytes(flat.numel(), flat.dtype)
    codec.tally.add(flat.numel() * flat.element_size(), nbytes)
    if group_size(group) == 1:
        return PendingFlat(None, flat, flat, codec), nbytes
    dtype = codec.wire_dtype(flat.dtype)
    if wire is None and dtype != flat.dtype:
        wire = _buffer(f"{name}.wire", dtype, flat.device, flat.numel())
    sent = codec.compress(flat, wire)
    pending = comm.allreduce_async_(sent, op, group=group, name=name)
    return PendingFlat(pending, sent, flat, codec), nbytes


def allreduce_flat_(
    flat: torch.Tensor,
    op: ReduceOp,
    codec: Codec,
    *,
    group: Group | None = None,
    name: str,
) -> int:
    """Reduce the 1-D ``flat`` in place through ``codec`` (blocking); returns bytes on the
    wire."""
    nbytes = codec.wire_bytes(flat.numel(), flat.dtype)
    codec.tally.add(flat.numel() * flat.element_size(), nbytes)
    if group_size(group) == 1:
        return nbytes
    if isinstance(codec, Int8) and flat.dtype.is_floating_point:
        _int8_sum_(flat, op, codec, group=group, name=name)
        return nbytes
    dtype = codec.wire_dtype(flat.dtype)
    wire = None
    if dtype != flat.dtype:
        wire = _buffer(f"{name}.wire", dtype, flat.device, flat.numel())
    sent = codec.compress(flat, wire)
    comm.allreduce_(sent, op, group=group, name=name)
    codec.decompress(sent, flat)
    return nbytes


@torch.no_grad()
def _int8_sum_(
    flat: torch.Tensor, op: ReduceOp, codec: Int8, *, group: Group | None, name: str
) -> None:
    """The sum (or average) of ``flat`` over the ranks as int8 integers of shared per-chunk
    scales, with error feedback under ``name`` (:mod:`~hethpc.sync.int8`); two allreduces."""
    n = group_size(group)
    level = levels(n)
    sent = codec.feed_back(name, flat)
    scales = chunk_absmax(sent, codec.chunk)
    comm.allreduce_(scales, ReduceOp.MAX, group=group, name=f"{name}.scales")
    q = quantize(sent, scales, level, codec.chunk)
    codec.keep_error(name, sent, q, scales, level)
    comm.allreduce_(q, ReduceOp.SUM, group=group, name=name)
    dequantize(q, scales, level, flat, codec.chunk)
    if op == ReduceOp.AVERAGE:
        flat.div_(n)


@torch.no_grad()
def average_tensors_(
    tensors: Sequence[torch.Tensor],
    codec: Codec,
    *,
    weight: float | None = None,
    group: Group | None = None,
    name: str,
    references: Sequence[torch.Tensor | None] = (),
) -> int:
    """Average ``tensors`` across ranks in place through ``codec``: one allreduce of a flat
    buffer per dtype and device, weighted (``sum_k w_k x_k``) when ``weight`` is given.

    Where ``references[i]`` is given (the same tensor on every rank: the parameters at the
    last average), ``tensors[i] - references[i]`` travels and the result is the reference plus
    the averaged difference: the same average, with the codec's error relative to how far the
    replicas moved rather than to the values themselves (a parameter's update is often below
    fp16's resolution of the parameter). The weight scales what travels, before compressing.

    Returns:
        The bytes this rank put on the wire.
    """
    refs = list(references) + [None] * (len(tensors) - len(references))
    kinds: dict[tuple[torch.dtype, torch.device], list[int]] = {}
    for i, t in enumerate(tensors):
        kinds.setdefault((t.dtype, t.device), []).append(i)
    op = ReduceOp.AVERAGE if weight is None else ReduceOp.SUM
    nbytes = 0
    for (dtype, device), members in kinds.items():
        numel = sum(tensors[i].numel() for i in members)
        flat = _buffer(f"{name}.flat", dtype, device, numel)
        ends = accumulate(tensors[i].numel() for i in members)
        parts = [(tensors[i], refs[i], flat[end - tensors[i].numel() : end].view_as(tensors[i]))
                 for i, end in zip(members, ends, strict=True)]  # fmt: skip
        for t, ref, part in parts:  # what travels: the tensor, or its change since ref
            if ref is None:
                part.copy_(t)
            else:
                torch.sub(t, ref, out=part)
        if weight is not None:
            flat.mul_(float(weight))
        nbytes += allreduce_flat_(flat, op, codec, group=group, name=f"{name}.{dtype}")
        for t, ref, part in parts:
            if ref is None:
                t.copy_(part)
            else:
                torch.add(ref, part, out=t)
    return nbytes
