"""Fused averages of models and gradients: ONE Horovod allreduce of a flat buffer per dtype.

Never one collective per tensor; a BSP step's weight check rides in its gradient buffer, so it
needs no control collective at all (:mod:`~hethpc.sync.agreement` holds the check).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch

from hethpc import comm
from hethpc.comm import Group, ReduceOp
from hethpc.sync.agreement import (
    WEIGHT_TOLERANCE,
    agree,
    check_weight,
    group_size,
    weight_message,
    weight_row,
    weights_wrong,
)
from hethpc.sync.compressed import allreduce_flat_, average_tensors_
from hethpc.sync.compression import Codec
from hethpc.sync.errors import SyncError
from hethpc.sync.gradient_buffer import gradient_buffer
from hethpc.sync.powersgd import PowerSGD


def _reduce_(
    tensors: list[torch.Tensor], weight: float | None, group: Group | None, name: str
) -> None:
    if not tensors:
        return
    if group_size(group) == 1:  # the sum over one rank: its own tensors, weighted
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


def optimizer_state_tensors(
    optimizer: torch.optim.Optimizer, parameters: Iterable[torch.nn.Parameter]
) -> list[torch.Tensor]:
    """The optimizer's per-parameter floating-point state, parameter by parameter in the order
    given, each parameter's entries by name: SGD's ``momentum_buffer``, Adam's ``exp_avg`` and
    ``exp_avg_sq``. Entries that are not tensors of the parameter's shape (Adam's ``step``)
    are left out, as are parameters without state (not stepped yet)."""
    out = []
    for p in parameters:
        state = optimizer.state.get(p, {})
        for key in sorted(state):
            v = state[key]
            if (
                key != "step"
                and isinstance(v, torch.Tensor)
                and v.is_floating_point()
                and v.shape == p.shape
            ):
                out.append(v)
    return out


def average_model_(
    model: torch.nn.Module,
    *,
    weight: float | None = None,
    group: Group | None = None,
    codec: Codec | None = None,
    reference: list[torch.Tensor] | None = None,
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
        codec: how the floats travel (:mod:`~hethpc.sync.compression`); None: as they are.
        reference: with a compressing ``codec``, the parameters at the last average (the
            same on every rank): each parameter's difference from it travels, so the error
            is relative to how far the replicas moved (for DiLoCo, the pseudo-gradient).

    Returns:
        The bytes this rank put into the float allreduce.
    """
    floats = [p.data for p in model.parameters()]
    floats += [b for b in model.buffers() if b.is_floating_point()]
    if codec is not None and codec.compresses:
        nbytes = average_tensors_(
            floats, codec, weight=weight, group=group, name="hethpc.sync.model",
            references=reference or (),
        )  # fmt: skip
    else:
        _reduce_(floats, weight, group, "hethpc.sync.model")
        nbytes = payload_bytes(floats)
        if codec is not None:
            codec.tally.add(nbytes, nbytes)
    _max_int_buffers_(model, group)
    return nbytes


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
    if ints and group_size(group) > 1:
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
    prescaled: bool = False,
    codec: Codec | None = None,
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
        prescaled: the gradients already hold ``weight`` (or ``1 / N``) times themselves (the
            caller scaled the loss before the backward pass): they are summed as they are,
            without a scaling pass; ``weight`` is still checked with ``check``.
        codec: how the buffer travels (:mod:`~hethpc.sync.compression`); None: as it is. A
            compressing codec gets the weighted gradients (so the sum is the weighted sum up
            to its error), and the weight check then goes in a tiny exact allreduce of its own
            (:func:`agree`) instead of riding in the buffer, where 16 bits would blur a
            sample's share of a large batch. :class:`~hethpc.sync.powersgd.PowerSGD` sends
            low-rank factors in two allreduces.

    Returns:
        The bytes of the gradients this rank put on the wire (compressed, with a codec).

    Raises:
        SyncError: with ``check``, on every rank, when the weights are inconsistent (the
            gradients are then left summed with the wrong weights: do not step).
    """
    params = [p for p in parameters if p.requires_grad]
    if not params:
        return 0
    n = group_size(group)
    compressed = codec is not None and codec.compresses
    if n == 1:
        if check and weights_wrong(weight_row(weight), 1, WEIGHT_TOLERANCE):
            raise SyncError(weight_message(np.array([weight_row(weight)]), WEIGHT_TOLERANCE))
        grads = []
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
        if weight is not None and weight != 1.0 and not prescaled:
            torch._foreach_mul_(grads, weight)
        raw = payload_bytes(grads)
        if codec is None:
            return raw
        if isinstance(codec, PowerSGD):
            wire = codec.skip_(grads)
        else:
            wire = sum(codec.wire_bytes(g.numel(), g.dtype) for g in grads)
        codec.tally.add(raw, wire)
        return wire
    if check and compressed:
        agree(True, weight, group=group)  # exact, before anything is summed
    scale = (1.0 / n if weight is None else float(weight)) if check_weight(weight) else 0.0
    if prescaled:
        scale = 1.0 if check_weight(weight) else 0.0
    rides = check and not compressed
    buffer = gradient_buffer(name, params, extra=3 if rides else 0)
    buffer.pack_(params, scale)
    tolerance = 0.0
    if rides:
        row = buffer.extra
        row.copy_(torch.tensor(weight_row(weight), dtype=row.dtype))
        tolerance = max(WEIGHT_TOLERANCE, 4 * n * torch.finfo(row.dtype).eps)
    if isinstance(codec, PowerSGD):

        def allreduce(flat: torch.Tensor, part: str) -> None:
            comm.allreduce_(flat, ReduceOp.SUM, group=group, name=f"{name}.powersgd.{part}")

        wire = codec.reduce_(buffer.views, allreduce, n)
        codec.tally.add(buffer.nbytes, wire)
        return wire
    if codec is not None and compressed:
        return sum(
            allreduce_flat_(flat, ReduceOp.SUM, codec, group=group, name=f"{name}.{i}")
            for i, flat in enumerate(buffer.flats)
        )
    for i, flat in enumerate(buffer.flats):
        comm.allreduce_(flat, ReduceOp.SUM, group=group, name=f"{name}.{i}")
    if rides and weights_wrong(buffer.extra.tolist(), n, tolerance):
        table = comm.allgather_array(np.array(weight_row(weight)), group)
        raise SyncError(weight_message(table, tolerance))
    if codec is not None:
        codec.tally.add(buffer.nbytes, buffer.nbytes)
    return buffer.nbytes


def replicas_equal(tensors: Iterable[torch.Tensor], group: Group | None = None) -> bool:
    """Whether every rank holds the same ``tensors`` (a collective: one small allgather of
    each tensor's float64 sum and sum of squares). Bit-identical tensors give identical
    sums; replicas that differ anywhere almost surely do not. Sums of the same values on
    different devices may round apart: then False, the safe answer."""
    sums = [torch.stack((t.double().sum(), t.double().square().sum())) for t in tensors]
    mine = torch.cat(sums).cpu().numpy() if sums else np.zeros(0)  # one copy to the host
    rows = comm.allgather_array(mine, group)
    return bool((rows == rows[0]).all())


def gradient_bytes(parameters: Iterable[torch.nn.Parameter]) -> int:
    """What one BSP gradient allreduce of ``parameters`` carries, in bytes."""
    return payload_bytes(p for p in parameters if p.requires_grad)
