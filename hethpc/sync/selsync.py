"""SelSync: a local step every step; synchronise only when some rank's gradient changed a lot."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, Literal

from hethpc.comm import Group
from hethpc.sync.agreement import Agreement, agree_step
from hethpc.sync.averaging import average_gradients_
from hethpc.sync.compression import Codec
from hethpc.sync.drift import DriftCorrection
from hethpc.sync.outer import OuterOptimizer
from hethpc.sync.policy import Outcome, StepInput, SyncPolicy
from hethpc.sync.significance import (
    DEFAULT_CRITERION,
    NORM_KINDS,
    Criterion,
    NormKind,
    Significance,
    SignificanceTracker,
)
from hethpc.sync.traits import Traits

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
        criterion: which relative change of the norm is compared with ``threshold``:
            ``"last_sync"`` (default: the smoothed norm against its value at the last sync),
            ``"window"``, ``"previous"`` (the literal step-to-step ``|S_t - S_(t-1)| / S_(t-1)``),
            ``"delta"``, ``"delta_mean"``; see :class:`SignificanceTracker`.
        max_local_steps: a staleness bound: synchronise anyway after this many local steps in
            a row (all ranks count the same steps, so they agree; 0 is BSP). None (default):
            no bound, the votes alone decide. Syncs are counted by why they came:
            :attr:`warmup_syncs` (the tracker's warm-up), :attr:`voted_syncs` (a rank found
            its step significant) and :attr:`forced_syncs` (only the bound asked).
        group: the ranks that synchronise together (default: the world).
        keep_records: keep every step's record.
        outer: an :class:`~hethpc.sync.outer.OuterOptimizer` stepping after every parameter
            average (significance-triggered DiLoCo); only with ``aggregation="params"``.
        drift: a :class:`~hethpc.sync.drift.DriftCorrection` for the local steps between
            parameter averages; only with ``aggregation="params"``.
        optimizer_state: average the optimizer's state (momentum) with the parameters; only
            with ``aggregation="params"`` (see :class:`~hethpc.sync.policy.SyncPolicy`).
        compression: how its averages travel (see :class:`~hethpc.sync.policy.SyncPolicy`).

    Raises:
        ValueError: a setting is out of range or unknown.
    """

    name = "selsync"
    settings = ("threshold", "window", "aggregation", "max_local_steps")
    trait_settings = ("aggregation",)
    decides_by_norm = True  # the class's other traits are those of aggregation "params"
    # the tracker follows the norm of this rank's gradients: other layers, another norm
    parameter_state = (*SyncPolicy.parameter_state, "tracker")

    @classmethod
    def traits(cls, *, aggregation: str = "params", **settings: Any) -> Traits:
        """With ``aggregation="grads"`` it averages gradients, and never parameters.

        Raises:
            ValueError: ``aggregation`` is unknown.
        """
        if aggregation not in AGGREGATIONS:
            raise ValueError(
                f"aggregation must be one of {list(AGGREGATIONS)}, got {aggregation!r}"
            )
        declared = super().traits(**settings)
        if aggregation == "params":
            return declared
        return replace(
            declared, averages_parameters=False, averages_while_training=False,
            averages_gradients=True, exchange="averages gradients",
        )  # fmt: skip

    def __init__(
        self,
        *,
        threshold: float = 0.3,
        window: int = 25,
        aggregation: Aggregation = "params",
        norm: NormKind = "global",
        criterion: Criterion = DEFAULT_CRITERION,
        max_local_steps: int | None = None,
        group: Group | None = None,
        keep_records: bool = True,
        outer: OuterOptimizer | None = None,
        drift: DriftCorrection | None = None,
        optimizer_state: bool = False,
        compression: Codec | str = "none",
    ) -> None:
        if aggregation not in AGGREGATIONS:
            raise ValueError(
                f"aggregation must be one of {list(AGGREGATIONS)}, got {aggregation!r}"
            )
        if norm not in NORM_KINDS:
            raise ValueError(f"norm must be one of {list(NORM_KINDS)}, got {norm!r}")
        if max_local_steps is not None and (
            isinstance(max_local_steps, bool)
            or int(max_local_steps) != max_local_steps
            or max_local_steps < 0
        ):
            raise ValueError(
                f"max_local_steps must be None or an integer >= 0, got {max_local_steps!r}"
            )
        optional = (
            ("an outer optimizer", outer),
            ("drift correction", drift),
            ("averaging the optimizer state", optimizer_state or None),
        )
        for what, given in optional:
            if given is not None and aggregation != "params":
                raise ValueError(
                    f"{what} works on averaged parameters: use aggregation 'params', "
                    f"not {aggregation!r}"
                )
        super().__init__(
            group=group, keep_records=keep_records, outer=outer, drift=drift,
            optimizer_state=optimizer_state, compression=compression,
        )  # fmt: skip
        self.tracker = SignificanceTracker(threshold=threshold, window=window, criterion=criterion)
        self.max_local_steps = None if max_local_steps is None else int(max_local_steps)
        self.warmup_syncs = 0  # syncs in the tracker's warm-up (every rank votes yes)
        self.voted_syncs = 0  # syncs after it that some rank voted for
        self.forced_syncs = 0  # syncs that only the staleness bound asked for
        self._local_run = 0  # local steps since the last sync (equal on every rank)
        self.aggregation: Aggregation = aggregation
        self.norm: NormKind = norm
        self._pending: tuple[Significance, int, float] | None = None  # from _decide

    @property
    def norm_kind(self) -> NormKind:
        return self.norm

    def _decide(self, norm: float, weight: float | None, finite: bool | None) -> Agreement:
        """Fold in the norm and vote, with the non-finite flag in the same allreduce; on a
        step some rank must skip, the tracker goes back to where it was."""
        before = self.tracker.state_dict() if finite is not None else None
        sig = self.tracker.update(norm)
        t0 = time.perf_counter()
        out = agree_step(sig.vote, weight, finite=finite is not False, group=self.group)
        if out.nonfinite and before is not None:
            self.tracker.load_state_dict(before)
        self._pending = (sig, out.votes, time.perf_counter() - t0)
        return out

    def _step(self, s: StepInput) -> Outcome:
        model, optimizer, weight = s.model, s.optimizer, s.weight
        assert self._pending is not None  # step() runs _decide first
        sig, votes, seconds = self._pending
        # Every rank counts the same local steps, so ``stale`` is the same everywhere.
        stale = self.max_local_steps is not None and self._local_run >= self.max_local_steps
        t0 = time.perf_counter()
        synced = votes > 0 or stale
        if synced:
            self.tracker.synced()
            self.forced_syncs += int(votes == 0)
            self.warmup_syncs += int(votes > 0 and sig.warmup)
            self.voted_syncs += int(votes > 0 and not sig.warmup)
            self._local_run = 0
        else:
            self._local_run += 1
        nbytes = 0
        if synced and self.aggregation == "grads":
            nbytes = average_gradients_(
                model.parameters(), weight=weight, group=self.group, codec=self.codec
            )
        seconds += time.perf_counter() - t0
        optimizer.step()
        averaged = synced and self.aggregation == "params"
        if averaged:
            t0 = time.perf_counter()
            nbytes = self._average_params(model, weight, optimizer)
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
        return {
            **super().state_dict(),
            "tracker": self.tracker.state_dict(),
            "max_local_steps": self.max_local_steps,
            "local_run": self._local_run,
            "forced_syncs": self.forced_syncs,
            "warmup_syncs": self.warmup_syncs,
            "voted_syncs": self.voted_syncs,
        }

    def summary_fields(self) -> dict[str, Any]:
        """Why its syncs came: the warm-up, a vote, or the staleness bound alone."""
        return {
            "warmup_syncs": self.warmup_syncs,
            "voted_syncs": self.voted_syncs,
            "forced_syncs": self.forced_syncs,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("max_local_steps") != self.max_local_steps:
            raise ValueError(
                f"SelSync state was saved with max_local_steps={state.get('max_local_steps')}, "
                f"but this policy has max_local_steps={self.max_local_steps}; build it with the "
                "saved setting"
            )
        super().load_state_dict(state)
        self.tracker.load_state_dict(state["tracker"])
        self._local_run = int(state["local_run"])
        self.forced_syncs = int(state["forced_syncs"])
        self.warmup_syncs = int(state.get("warmup_syncs", 0))  # absent before 2026-12-05
        self.voted_syncs = int(state.get("voted_syncs", 0))
