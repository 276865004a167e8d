"""The optimizer's state averaged across replicas while the next step computes.

A parameter average must be complete before the next forward pass reads the parameters; the
optimizer's state (SGD's momentum, Adam's moments) is read only by the next
``optimizer.step()``, after that step's forward and backward. So its average is started
asynchronously right after the parameters' and completed just before it is needed: on a slow
link the transfer overlaps a whole step of compute (under link emulation too: the emulated
time counts from the start). The result is the same as a blocking average, bit for bit.

With a compressing codec the state travels in a 16-bit type with float32's range (bf16, also
under fp16: Adam's second moments reach far below fp16's smallest normal number, and a
second moment rounded to zero makes its parameter's next update huge).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hethpc.comm import Group, ReduceOp, transfer_buffer
from hethpc.sync.compressed import PendingFlat, allreduce_flat_async_
from hethpc.sync.compression import Codec


class StateAverage:
    """At most one average of optimizer-state tensors in flight.

    Call :meth:`start` after a parameter average and :meth:`settle` before anything reads the
    tensors (the next ``optimizer.step()``, a checkpoint); every rank calls both at the same
    points, with the same tensors' shapes.

    Args:
        name: prefix of the collectives' names.
        codec: how the state travels (its :meth:`~hethpc.sync.compression.Codec.range_safe`
            form); None: as it is.
    """

    def __init__(
        self, name: str = "hethpc.sync.optimizer_state", codec: Codec | None = None
    ) -> None:
        self.name = name
        self.codec = (codec if codec is not None else Codec()).range_safe()
        self._pending: list[tuple[PendingFlat, list[torch.Tensor]]] = []
        # The flat copies, reused from one average to the next (the last one is settled first).
        self._flats: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}

    @property
    def in_flight(self) -> bool:
        """Whether an average was started and not settled."""
        return bool(self._pending)

    @torch.no_grad()
    def start(
        self, tensors: Sequence[torch.Tensor], weight: float | None, group: Group | None
    ) -> int:
        """Start averaging ``tensors`` (weighted by ``weight``, plainly without one): one
        allreduce of a flat copy per dtype and device. Settles any earlier average first.

        Returns:
            The payload bytes this rank puts into the allreduce.
        """
        self.settle()
        kinds: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
        for t in tensors:
            kinds.setdefault((t.dtype, t.device), []).append(t)
        nbytes = 0
        for i, (kind, same) in enumerate(kinds.items()):
            n = sum(t.numel() for t in same)
            flat = self._flats.get(kind)
            if flat is None or flat.numel() != n:
                flat = self._flats[kind] = transfer_buffer(n, *kind)
            torch.cat([t.reshape(-1) for t in same], out=flat)
            if weight is not None:
                flat.mul_(float(weight))
            op = ReduceOp.AVERAGE if weight is None else ReduceOp.SUM
            pending, sent = allreduce_flat_async_(
                flat, op, self.codec, group=group, name=f"{self.name}.{i}"
            )
            self._pending.append((pending, same))
            nbytes += sent
        return nbytes

    @torch.no_grad()
    def settle(self) -> None:
        """Wait for the average in flight, if any, and write it into its tensors."""
        pending, self._pending = self._pending, []
        for handle, tensors in pending:
            flat = handle.wait()
            offset = 0
            for t in tensors:
                n = t.numel()
                t.copy_(flat[offset : offset + n].view_as(t))
                offset += n
