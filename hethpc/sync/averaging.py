"""The communicating part of every policy: the vote, and fused averages of models and gradients.

Votes go through one tiny mpi4py collective; tensors through ONE Horovod allreduce of a flat
buffer per synchronisation (per dtype), never one per tensor; a BSP step's weight check rides in
its gradient buffer, so it needs no control collective at all.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import numpy as np
import torch

from hethpc import comm
from hethpc.comm import Group, ReduceOp
from hethpc.sync.errors import SyncError

# Sums of b_k / B over ranks are compared with 1 to this tolerance.
WEIGHT_TOLERANCE = 1e-6


def _size(group: Group | None) -> int:
    return comm.size() if group is None else group.size


def check_weight(weight: float | None) -> bool:
    """Whether one rank's ``weight`` is usable on its own: None, or finite in ``(0, 1]``."""
    return weight is None or (math.isfinite(weight) and 0.0 < weight <= 1.0)


class Agreement(NamedTuple):
    """What the ranks agreed on in one step's control exchange (the same on every rank)."""

    votes: int  # ranks that voted to synchronise
    nonfinite: list[int]  # ranks whose loss or gradients were not finite (empty: none)


def agree(vote: bool, weight: float | None, *, group: Group | None = None) -> int:
    """Exchange votes and check the weights in one tiny allreduce; the same result on every rank.

    Args:
        vote: this rank's wish to synchronise now.
        weight: this rank's share of the global batch, ``b_k / B``; None for equal shares.
            Either every rank passes a weight or none does, and the weights sum to 1.
        group: the ranks that decide together (default: the world).

    Returns:
        The number of ranks that voted yes.

    Raises:
        SyncError: on every rank, when a weight is invalid, only some ranks pass one, or the
            weights do not sum to 1 (the message names the ranks and their weights).
    """
    return agree_step(vote, weight, group=group).votes


def agree_step(
    vote: bool, weight: float | None, *, finite: bool = True, group: Group | None = None
) -> Agreement:
    """:func:`agree`, with each rank's non-finite flag in the same allreduce.

    Args:
        vote: this rank's wish to synchronise now.
        weight: this rank's ``b_k / B`` (see :func:`agree`).
        finite: whether this rank's loss and gradients are finite.
        group: the ranks that decide together (default: the world).

    Returns:
        The votes, and the ranks whose values were not finite (gathered only when some were).

    Raises:
        SyncError: on every rank, as :func:`agree`.
    """
    row = np.array([float(vote), *_weight_row(weight), float(not finite)])
    # One Allreduce decides (this runs every step); only a failed check gathers every rank's
    # row, to name the culprits. The sums are the same on every rank, so all take one branch.
    sums = comm.allreduce_array(row, ReduceOp.SUM, group)
    bad_weights = _weights_wrong(sums[1:4], _size(group), WEIGHT_TOLERANCE)
    if not bad_weights and sums[4] == 0:
        return Agreement(int(round(sums[0])), [])
    table = comm.allgather_array(row, group)
    if bad_weights:
        raise SyncError(_weight_message(table[:, 1:4], WEIGHT_TOLERANCE))
    return Agreement(int(round(sums[0])), [int(r) for r in np.flatnonzero(table[:, 4])])


def _weight_row(weight: float | None) -> list[float]:
    """This rank's part of a weight check: ``[weight or 0, no weight, invalid weight]``."""
    ok = check_weight(weight)
    return [float(weight) if weight is not None and ok else 0.0, float(weight is None),
            float(not ok)]  # fmt: skip


def _weights_wrong(sums: Sequence[float] | np.ndarray, size: int, tolerance: float) -> bool:
    """Whether the summed :func:`_weight_row` of ``size`` ranks shows a problem."""
    some_without = 0 < sums[1] < size
    off_total = sums[1] == 0 and abs(sums[0] - 1.0) > tolerance
    return bool(sums[2] > 0 or some_without or off_total)


def _weight_message(table: np.ndarray, tolerance: float) -> str:
    """What is wrong with the ranks' weights, from every rank's :func:`_weight_row`."""
    fix = "pass weight = b_k / B on every rank, with sum(b_k) == B (or no weight on any rank)"
    bad = [r for r in range(len(table)) if table[r, 2]]
    if bad:
        return f"rank(s) {bad} passed a weight outside (0, 1] or non-finite; {fix}"
    without = [r for r in range(len(table)) if table[r, 1]]
    if without:
        return f"rank(s) {without} passed no weight while the others did; {fix}"
    total = float(table[:, 0].sum())
    shares = ", ".join(f"rank {r}: {w:.6g}" for r, w in enumerate(table[:, 0]))
    return f"weights sum to {total:.6g}, not 1 within {tolerance:.1g} ({shares}); {fix}"


def _reduce_(
    tensors: list[torch.Tensor], weight: float | None, group: Group | None, name: str
) -> None:
    if not tensors:
        return
    if _size(group) == 1:  # the sum over one rank: its own tensors, weighted
        if weight is not None and weight != 1.0:
            torch._foreach_mul_(tensors, weight)
        return
    if weight is None:
        comm.grouped_allreduce_(tensors, ReduceOp.AVERAGE, group=group, name=name)
        return
    # Horovod refuses prescale factors that differ between ranks, so each rank scales its own
    # tensors first and the allreduce only sums.
    torch._foreach_mul_(tensors, weight)
    comm.grouped_allreduce_(tensors, ReduceOp.SUM, group=group, name=name)


def payload_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the tensors' elements."""
    return sum(t.numel() * t.element_size() for t in tensors)


def average_model_(
    model: torch.nn.Module, *, weight: float | None = None, group: Group | None = None
) -> int:
    """Average parameters and buffers across ranks, in place: one fused allreduce.

    Floating-point parameters and buffers (BatchNorm's running statistics) are averaged,
    weighted by ``weight`` (``sum_k w_k x_k``) when given, plainly otherwise. Integer and
    boolean buffers (BatchNorm's ``num_batches_tracked``) take their maximum over ranks, through
    one small mpi4py allreduce. Every rank must call it, with the same model structure.

    Args:
        model: the replica to average; its tensors are overwritten.
        weight: this rank's ``b_k / B`` (checked beforehand by :func:`agree`), or None.
        group: the ranks that average together (default: the world).

    Returns:
        The payload bytes this rank put into the float allreduce.
    """
    floats = [p.data for p in model.parameters()]
    floats += [b for b in model.buffers() if b.is_floating_point()]
    _reduce_(floats, weight, group, "hethpc.sync.model")
    _max_int_buffers_(model, group)
    return payload_bytes(floats)


def average_buffers_(
    model: torch.nn.Module, *, weight: float | None = None, group: Group | None = None
) -> int:
    """:func:`average_model_` for the buffers only (the parameters are left alone)."""
    floats = [b for b in model.buffers() if b.is_floating_point()]
    _reduce_(floats, weight, group, "hethpc.sync.buffers")
    _max_int_buffers_(model, group)
    return payload_bytes(floats)


def _max_int_buffers_(model: torch.nn.Module, group: Group | None) -> None:
    """Integer and boolean buffers take their maximum over ranks (one mpi4py allreduce)."""
    ints = [b for b in model.buffers() if not b.is_floating_point()]
    if ints and _size(group) > 1:
        flat = np.concatenate([b.detach().cpu().numpy().astype(np.int64).ravel() for b in ints])
        top = comm.allreduce_array(flat, ReduceOp.MAX, group)
        offset = 0
        for b in ints:
            n = b.numel()
            b.copy_(torch.from_numpy(top[offset : offset + n]).reshape(b.shape).to(b.dtype))
            offset += n


def average_gradients_(
    parameters: Iterable[torch.nn.Parameter],
    *,
    weight: float | None = None,
    group: Group | None = None,
    name: str = "hethpc.sync.grads",
    check: bool = False,
) -> int:
    """Average the gradients of ``parameters`` across ranks, in place: one allreduce.

    hethpc's one weighted gradient sum: BSP, dynamic batching
    (:func:`hethpc.batching.weighted_gradient_allreduce`) and pipeline replicas call it.

    Each gradient is copied, scaled by ``weight`` (``1 / N`` without one), into one flat
    buffer per dtype and device, which ONE Horovod allreduce sums; the parameters' ``.grad``
    then are views of that buffer (kept between calls of the same ``name`` and parameters, so
    a gradient accumulated in place is not copied again). A parameter that requires a gradient
    but has none contributes zeros (as ``hvd.DistributedOptimizer`` does), so every rank
    reduces the same elements. With ``weight = b_k / B`` the result is the gradient of the
    whole global batch.

    Args:
        parameters: the model's parameters, the same list in the same order on every rank.
        weight: this rank's ``b_k / B``; None: a plain average.
        group: the ranks that average (default: the world).
        name: the Horovod name of the collective (the same on every rank).
        check: also check the weights as :func:`agree` does, inside the same allreduce (three
            more elements, no extra collective; the sum is compared with 1 at the precision of
            the gradients' dtype).

    Returns:
        The payload bytes of the gradients this rank put into the allreduce.

    Raises:
        SyncError: with ``check``, on every rank, when the weights are inconsistent (the
            gradients are then left summed with the wrong weights: do not step).
    """
    params = [p for p in parameters if p.requires_grad]
    if not params:
        return 0
    n = _size(group)
    if n == 1:
        if check and _weights_wrong(_weight_row(weight), 1, WEIGHT_TOLERANCE):
            raise SyncError(_weight_message(np.array([_weight_row(weight)]), WEIGHT_TOLERANCE))
        grads = []
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
        if weight is not None and weight != 1.0:
            torch._foreach_mul_(grads, weight)
        return payload_bytes(grads)
    scale = (1.0 / n if weight is None else float(weight)) if check_weight(weight) else 0.0
    buffer = _gradient_buffer(name, params, extra=3 if check else 0)
    buffer.pack_(params, scale)
    tolerance = 0.0
    if check:
        row = buffer.extra
        row.copy_(torch.tensor(_weight_row(weight), dtype=row.dtype))
        tolerance = max(WEIGHT_TOLERANCE, 4 * n * torch.finfo(row.dtype).eps)
    for i, flat in enumerate(buffer.flats):
        comm.allreduce_(flat, ReduceOp.SUM, group=group, name=f"{name}.{i}")
    if check and _weights_wrong(buffer.extra.tolist(), n, tolerance):
        table = comm.allgather_array(np.array(_weight_row(weight)), group)
        raise SyncError(_weight_message(table, tolerance))
    return buffer.nbytes


class _GradientBuffer:
    """Flat buffers (one per dtype and device) whose slices are the parameters' gradients."""

    def __init__(self, params: list[torch.nn.Parameter], extra: int) -> None:
        kinds: dict[tuple[torch.dtype, torch.device], list[int]] = {}
        for i, p in enumerate(params):
            kinds.setdefault((p.dtype, p.device), []).append(i)
        # The weight check rides in the widest floating buffer.
        widest = max(kinds, key=lambda k: torch.finfo(k[0]).bits if k[0].is_floating_point
                     else 0)  # fmt: skip
        self.flats: list[torch.Tensor] = []
        self.views: list[torch.Tensor] = [torch.empty(0)] * len(params)
        self.extra = torch.empty(0)
        self.nbytes = 0
        for key, members in kinds.items():
            numel = sum(params[i].numel() for i in members)
            more = extra if key == widest else 0
            flat = torch.empty(numel + more, dtype=key[0], device=key[1])
            offset = 0
            for i in members:
                k = params[i].numel()
                self.views[i] = flat[offset : offset + k].view_as(params[i])
                offset += k
            if more:
                self.extra = flat[numel:]
            self.flats.append(flat)
            self.nbytes += numel * flat.element_size()

    def pack_(self, params: list[torch.nn.Parameter], scale: float) -> None:
        """Put ``scale * grad`` of each parameter into its slice and make ``.grad`` that slice."""
        for p, view in zip(params, self.views, strict=True):
            put_scaled_grad_(p, view, scale)


def put_scaled_grad_(p: torch.nn.Parameter, view: torch.Tensor, scale: float) -> None:
    """Make ``p.grad`` the slice ``view`` of a flat buffer, holding ``scale`` times the
    gradient (zeros without one); a gradient accumulated in place into ``view`` is scaled
    there, not copied."""
    g = p.grad
    if g is None:
        view.zero_()
    elif g.data_ptr() == view.data_ptr() and g.shape == view.shape:
        if scale != 1.0:
            view.mul_(scale)
        return
    elif scale == 1.0:
        view.copy_(g)
    else:
        torch.mul(g, scale, out=view)
    p.grad = view


# Gradient buffers by collective name and parameters, most recent last (a few per job).
_buffers: OrderedDict[tuple[str, int, tuple[int, ...]], _GradientBuffer] = OrderedDict()
_MAX_BUFFERS = 8


def _gradient_buffer(name: str, params: list[torch.nn.Parameter], extra: int) -> _GradientBuffer:
    key = (name, extra, tuple(id(p) for p in params))
    buf = _buffers.get(key)
    if buf is None or any(
        v.shape != p.shape or v.dtype != p.dtype or v.device != p.device
        for v, p in zip(buf.views, params, strict=True)
    ):
        buf = _buffers[key] = _GradientBuffer(params, extra)
        while len(_buffers) > _MAX_BUFFERS:
            _buffers.popitem(last=False)
    _buffers.move_to_end(key)
    return buf


def gradient_bytes(parameters: Iterable[torch.nn.Parameter]) -> int:
    """What one BSP gradient allreduce of ``parameters`` carries, in bytes."""
    return payload_bytes(p for p in parameters if p.requires_grad)
