"""The data-parallel step engine: every rank holds the whole model and computes its own share
of each global batch, in one pass or in micro-batches whose gradients sum to the batch's."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from hethpc import comm
from hethpc.comm import Group
from hethpc.data import ArrayDataset
from hethpc.train.evaluation import Metric, evaluate_all
from hethpc.train.parts.device import describe_device, run_facts, this_device

Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class DataParallel:
    """Every rank holds the whole model and takes its own share of each global batch."""

    def __init__(self, model: nn.Module, device: torch.device | None = None) -> None:
        self.device = device if device is not None else this_device("auto", comm.local_rank())
        self.module = model.to(self.device)
        self.group: Group | None = None  # the world
        self.replica, self.replicas = comm.rank(), comm.size()
        self.replica_leaders = list(range(comm.size()))  # a world rank of each replica
        self.loss_rank = 0  # the rank whose losses the summary reports
        self.collective_eval = False
        self.saves_own_state = False  # replicas equal under BSP: rank 0's state stands for all
        self.min_batch = 1
        # Zero gradients in place instead of dropping them: backward then accumulates into the
        # sync policy's flat buffer (no fresh allocation, no copy into it). Only where a
        # missing gradient counts as zeros anyway (BSP); elsewhere an unused parameter must
        # keep None, so that the optimizer leaves it alone.
        self.zero_in_place = False
        self.takes_loss_scale = True  # compute() scales the loss by the policy's weight
        self.balance: tuple[int, ...] | None = None  # the whole model on every rank

    def adopt_checkpoint(
        self, state: dict[str, Any], make_optimizer: Callable[[nn.Module], torch.optim.Optimizer]
    ) -> str:
        """Nothing to fit: every rank holds the whole model (the world size is handled by the
        checkpoint's restore)."""
        return ""

    def describe(self) -> str:
        return f"{comm.size()} rank(s), data-parallel on {describe_device(self.device)}"

    def step_time(self, seconds: float) -> float:
        """This replica's compute time for the batch controller: this rank's own."""
        return seconds

    def control_time(self, own_s: float, compute_s: float) -> float:
        """The time the batch controller follows: on a CPU, the forward and backward's CPU
        time at the CPU share the rank gets (:class:`~hethpc.batching.busy.CpuShare`, which sees a
        CPU quota's stalls wherever they fall); on a GPU the timed compute."""
        return compute_s if self.device.type == "cuda" else own_s

    def compute(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        loss_fn: Loss,
        poison: Callable[[Any], Any],
        *,
        loss_scale: float = 1.0,
        pieces: int = 1,
        before_backward: Callable[[], None] | None = None,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Forward and backward of ``loss_scale`` times the loss (the policy's weight, see
        :meth:`~hethpc.sync.SyncPolicy.loss_scale`); ``(loss, output)``, the loss unscaled;
        gradients on :attr:`module`.

        With ``pieces > 1`` the batch is computed in that many micro-batches of nearly equal
        size (:func:`micro_batches`), each one's loss weighted by its share of the rows, so
        the summed gradient is that of the whole batch; the loss returned is their weighted
        mean, the output their outputs joined. ``before_backward`` is called before the
        (last) backward pass: where a policy's hooks send the gradients as it runs, they
        then see the sum.
        """
        x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
        if pieces > 1 and len(y) > 1:
            return self._accumulate(x, y, loss_fn, poison, loss_scale, pieces, before_backward)
        out = self.module(x)
        loss = poison(loss_fn(out, y))
        self._zero_grads()
        if before_backward is not None:
            before_backward()
        (loss * loss_scale if loss_scale != 1.0 else loss).backward()
        return loss, out

    def _accumulate(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        loss_fn: Loss,
        poison: Callable[[Any], Any],
        loss_scale: float,
        pieces: int,
        before_backward: Callable[[], None] | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`compute` in ``pieces`` micro-batches, gradients summed by their rows."""
        self._zero_grads()
        bounds = micro_batches(len(y), pieces)
        losses, outs = [], []
        for i, (lo, hi) in enumerate(bounds):
            share = (hi - lo) / len(y)
            out = self.module(x[lo:hi])
            loss = poison(loss_fn(out, y[lo:hi]))
            if before_backward is not None and i == len(bounds) - 1:
                before_backward()
            (loss * (loss_scale * share)).backward()
            losses.append(loss.detach() * share)
            outs.append(out.detach())
        return torch.stack(losses).sum(), torch.cat(outs)

    def _zero_grads(self) -> None:
        zero = []
        for p in self.module.parameters():
            if self.zero_in_place and p.grad is not None:
                zero.append(p.grad)
            else:
                p.grad = None
        if zero:
            torch._foreach_zero_(zero)  # one call for every gradient (a dispatch per tensor)

    def step_fields(self) -> dict[str, Any]:
        return {}

    def summary_fields(self) -> dict[str, Any]:
        return run_facts(self.device)

    def evaluate(
        self, data: ArrayDataset, metrics: Sequence[Metric], *, tick: Any = None
    ) -> list[float]:
        """Each of ``metrics`` over all of ``data`` on this rank alone."""
        return evaluate_all(self.module, data, metrics, tick=tick)


def micro_batches(rows: int, pieces: int) -> list[tuple[int, int]]:
    """The ``(start, stop)`` rows of ``pieces`` micro-batches of nearly equal size over
    ``rows`` rows (sizes differ by at most one, the larger first); fewer when ``rows <
    pieces``, none empty (one empty piece for no rows)."""
    n = max(1, min(pieces, rows))
    base, extra = divmod(rows, n)
    sizes = [base + (i < extra) for i in range(n)]
    starts = [sum(sizes[:i]) for i in range(n)]
    return [(a, a + k) for a, k in zip(starts, sizes, strict=True)]
