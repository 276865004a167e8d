"""Batch-size-weighted gradient averaging: the update equals the gradient of the global batch."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from hethpc import comm
from hethpc.batching.errors import WeightError
from hethpc.sync.averaging import average_gradients_


def weighted_gradient_allreduce(
    parameters: Iterable[torch.nn.Parameter],
    *,
    weight: float,
    group: comm.Group | None = None,
    check: bool = True,
    tolerance: float = 1e-6,
) -> None:
    """Replace each gradient by ``sum_k weight_k * grad_k`` over the ranks of ``group``.

    With ``weight = b_k / B`` and each rank's gradient the mean over its ``b_k`` samples, the
    result is the mean gradient over all ``B`` samples, whatever the split. Every gradient is
    scaled in place, then summed in one fused Horovod allreduce (``ReduceOp.SUM``; Horovod's
    ``prescale`` must be equal on all ranks, so it cannot carry a per-rank weight).
    A parameter that requires a gradient but has none gets zeros first, so every rank reduces
    the same tensors.

    Args:
        parameters: the model's parameters (the same list, in the same order, on every rank).
        weight: this rank's share ``b_k / B`` of the global batch.
        group: the data-parallel ranks (default: the world).
        check: first allgather the weights (mpi4py, microseconds) and raise on every rank
            unless they are finite, >= 0 and sum to 1 within ``tolerance``.
        tolerance: allowed ``|sum(weights) - 1|``.

    Raises:
        WeightError: with ``check``, some rank's weight is invalid or they do not sum to 1.
    """
    params = [p for p in parameters if p.requires_grad]
    g = comm.world() if group is None else group
    w = float(weight)
    if check:
        ws = [float(v) for v in comm.allgather_object(w, group=g)]
        bad = [k for k, v in enumerate(ws) if not math.isfinite(v) or v < 0]
        total = math.fsum(ws) if not bad else math.nan
        if bad or abs(total - 1.0) > tolerance:
            raise WeightError(
                f"gradient weights must be finite, >= 0 and sum to 1 over the {len(ws)} rank(s); "
                f"got {ws} (sum {total}); pass weight=b_k/B with the sizes of the same step on "
                "every rank"
            )
    average_gradients_(params, weight=w, group=g, name="hethpc.weighted_grads")
