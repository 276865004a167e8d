"""Gradient buckets allreduced during the backward pass, fired by per-parameter hooks."""

from __future__ import annotations

import numpy as np
import torch

from hethpc import comm
from hethpc.comm import Group, Pending, ReduceOp, transfer_buffer
from hethpc.sync.agreement import (
    WEIGHT_TOLERANCE,
    agree,
    check_weight,
    weight_message,
    weight_row,
    weights_wrong,
)
from hethpc.sync.compressed import PendingFlat, allreduce_flat_async_
from hethpc.sync.compression import Codec
from hethpc.sync.errors import SyncError
from hethpc.sync.gradient_buffer import put_scaled_grad_
from hethpc.sync.powersgd import PowerSGD, Round

# DDP's default bucket size; the first bucket (the last layers) fires as soon as it fills.
DEFAULT_BUCKET_BYTES = 25 * 2**20


class GradientBuckets:
    """The gradients of ``parameters`` as slices of one flat buffer, cut into buckets that are
    allreduced while the backward pass still runs (as ``hvd.DistributedOptimizer`` and DDP do).

    Parameters are laid out in reverse order (the order backward produces their gradients);
    a bucket starts its Horovod allreduce once every gradient in it has arrived and every
    earlier bucket has started, so all ranks start them in the same order. Each gradient is
    copied into its slice scaled by this rank's weight (``b_k / B``; ``1 / N`` without one), so
    the sum over ranks is the gradient of the global batch, exactly as
    :func:`~hethpc.sync.averaging.average_gradients_` computes it. The weight check rides in
    the last bucket.

    Use: :meth:`arm` with this step's weight before ``loss.backward()``, then :meth:`finish`
    after it (before ``optimizer.step()``). Unarmed, the hooks do nothing. One backward pass
    per armed step (gradient accumulation over several passes would send the first pass only:
    it raises instead).

    Args:
        parameters: the model's parameters (same list, same order on every rank); one dtype
            and device.
        group: the ranks that average (default: the world).
        bucket_bytes: target bytes per bucket.
        check: check the weights inside the last bucket (see ``average_gradients_``); with a
            compressing ``codec``, in a tiny exact allreduce of their own at :meth:`finish`.
        name: prefix of the Horovod operation names.
        codec: how each bucket travels (:mod:`~hethpc.sync.compression`), compressed from
            the weighted gradients; None: as it is. With
            :class:`~hethpc.sync.powersgd.PowerSGD` each bucket is one round of it: its first
            allreduce (``P`` and the uncompressed tensors) starts during the backward pass as
            the bucket fills, its second (``Q``) at :meth:`finish`, after every first one,
            all in flight at once (DDP's ``powerSGD_hook`` also runs one round per bucket).

    Raises:
        ValueError: the parameters mix dtypes or devices, or none needs a gradient.
    """

    def __init__(
        self,
        parameters: list[torch.nn.Parameter],
        *,
        group: Group | None = None,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        check: bool = True,
        name: str = "hethpc.sync.bucket",
        codec: Codec | None = None,
    ) -> None:
        params = [p for p in parameters if p.requires_grad][::-1]
        if not params:
            raise ValueError("no parameter requires a gradient")
        kinds = {(p.dtype, p.device) for p in params}
        if len(kinds) != 1:
            raise ValueError(
                f"overlapped buckets need one dtype and device, got {sorted(map(str, kinds))}; "
                "turn overlap off for mixed-precision models"
            )
        self.group, self.check, self.name = group, check, name
        self._ranks = comm.size() if group is None else group.size
        self.codec = codec if codec is not None else Codec()
        self.params = params
        n = sum(p.numel() for p in params)
        # Compressed, the check cannot ride exactly: it goes apart (see finish).
        extra = 3 if check and not self.codec.compresses else 0
        self.flat = transfer_buffer(n + extra, params[0].dtype, params[0].device)
        self.row = self.flat[n:]
        dtype = self.codec.wire_dtype(self.flat.dtype)
        # The compressed copy of each bucket, in the same place as the bucket in ``flat``.
        self.wire = (
            transfer_buffer(n, dtype, params[0].device) if dtype != self.flat.dtype else None
        )
        self.views: list[torch.Tensor] = []
        self.bucket_of: list[int] = []
        self.bounds: list[tuple[int, int]] = []  # element range of each bucket
        per = max(1, bucket_bytes // self.flat.element_size())
        offset, start = 0, 0
        for p in params:
            self.views.append(self.flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
            self.bucket_of.append(len(self.bounds))
            if offset - start >= per:
                self.bounds.append((start, offset))
                start = offset
        if start < offset or not self.bounds:
            self.bounds.append((start, offset))
        self.bounds[-1] = (self.bounds[-1][0], n + extra)  # the weight check rides last
        self.bucket_of = [min(b, len(self.bounds) - 1) for b in self.bucket_of]
        self._sizes = np.bincount(self.bucket_of, minlength=len(self.bounds))
        # each bucket's parameters, as indices into params (PowerSGD keys them from these)
        self._held = [
            [i for i, k in enumerate(self.bucket_of) if k == b] for b in range(len(self.bounds))
        ]
        self._index = {id(p): i for i, p in enumerate(params)}
        self._hooks = [p.register_post_accumulate_grad_hook(self._arrived) for p in params]
        self._armed = False
        self._scale = 1.0
        self._weight: float | None = None
        self._seen = np.zeros(len(params), dtype=bool)
        self._filled = np.zeros(len(self.bounds), dtype=np.int64)
        self._pending: list[Pending | PendingFlat] = []
        self._rounds: list[Round] = []  # PowerSGD's, one per bucket
        self._sent = 0  # PowerSGD's bytes at the last step

    @property
    def nbytes(self) -> int:
        """Bytes of the gradients on the wire (the weight check's elements excluded)."""
        if isinstance(self.codec, PowerSGD):
            return self._sent
        return self.codec.wire_bytes(sum(p.numel() for p in self.params), self.flat.dtype)

    def arm(self, weight: float | None) -> None:
        """Get ready for the next backward pass, with this rank's weight for this step."""
        if self._armed:  # the last step was skipped after its backward: let its sums land
            for pending in self._pending:
                pending.wait()
        n = comm.size() if self.group is None else self.group.size
        self._weight = weight
        share = 1.0 / n if weight is None else float(weight)
        self._scale = share if check_weight(weight) else 0.0
        self._seen[:] = False
        self._filled[:] = 0
        self._pending = []
        self._rounds = []
        self._armed = True

    @property
    def armed(self) -> bool:
        """Whether :meth:`arm` was called and :meth:`finish` not yet."""
        return self._armed

    def _arrived(self, p: torch.Tensor) -> None:
        if not self._armed:
            return
        i = self._index[id(p)]
        if self._seen[i]:
            self._armed = False
            raise SyncError(
                "a parameter's gradient arrived twice in one armed step (several backward "
                "passes accumulate into one step): overlapping the allreduce needs one backward "
                "per step; turn overlap off to accumulate"
            )
        self._seen[i] = True
        self._take(i)
        b = self.bucket_of[i]
        self._filled[b] += 1
        self._fire_ready()

    def _take(self, i: int) -> None:
        """Put this rank's scaled gradient of parameter ``i`` into its slice."""
        put_scaled_grad_(self.params[i], self.views[i], self._scale)

    def _fire_ready(self) -> None:
        # In order: bucket k starts only after buckets 0..k-1 (the same order on every rank);
        # the last one waits for finish(), which writes the weight check into it.
        while (
            len(self._pending) < len(self.bounds) - 1
            and self._filled[len(self._pending)] == self._sizes[len(self._pending)]
        ):
            self._fire(len(self._pending))

    def _fire(self, b: int) -> None:
        lo, hi = self.bounds[b]
        name = f"{self.name}.{b}"
        if isinstance(self.codec, PowerSGD) and self._ranks > 1:
            # keyed by the parameters' forward order, as without overlap
            held = self._held[b]
            keys = [len(self.params) - 1 - i for i in held]
            round_ = self.codec.begin_([self.views[i] for i in held], keys)
            self._rounds.append(round_)
            self._pending.append(
                comm.allreduce_async_(
                    round_.first, ReduceOp.SUM, group=self.group, name=f"{name}.powersgd.first"
                )
            )
            return
        if not self.codec.compresses:
            pending = comm.allreduce_async_(
                self.flat[lo:hi], ReduceOp.SUM, group=self.group, name=name
            )
            self._pending.append(pending)
            return
        wire = None if self.wire is None else self.wire[lo:hi]
        flat_pending, _ = allreduce_flat_async_(
            self.flat[lo:hi], ReduceOp.SUM, self.codec, group=self.group, name=name, wire=wire
        )
        self._pending.append(flat_pending)

    def finish(self) -> None:
        """Send what the hooks did not (parameters without a gradient, the last bucket), wait
        for every bucket, and check the weights.

        Raises:
            SyncError: on every rank, when the weights are inconsistent (with ``check``).
        """
        if not self._armed:
            raise SyncError("GradientBuckets.finish() without arm() before the backward pass")
        for i in np.flatnonzero(~self._seen):
            self._seen[i] = True
            self._take(int(i))
            self._filled[self.bucket_of[i]] += 1
        self._fire_ready()
        rides = self.check and not self.codec.compresses
        if rides:
            self.row.copy_(torch.tensor(weight_row(self._weight), dtype=self.row.dtype))
        self._fire(len(self.bounds) - 1)
        for pending in self._pending:
            pending.wait()
        if isinstance(self.codec, PowerSGD):
            self._second_rounds(self.codec)  # (one rank: only counts what it would send)
        self._armed = False
        if not self.codec.compresses:  # a compressing codec counted each bucket
            self.codec.tally.add(self.nbytes, self.nbytes)
        elif self.check:
            agree(True, self._weight, group=self.group)  # exact, apart from the buckets
        if rides:
            n = comm.size() if self.group is None else self.group.size
            tolerance = max(WEIGHT_TOLERANCE, 4 * n * torch.finfo(self.row.dtype).eps)
            if weights_wrong(self.row.tolist(), n, tolerance):
                table = comm.allgather_array(np.array(weight_row(self._weight)), self.group)
                raise SyncError(weight_message(table, tolerance))

    def _second_rounds(self, codec: PowerSGD) -> None:
        """PowerSGD's second allreduces (every bucket's ``Q``, in flight together), then each
        bucket's projection; the step counted once."""
        n = self._ranks
        raw = sum(p.numel() for p in self.params) * self.flat.element_size()
        if n == 1:  # nothing to send: the gradients stay, as without overlap
            self._sent = codec.skip_(self.views)
            codec.tally.add(raw, self._sent)
            return
        seconds = []
        for b, round_ in enumerate(self._rounds):
            second = codec.middle_(round_)
            if second is not None:
                name = f"{self.name}.{b}.powersgd.second"
                seconds.append(comm.allreduce_async_(second, ReduceOp.SUM, group=self.group,
                                                     name=name))  # fmt: skip
        for pending in seconds:
            pending.wait()
        for round_ in self._rounds:
            codec.end_(round_, n)
        codec.advance()
        self._sent = sum(r.nbytes for r in self._rounds)
        codec.tally.add(raw, self._sent)

    def remove(self) -> None:
        """Detach the hooks."""
        for h in self._hooks:
            h.remove()
        self._hooks = []
