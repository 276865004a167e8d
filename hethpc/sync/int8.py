"""int8 averages: one byte per value on the wire, a scale per chunk shared by the ranks, and the
rounding error fed back into the next average (as DiLoCo-family trainers send pseudo-gradients).

How one sum of ``N`` ranks' flat buffers travels:

1. each rank adds what its last int8 sum under the same name left out (error feedback);
2. the ranks agree on each chunk's scale: the largest magnitude of the chunk on any rank (one
   small MAX allreduce, one float per ``CHUNK`` values);
3. each rank rounds its values to integers in ``[-L, L]``, ``L = 127 // N`` levels of the
   shared scale, so that the sum of ``N`` of them still fits in an int8: the int8 buffers are
   summed by the ordinary allreduce (a quarter of float32's bytes);
4. the sum times ``scale / L`` is the result; what rounding took from this rank's values is
   kept for step 1.

With 2 ranks a value keeps 63 levels of its chunk's largest magnitude (about 6 bits), with 4
ranks 31. A value far below its chunk's largest goes to zero and waits in the feedback until
it adds up: fit for parameter changes and pseudo-gradients, not for an optimizer's second
moments (their average travels as bf16, :meth:`Int8.range_safe`). Plain functions, tested
without MPI; the allreduces are in :mod:`~hethpc.sync.compressed`.
"""

from __future__ import annotations

from typing import Any

import torch

from hethpc.sync.compression import Bf16, Codec

CHUNK = 1024  # values per shared scale (4 bytes of scale per 1 KiB of int8: 0.4 %)
MAX_RANKS = 127  # one level each at most: beyond it int8 cannot hold the sum


def levels(ranks: int) -> int:
    """The integer range ``[-L, L]`` each of ``ranks`` ranks rounds to, so that their sum fits
    in an int8.

    Raises:
        ValueError: more than :data:`MAX_RANKS` ranks.
    """
    if not 1 <= ranks <= MAX_RANKS:
        raise ValueError(
            f"int8 averages take 1 to {MAX_RANKS} ranks (the sum of their integers must fit "
            f"in an int8), got {ranks}; use compression bf16"
        )
    return 127 // ranks


def chunk_absmax(flat: torch.Tensor, chunk: int = CHUNK) -> torch.Tensor:
    """The largest magnitude of each ``chunk`` consecutive values of the 1-D ``flat`` (the last
    chunk may be shorter), as float32."""
    n = flat.numel()
    pad = (-n) % chunk
    padded = torch.nn.functional.pad(flat.detach().float().abs(), (0, pad))
    return padded.view(-1, chunk).amax(dim=1)


def _per_value(scales: torch.Tensor, numel: int, chunk: int) -> torch.Tensor:
    return scales.repeat_interleave(chunk)[:numel]


def quantize(
    flat: torch.Tensor, scales: torch.Tensor, level: int, chunk: int = CHUNK
) -> torch.Tensor:
    """``flat`` as int8 integers in ``[-level, level]`` of each chunk's ``scales`` (rounded to
    nearest); a chunk of scale 0 gives zeros."""
    step = _per_value(scales, flat.numel(), chunk) / level
    q = torch.where(step > 0, flat.float() / step.clamp_min(torch.finfo(torch.float32).tiny), 0.0)
    return q.round_().clamp_(-level, level).to(torch.int8)


def dequantize(
    q: torch.Tensor, scales: torch.Tensor, level: int, out: torch.Tensor, chunk: int = CHUNK
) -> torch.Tensor:
    """Write the values of the int8 ``q`` (a sum of integers, or one rank's) into ``out``."""
    step = _per_value(scales, q.numel(), chunk) / level
    return out.copy_(q.float() * step)


class Int8(Codec):
    """One byte per value: integers of a per-chunk scale shared by the ranks, with error
    feedback (the module's docstring says how). The feedback buffers are part of its state, so
    a resumed run sends what it would have sent."""

    name = "int8"
    chunk = CHUNK

    def __init__(self) -> None:
        super().__init__()
        self.residuals: dict[str, torch.Tensor] = {}

    @property
    def compresses(self) -> bool:
        return True

    def wire_dtype(self, dtype: torch.dtype) -> torch.dtype:
        return torch.int8 if dtype.is_floating_point else dtype

    def wire_bytes(self, numel: int, dtype: torch.dtype) -> int:
        """The int8 values and the shared scales (one float32 per chunk)."""
        if not dtype.is_floating_point:
            return numel * dtype.itemsize
        return numel + 4 * (-(-numel // self.chunk))

    def range_safe(self) -> Codec:
        safe = Bf16()
        safe.tally = self.tally
        return safe

    def feed_back(self, name: str, flat: torch.Tensor) -> torch.Tensor:
        """``flat`` plus what the last sum under ``name`` left out of this rank's values (in
        place; the buffer is started at zero, or again when the size or device changed)."""
        r = self.residuals.get(name)
        if r is None or r.numel() != flat.numel() or r.device != flat.device:
            r = self.residuals[name] = torch.zeros(flat.numel(), device=flat.device)
        return flat.add_(r.to(flat.dtype))

    def keep_error(
        self, name: str, sent: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, level: int
    ) -> None:
        """Keep ``sent`` minus what its integers ``q`` stand for, for the next sum under
        ``name``."""
        r = self.residuals[name]
        dequantize(q, scales, level, r, self.chunk)
        torch.sub(sent.float(), r, out=r)

    def state_dict(self) -> dict[str, Any]:
        return {"residuals": {k: v.cpu() for k, v in self.residuals.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.residuals = {k: v.clone() for k, v in (state.get("residuals") or {}).items()}
