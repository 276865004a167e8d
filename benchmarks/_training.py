"""The training step the benchmarks share: gradients of one batch, a sync policy's step, timing."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch import nn

from hethpc import comm
from hethpc.sync import SyncPolicy

Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def gradients(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    loss_fn: Loss = nn.functional.cross_entropy,
) -> torch.Tensor:
    """Zero ``opt``'s gradients, then forward and backward of ``loss_fn(model(x), y)``.

    Returns:
        The loss (a scalar tensor); this rank's local gradients are in ``.grad``.
    """
    opt.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    return loss


def policy_step(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    policy: SyncPolicy,
    x: torch.Tensor,
    y: torch.Tensor,
    loss_fn: Loss = nn.functional.cross_entropy,
) -> tuple[torch.Tensor, float]:
    """One data-parallel step: :func:`gradients` (timed), then ``policy.step`` (vote,
    communicate as the policy says, step the optimizer).

    Returns:
        The loss and the seconds of forward and backward.
    """
    t0 = time.perf_counter()
    loss = gradients(model, opt, x, y, loss_fn)
    compute_s = time.perf_counter() - t0
    policy.step(model, opt, compute_s=compute_s)
    return loss, compute_s


def timed_steps(
    opt: torch.optim.Optimizer,
    backward: Callable[[], object],
    steps: int,
    *,
    barrier: bool = False,
) -> list[float]:
    """Seconds of each of ``steps`` steps: ``opt.zero_grad()``, ``backward()`` (forward and
    backward of one batch), ``opt.step()``; each after a barrier when ``barrier`` (the ranks
    start together, as in training where the data arrives together). On a GPU each time ends
    after the device has finished the step's kernels."""
    params = [p for group in opt.param_groups for p in group["params"]]
    cuda = next((p.device for p in params if p.is_cuda), None)
    times = []
    for _ in range(steps):
        if barrier:
            comm.barrier()
        t0 = time.perf_counter()
        opt.zero_grad()
        backward()
        opt.step()
        if cuda is not None:
            torch.cuda.synchronize(cuda)
        times.append(time.perf_counter() - t0)
    return times
