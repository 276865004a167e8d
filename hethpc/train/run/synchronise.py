"""After a step's backward pass, on every rank: the sync policy steps the optimizer, or the
ranks skip a step whose loss or gradients hold NaN or Inf, alike where they must. The training
job's step (:class:`~hethpc.train.run.step.TrainStep`) and the user's own loop
(:class:`~hethpc.train.Coordinator`) both end their steps here."""

from __future__ import annotations

import torch
from torch import nn

from hethpc import comm
from hethpc.sync.policy import SyncPolicy
from hethpc.sync.records import SyncRecord
from hethpc.train.watch.guards import (
    AveragedGradientGuard,
    local_nonfinite,
    nonfinite_ranks,
    poison_if_nonfinite_,
)


def synchronise(
    policy: SyncPolicy,
    module: nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    loss: torch.Tensor | float | None,
    weight: float,
    compute_s: float,
    guard: AveragedGradientGuard | None = None,
) -> tuple[list[int], SyncRecord | None]:
    """Let the policy step, or skip where a rank's step is not finite (a collective).

    Args:
        policy: the run's sync policy, over ``module``'s replicas.
        module: this rank's parameters, their gradients computed.
        optimizer: over ``module``'s parameters.
        loss: this step's loss on this rank (None: this rank has none, a pipeline stage
            before the last).
        weight: this rank's share of the global batch.
        compute_s: this step's compute time, for the policy's records.
        guard: under data-parallel BSP, the check of the averaged gradient: a NaN or Inf
            travels in the allreduce and the guard skips the update on every rank alike, the
            ranks named (a vote) only when it trips. None: the ranks vote first.

    Returns:
        The ranks whose step was not finite (the caller skips the step: on every rank, or
        under an asynchronous policy on those alone) and the policy's record (None when the
        policy did not step).
    """
    params = list(module.parameters())
    if guard is not None:
        assert isinstance(loss, torch.Tensor), "the guard names the ranks by their loss"
        poison_if_nonfinite_(loss, [p.grad for p in params])
        record = policy.step(module, optimizer, weight=weight, compute_s=compute_s)
        if not guard.tripped:
            return [], record
        # a NaN gradient under a finite loss names them all
        bad = nonfinite_ranks(not bool(torch.isfinite(loss)))
        return bad or list(range(comm.size())), record
    mine_bad = local_nonfinite(loss if loss is not None else 0.0, (p.grad for p in params))
    if policy.asynchronous:  # no vote: each rank skips its own bad steps
        if mine_bad:
            policy.skip(module)
            return [comm.rank()], None
        return [], policy.step(module, optimizer, weight=weight, compute_s=compute_s)
    if policy.group is None:  # the world agrees inside the policy's vote
        record = policy.step(
            module, optimizer, weight=weight, compute_s=compute_s, finite=not mine_bad
        )
        return list(record.nonfinite), record
    bad = nonfinite_ranks(mine_bad)  # pipeline stages: every stage of every replica alike
    if bad:
        return bad, None
    return [], policy.step(module, optimizer, weight=weight, compute_s=compute_s)
