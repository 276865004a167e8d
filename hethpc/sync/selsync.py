"""SelSync: a local step every step; synchronise only when some rank's gradient changed a lot."""

from __future__ import annotations

import time
from typing import Any, Literal

import torch

from hethpc.comm import Group
from hethpc.sync.averaging import agree, average_gradients_, average_model_
from hethpc.sync.policy import Outcome, SyncPolicy
from hethpc.sync.significance import NORM_KINDS, NormKind, SignificanceTracker, Smoothing

Aggregation = Literal["params", "grads"]
AGGREGATIONS: tuple[str, ...] = ("params", "grads")


class SelSync(SyncPolicy):
    """Selective synchronisation (Tyagi & Swany, CLUSTER 2023).

    Each step every rank folds its local gradient norm into a :class:`SignificanceTracker` and
    votes; the votes meet in one tiny mpi4py collective, and if ANY rank voted yes, every rank
    synchronises. ``aggregation="params"`` (default, better in the paper): take the local step,
    then average parameters and buffers (one fused allreduce). ``aggregation="grads"``: average
    the gradients, then step (replicas that already differ keep differing). Otherwise the step
    stays local.

    Args:
        threshold: relative change of the smoothed norm that makes a rank vote yes; default 0.3.
            0 synchronises every step.
        window: EWMA span and warm-up length in steps; default 25.
        aggregation: ``"params"`` or ``"grads"``; default ``"params"``.
        norm: ``"global"`` (L2 norm of all gradients) or ``"layer_sum"`` (sum of per-tensor
            norms, as the published code); default ``"global"``.
        smoothing: ``"norm"`` (default: delta of the smoothed norm, as specified) or
            ``"delta"`` (smoothed delta of the raw norms, as the published code); see
            :class:`SignificanceTracker`.
        group: the ranks that synchronise together (default: the world).
        keep_records: keep every step's record.

    Raises:
        ValueError: a setting is out of range or unknown.
    """

    name = "selsync"

    def __init__(
        self,
        *,
        threshold: float = 0.3,
        window: int = 25,
        aggregation: Aggregation = "params",
        norm: NormKind = "global",
        smoothing: Smoothing = "norm",
        group: Group | None = None,
        keep_records: bool = True,
    ) -> None:
        if aggregation not in AGGREGATIONS:
            raise ValueError(
                f"aggregation must be one of {list(AGGREGATIONS)}, got {aggregation!r}"
            )
        if norm not in NORM_KINDS:
            raise ValueError(f"norm must be one of {list(NORM_KINDS)}, got {norm!r}")
        super().__init__(group=group, keep_records=keep_records)
        self.tracker = SignificanceTracker(threshold=threshold, window=window, smoothing=smoothing)
        self.aggregation: Aggregation = aggregation
        self.norm: NormKind = norm

    @property
    def norm_kind(self) -> NormKind:
        return self.norm

    def _step(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        norm: float,
        weight: float | None,
    ) -> Outcome:
        sig = self.tracker.update(norm)
        t0 = time.perf_counter()
        votes = agree(sig.vote, weight, group=self.group)
        synced = votes > 0
        nbytes = 0
        if synced and self.aggregation == "grads":
            nbytes = average_gradients_(model.parameters(), weight=weight, group=self.group)
        seconds = time.perf_counter() - t0
        optimizer.step()
        averaged = synced and self.aggregation == "params"
        if averaged:
            t0 = time.perf_counter()
            nbytes = average_model_(model, weight=weight, group=self.group)
            seconds += time.perf_counter() - t0
        return Outcome(
            synced=synced,
            votes=votes,
            smoothed_norm=sig.smoothed,
            delta=sig.delta,
            sync_s=seconds,
            bytes=nbytes,
            model_averaged=averaged,
        )

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "tracker": self.tracker.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.tracker.load_state_dict(state["tracker"])
