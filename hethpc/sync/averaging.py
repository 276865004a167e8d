"""The communicating part of every policy: the vote, and fused averages of models and gradients.

Votes go through one tiny mpi4py collective (microseconds); tensors through ONE fused Horovod
allreduce per synchronisation, never one per tensor.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

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
    row = np.array(
        [
            float(vote),
            float(weight) if weight is not None and check_weight(weight) else 0.0,
            float(weight is None),
            float(not check_weight(weight)),
        ]
    )
    # One Allreduce decides (this runs every step); only a failed check gathers every rank's
    # row, to name the culprits. The sums are the same on every rank, so all take one branch.
    sums = comm.allreduce_array(row, ReduceOp.SUM, group)
    votes = int(round(sums[0]))
    some_without = 0 < sums[2] < _size(group)
    off_total = sums[2] == 0 and abs(sums[1] - 1.0) > WEIGHT_TOLERANCE
    if not (sums[3] > 0 or some_without or off_total):
        return votes
    table = comm.allgather_array(row, group)
    fix = "pass weight = b_k / B on every rank, with sum(b_k) == B (or no weight on any rank)"
    bad = [r for r in range(len(table)) if table[r, 3]]
    if bad:
        raise SyncError(f"rank(s) {bad} passed a weight outside (0, 1] or non-finite; {fix}")
    without = [r for r in range(len(table)) if table[r, 2]]
    if 0 < len(without) < len(table):
        raise SyncError(f"rank(s) {without} passed no weight while the others did; {fix}")
    if not without:
        total = float(table[:, 1].sum())
        if abs(total - 1.0) > WEIGHT_TOLERANCE:
            shares = ", ".join(f"rank {r}: {w:.6g}" for r, w in enumerate(table[:, 1]))
            raise SyncError(f"weights sum to {total:.6g}, not 1 ({shares}); {fix}")
    return votes


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
) -> int:
    """Average the gradients of ``parameters`` across ranks, in place: one fused allreduce.

    hethpc's one weighted gradient sum: BSP, dynamic batching
    (:func:`hethpc.batching.weighted_gradient_allreduce`) and pipeline replicas call it.

    A parameter that requires a gradient but has none gets zeros first (as
    ``hvd.DistributedOptimizer`` does), so every rank contributes the same list of tensors.
    With ``weight = b_k / B`` each rank's mean gradient is scaled by it and the ranks sum: the
    result is the gradient of the whole global batch.

    Args:
        parameters: the model's parameters, the same list in the same order on every rank.
        weight: this rank's ``b_k / B``; None: a plain average.
        group: the ranks that average (default: the world).
        name: the Horovod name of the collective (the same on every rank).

    Returns:
        The payload bytes this rank put into the allreduce.
    """
    grads: list[torch.Tensor] = []
    for p in parameters:
        if not p.requires_grad:
            continue
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        grads.append(p.grad)
    _reduce_(grads, weight, group, name)
    return payload_bytes(grads)


def gradient_bytes(parameters: Iterable[torch.nn.Parameter]) -> int:
    """What one BSP gradient allreduce of ``parameters`` carries, in bytes."""
    return payload_bytes(p for p in parameters if p.requires_grad)
