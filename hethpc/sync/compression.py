"""Compression of what sync policies send: the codecs, their registry and their error bounds.

A codec turns a flat buffer into the tensor that crosses the link (``compress``) and back
(``decompress``); :mod:`~hethpc.sync.compressed` allreduces through one. The casts (fp16,
bf16) are sums of 16-bit floats: each rank rounds what it sends once, and every partial sum is
rounded again on the way (:func:`cast_error_bound`). Plain functions and small classes, tested
without MPI; one class per kind (PowerSGD in :mod:`~hethpc.sync.powersgd`), picked by name
from :data:`hethpc.sync.codecs.COMPRESSIONS` (as Horovod's ``Compression.fp16``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch


@dataclass
class Tally:
    """Bytes a policy's averages would have sent uncompressed (``raw``) and sent (``wire``)."""

    raw: int = 0
    wire: int = 0

    def add(self, raw: int, wire: int) -> None:
        self.raw += int(raw)
        self.wire += int(wire)

    @property
    def ratio(self) -> float:
        """``raw / wire``: 2.0 for fp16 of fp32 tensors; 1.0 before anything was sent."""
        return self.raw / self.wire if self.wire else 1.0


class Codec:
    """No compression: the buffer is sent as it is (the base of every codec).

    Attributes:
        name: the setting's value that selects it (``compression = "fp16"``).
        tally: bytes counted by the allreduces that went through it (shared by the codecs
            :meth:`range_safe` derives, so a policy's summary counts them all).
    """

    name: ClassVar[str] = "none"

    def __init__(self) -> None:
        self.tally = Tally()

    @property
    def compresses(self) -> bool:
        """Whether anything changes on the wire (False: the fp32 paths run unchanged)."""
        return False

    def spec(self) -> str:
        """The setting that builds it again (``"fp16"``, ``"powersgd:4"``)."""
        return self.name

    def wire_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The dtype a buffer of ``dtype`` travels in."""
        return dtype

    def range_safe(self) -> Codec:
        """The codec to use for values that may lie far outside fp16's range (an optimizer's
        second moments reach below its smallest normal number, 6.1e-5); itself, but for fp16."""
        return self

    def compress(self, flat: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """The wire tensor of ``flat`` (1-D), written into ``out`` when given (of
        :meth:`wire_dtype`); ``flat`` itself when nothing changes."""
        if out is None or out.data_ptr() == flat.data_ptr():
            return flat
        return out.copy_(flat)

    def decompress(self, wire: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """Write the summed wire tensor back into ``out`` (the flat buffer); returns ``out``."""
        if wire.data_ptr() != out.data_ptr():
            out.copy_(wire)
        return out

    def wire_bytes(self, numel: int, dtype: torch.dtype) -> int:
        """Bytes on the wire for ``numel`` elements of ``dtype``."""
        return numel * self.wire_dtype(dtype).itemsize

    def state_dict(self) -> dict[str, Any]:
        """What it carries from step to step (nothing, but for PowerSGD)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict`."""
        return None


class Cast(Codec):
    """Floating-point buffers travel as a 16-bit float type; other dtypes, and buffers already
    that narrow, travel as they are."""

    dtype: ClassVar[torch.dtype] = torch.float16

    @property
    def compresses(self) -> bool:
        return True

    def wire_dtype(self, dtype: torch.dtype) -> torch.dtype:
        if dtype.is_floating_point and dtype.itemsize > self.dtype.itemsize:
            return self.dtype
        return dtype

    def compress(self, flat: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        want = self.wire_dtype(flat.dtype)
        if want == flat.dtype:
            return flat
        if out is None:
            return flat.to(want)
        return out.copy_(flat)


class Fp16(Cast):
    """IEEE half precision: 11 significant bits (relative rounding error 2^-11), values from
    6.0e-8 (subnormal) to 65504; smaller ones lose digits or vanish, larger ones overflow."""

    name = "fp16"
    dtype = torch.float16

    def range_safe(self) -> Codec:
        safe = Bf16()
        safe.tally = self.tally
        return safe


class Bf16(Cast):
    """bfloat16: 8 significant bits (relative rounding error 2^-8) over float32's range."""

    name = "bf16"
    dtype = torch.bfloat16


def unit_roundoff(dtype: torch.dtype) -> float:
    """Half the distance from 1 to the next number of ``dtype``: the relative error of one
    rounding to nearest (2^-11 for float16, 2^-8 for bfloat16)."""
    return float(torch.finfo(dtype).eps) / 2


def smallest_step(dtype: torch.dtype) -> float:
    """Half the smallest subnormal number of ``dtype``: the absolute error of one rounding of
    a value near zero (2^-25 for float16)."""
    info = torch.finfo(dtype)
    return float(info.smallest_normal) * float(info.eps) / 2


def cast_error_bound(parts: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A bound on the error of summing ``parts`` over ranks in ``dtype`` (each rank's part
    rounded once, each of the ``N - 1`` partial sums rounded once), elementwise.

    Every rounding errs by at most ``u * |value| + s`` (``u``: :func:`unit_roundoff`, ``s``:
    :func:`smallest_step`) and every value rounded is at most ``sum_k |part_k|`` (to first
    order), so the sum errs by at most ``(2N - 1) * (u * sum_k |part_k| + s)``.

    Args:
        parts: ``[N, ...]``, what each of the ``N`` ranks sends (weights applied).
        dtype: the wire's float type.

    Returns:
        ``parts.shape[1:]``, the bound for each element of the sum.
    """
    n = parts.shape[0]
    magnitude = parts.double().abs().sum(0)
    u, s = unit_roundoff(dtype), smallest_step(dtype)
    return (2 * n - 1) * (u * (1 + 2 * n * u) * magnitude + s)
