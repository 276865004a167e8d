"""BSP: bulk-synchronous training, one fused gradient allreduce every step."""

from __future__ import annotations

import time
from typing import Any

import torch

from hethpc import comm
from hethpc.sync.agreement import check_weight
from hethpc.sync.averaging import average_gradients_
from hethpc.sync.errors import SyncError
from hethpc.sync.overlap import DEFAULT_BUCKET_BYTES, GradientBuckets
from hethpc.sync.policy import Outcome, StepInput, SyncPolicy


class BSP(SyncPolicy):
    """Average the gradients across ranks every step, then step: what
    ``hvd.DistributedOptimizer`` does, with one flat-buffer allreduce and ``b_k / B`` weights
    (the weight check inside it).

    Args:
        group: the ranks that synchronise together (default: the world).
        keep_records: keep every step's record.
        check_weights: check the weights every step (see :class:`SyncPolicy`).
        overlap: allreduce the gradients in buckets while the backward pass runs
            (:class:`~hethpc.sync.overlap.GradientBuckets`); call :meth:`before_backward` with
            the step's weight before each ``loss.backward()``. Off (default): one allreduce
            after the backward pass (``docs/training-job.md`` compares the two).
        bucket_bytes: target bytes per bucket with ``overlap``.
        compression: how the gradients travel, weighted first (see :class:`SyncPolicy`);
            also ``"powersgd[:RANK]"`` (:mod:`~hethpc.sync.powersgd`; with ``overlap`` one
            round per bucket).
    """

    name = "bsp"
    settings = ("overlap",)
    averages_parameters = False
    averages_while_training = False
    averages_gradients = True
    keeps_replicas_equal = True
    separate_weight_check = True
    exchange = "averages gradients"
    compressions = ("none", "fp16", "bf16", "powersgd")

    def __init__(
        self,
        *,
        overlap: bool = False,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if int(bucket_bytes) < 1:
            raise ValueError(f"bucket_bytes must be >= 1, got {bucket_bytes!r}")
        self.overlap = bool(overlap)
        self.bucket_bytes = int(bucket_bytes)
        self._buckets: GradientBuckets | None = None
        self._prescaled: tuple[float | None] | None = None  # the weight loss_scale gave

    def before_backward(self, model: torch.nn.Module, *, weight: float | None = None) -> None:
        if not self.overlap:
            return
        if self._buckets is None:
            self._buckets = GradientBuckets(
                list(model.parameters()), group=self.group, bucket_bytes=self.bucket_bytes,
                check=self.check_weights, codec=self.codec,
            )  # fmt: skip
        self._buckets.arm(weight)

    def loss_scale(self, weight: float | None = None) -> float:
        """The step's gradient weight (``weight``, or ``1 / N``), when the gradients are averaged
        after the backward pass and no norm is recorded: the caller's scaled loss gives
        gradients already weighted, and the average skips its scaling pass over them (a pass
        over every gradient byte per step). 1.0 with ``overlap`` (its buckets scale as they
        go), with ``keep_records`` (the recorded norm is of the unscaled gradients) and for a
        weight outside ``(0, 1]`` (the check reports it)."""
        self._prescaled = None
        if self.overlap or self.keep_records or not check_weight(weight):
            return 1.0
        n = comm.size() if self.group is None else self.group.size
        self._prescaled = (weight,)
        return 1.0 / n if weight is None else float(weight)

    def _step(self, s: StepInput) -> Outcome:
        model, optimizer, weight = s.model, s.optimizer, s.weight
        t0 = time.perf_counter()
        if self._buckets is not None and self._buckets.armed:
            self._buckets.finish()  # most buckets are already summed
            nbytes = self._buckets.nbytes
        else:
            # The weight check rides in the gradient allreduce: one collective per step.
            asked, self._prescaled = self._prescaled, None
            prescaled = asked is not None
            if asked is not None and asked != (weight,):  # the loss was scaled by another weight
                raise SyncError(
                    f"BSP.step got weight={weight!r} but loss_scale was asked for "
                    f"weight={asked[0]!r}; pass the same weight to both"
                )
            nbytes = average_gradients_(
                model.parameters(), weight=weight, group=self.group, check=self.check_weights,
                prescaled=prescaled, codec=self.codec,
            )  # fmt: skip
        votes = comm.size() if self.group is None else self.group.size
        seconds = time.perf_counter() - t0
        optimizer.step()
        return Outcome(synced=True, votes=votes, sync_s=seconds, bytes=nbytes)

    def close(self) -> None:
        if self._buckets is not None:
            self._buckets.remove()
            self._buckets = None
