"""BSP: bulk-synchronous training, one fused gradient allreduce every step."""

from __future__ import annotations

import time

import torch

from hethpc import comm
from hethpc.sync.averaging import average_gradients_
from hethpc.sync.policy import Outcome, SyncPolicy


class BSP(SyncPolicy):
    """Average the gradients across ranks every step, then step: what
    ``hvd.DistributedOptimizer`` does, with one flat-buffer allreduce and ``b_k / B`` weights
    (the weight check inside it).

    Args:
        group: the ranks that synchronise together (default: the world).
        keep_records: keep every step's record.
        check_weights: check the weights every step (see :class:`SyncPolicy`).
    """

    name = "bsp"
    averages_models = False

    def _step(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        norm: float,
        weight: float | None,
    ) -> Outcome:
        t0 = time.perf_counter()
        # The weight check rides in the gradient allreduce: one collective per step.
        nbytes = average_gradients_(
            model.parameters(), weight=weight, group=self.group, check=self.check_weights
        )
        votes = comm.size() if self.group is None else self.group.size
        seconds = time.perf_counter() - t0
        optimizer.step()
        return Outcome(synced=True, votes=votes, sync_s=seconds, bytes=nbytes)
