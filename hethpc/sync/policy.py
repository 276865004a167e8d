"""The abstract sync policy: a local optimizer step plus a rule for when and what to average.

One class: the template step every policy shares, with the counters, summary
and resumable state it keeps; the communication is in ``agreement`` and ``averaging``.
"""

from __future__ import annotations

import abc
import math
import time
from dataclasses import dataclass, fields
from typing import Any, ClassVar

import torch

from hethpc import comm
from hethpc.comm import Group
from hethpc.sync.agreement import Agreement, agree, agree_step
from hethpc.sync.averaging import (
    average_model_,
    gradient_bytes,
    optimizer_state_tensors,
    replicas_equal,
)
from hethpc.sync.codecs import parse_compression
from hethpc.sync.compression import Codec
from hethpc.sync.drift import DriftCorrection
from hethpc.sync.errors import SyncError
from hethpc.sync.outer import OuterOptimizer
from hethpc.sync.records import SyncRecord, SyncSummary
from hethpc.sync.significance import NormKind, gradient_norm
from hethpc.sync.state_average import StateAverage
from hethpc.sync.traits import Traits


@dataclass(frozen=True)
class StepInput:
    """What a policy's :meth:`SyncPolicy._step` works on: the replica with this step's local
    gradients, its optimizer, the local gradient norm and this rank's weight (None: equal)."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    norm: float
    weight: float | None


@dataclass(frozen=True)
class Outcome:
    """What a policy's :meth:`SyncPolicy._step` did (the base class adds the bookkeeping)."""

    synced: bool
    votes: int = 0
    smoothed_norm: float = math.nan
    delta: float = math.nan
    sync_s: float = 0.0
    bytes: int = 0
    model_averaged: bool = False


class SyncPolicy(abc.ABC):
    """When to synchronise data-parallel replicas, and how; it also takes the optimizer step.

    Use a plain optimizer (never ``hvd.DistributedOptimizer``): after ``loss.backward()`` call
    :meth:`step` on every rank, every step. It communicates through :mod:`hethpc.comm` only
    (the same collectives in the same order on every rank) and returns a :class:`SyncRecord`.
    Before evaluating, call :meth:`finish` so the replicas agree.

    Args:
        group: the ranks that synchronise together (default: the world).
        keep_records: keep every step's record in :attr:`records` (small; disable for very
            long runs). Without records, policies that do not decide by the gradient norm skip
            computing it (a pass over the gradients), and the records they return hold ``nan``.
        check_weights: check every step, in one tiny allreduce, that the ranks' weights are
            consistent. Turn it off only when the caller guarantees it (weights computed from
            a batch-size vector the ranks already agreed on, as ``hethpc.train`` does): a step
            on which every rank votes yes (BSP) then needs no control collective at all.
        outer: an :class:`OuterOptimizer` applied after every parameter average (DiLoCo's
            outer step); None (default): plain averaging. Only for policies that average
            parameters (not BSP, not SelSync with ``aggregation="grads"``).
        drift: a :class:`~hethpc.sync.drift.DriftCorrection`: between averages each replica
            adds, per step, how much less than the average it moved in the last round (for
            label-skewed data); None (default): none. Only for policies that average
            parameters.
        optimizer_state: average the optimizer's per-parameter state (SGD's momentum, Adam's
            moments) at every parameter average, so that the replicas also share the momentum
            that each built on its own data (label-skewed replicas otherwise keep pulling
            toward their own labels); twice the bytes with SGD momentum, three times with Adam.
            The state's allreduce runs while the next step computes and completes before its
            ``optimizer.step()`` (:mod:`~hethpc.sync.state_average`); :meth:`settle` completes
            it earlier. Only for policies that average parameters.
        compression: how its averages travel: a :class:`~hethpc.sync.compression.Codec` or
            its name (``"none"``, ``"fp16"``, ``"bf16"``, ``"powersgd:4"``; those in
            :attr:`compressions`).
            Gradients are weighted before compressing; parameters travel as their difference
            from the last average (the outer optimizer's start point, for DiLoCo: the
            pseudo-gradient), which this policy then keeps (a copy of the parameters; before
            the first average, the start, when the replicas start equal; else that average
            travels uncompressed); the optimizer's
            state in bf16 (see :mod:`~hethpc.sync.state_average`). Every rank must use the
            same. The summary's ``bytes`` count what went on the wire.
    """

    name: ClassVar[str] = ""
    # The keywords of its own that a caller fills from a run's configuration, and those of
    # them that change its traits (see :meth:`traits`).
    settings: ClassVar[tuple[str, ...]] = ()
    trait_settings: ClassVar[tuple[str, ...]] = ()
    # Its traits, each documented in :class:`~hethpc.sync.traits.Traits`.
    averages_parameters: ClassVar[bool] = True
    averages_while_training: ClassVar[bool] = True
    averages_gradients: ClassVar[bool] = False
    keeps_replicas_equal: ClassVar[bool] = False
    asynchronous: ClassVar[bool] = False
    decides_by_norm: ClassVar[bool] = False
    accepts_inner_steps: ClassVar[bool] = False
    separate_weight_check: ClassVar[bool] = False
    exchange: ClassVar[str] = "averages parameters"
    # The compressions (names in hethpc.sync.codecs.COMPRESSIONS) it can send with.
    compressions: ClassVar[tuple[str, ...]] = ("none", "fp16", "bf16", "int8")
    #: the :meth:`state_dict` entries that belong to the parameters this rank holds (see
    #: :meth:`for_other_parameters`)
    parameter_state: ClassVar[tuple[str, ...]] = ("drift", "codec", "reference")

    def __init__(
        self,
        *,
        group: Group | None = None,
        keep_records: bool = True,
        check_weights: bool = True,
        outer: OuterOptimizer | None = None,
        drift: DriftCorrection | None = None,
        optimizer_state: bool = False,
        compression: Codec | str = "none",
    ) -> None:
        codec = parse_compression(compression) if isinstance(compression, str) else compression
        if codec.name not in self.compressions:
            raise ValueError(
                f"compression {codec.spec()!r} is not built for sync {self.name!r}; it takes "
                f"{list(self.compressions)}"
            )
        optional = (
            ("an outer optimizer", outer),
            ("drift correction", drift),
            ("averaging the optimizer state", optimizer_state or None),
        )
        for what, given in optional:
            if given is not None and not self.averages_parameters:
                raise ValueError(
                    f"{what} needs a policy that averages parameters (fedavg, local, "
                    f"selsync with aggregation 'params'), not {self.name!r}"
                )
        if optimizer_state and not self.averages_while_training:
            raise ValueError(
                "averaging the optimizer state needs a policy that averages parameters during "
                f"training (fedavg, selsync with aggregation 'params'), not {self.name!r}"
            )
        self.outer = outer
        self.drift = drift
        self.optimizer_state = bool(optimizer_state)
        self.codec = codec
        self._state_average = StateAverage(codec=codec) if optimizer_state else None
        # Compressed parameter averages send the difference from this: the parameters at the
        # last average (the same on every rank); the outer optimizer's start point has it.
        self._reference: list[torch.Tensor] | None = None
        self.group = group
        self.keep_records = keep_records
        self.check_weights = check_weights
        self.records: list[SyncRecord] = []
        self._step_count = 0
        self._synced = 0
        self._bytes = 0
        self._bsp_bytes = 0
        self._grad_bytes: int | None = None  # what one BSP allreduce of the model carries
        self._sync_s = 0.0
        self._diverged = False  # replicas may differ: a local step since the last model average
        self._last_weight: float | None = None
        # Shares b_k / B summed over the steps since the last parameter average: an average
        # weights each rank by the samples it processed in that round.
        self._round_sum = 0.0
        self._round_n = 0

    @classmethod
    def traits(cls, **settings: Any) -> Traits:
        """Its traits with the given :attr:`trait_settings` (keywords as the constructor
        takes them; those left out take the constructor's default): the class attributes,
        unless a policy changes some of them with a setting (SelSync's ``aggregation``)."""
        return Traits(**{f.name: getattr(cls, f.name) for f in fields(Traits)})

    @property
    def steps(self) -> int:
        """Steps taken so far."""
        return self._step_count

    @property
    def norm_kind(self) -> NormKind:
        """How the recorded gradient norm is computed (see :func:`gradient_norm`)."""
        return "global"

    def step(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        weight: float | None = None,
        compute_s: float = math.nan,
        finite: bool | None = None,
    ) -> SyncRecord:
        """Take one training step: vote and communicate as the policy says, and step the optimizer.

        Args:
            model: this rank's replica, with the local gradients of this step in ``.grad``.
            optimizer: a plain optimizer over ``model``'s parameters; ``step()`` is called here.
            weight: this rank's share of the global batch, ``b_k / B``, when ranks take unequal
                batches; the averages are then weighted by it. None (default) means equal
                shares, ``1 / N``. Either all ranks pass a weight or none; they must sum to 1.
            compute_s: seconds of forward and backward, only copied into the record.
            finite: whether this rank's loss and gradients are finite. When given, the ranks
                agree on it (inside the policy's own vote where it has one, as SelSync does,
                else in one tiny allreduce), and if any rank's are not, every rank skips the
                step: no update, no change of the policy's state, the record's ``nonfinite``
                names the ranks. None (default): no check.

        Returns:
            The step's record (also appended to :attr:`records` when ``keep_records``, unless
            skipped).

        Raises:
            SyncError: on every rank, when the weights are inconsistent.
        """
        if self.outer is not None:
            self.outer.start(model)  # the first step's parameters: the first start point
        elif self._step_count == 0 and self._reference is None and self._keeps_reference():
            # A run's first step: if the replicas start equal (as a broadcast leaves them),
            # their parameters are the first average's reference, so it travels compressed.
            params = [p.detach() for p in model.parameters()]
            if replicas_equal(params, self.group):
                self._reference = [p.clone() for p in params]
        # One pass over the gradients: only for the records, or for a policy that decides by it.
        norm = (
            gradient_norm(model.parameters(), kind=self.norm_kind)
            if self.keep_records or self.decides_by_norm
            else math.nan
        )
        bad = self._decide(norm, weight, finite).nonfinite
        if bad:
            return SyncRecord(
                step=self._step_count, grad_norm=norm, smoothed_norm=math.nan, delta=math.nan,
                votes=0, synced=False, sync_s=0.0, compute_s=float(compute_s),
                nonfinite=tuple(bad),
            )  # fmt: skip
        if weight is not None:
            self._round_sum += float(weight)
            self._round_n += 1
        if self.drift is not None:
            self.drift.apply([p.data for p in model.parameters()])
        self.settle()  # the last average's optimizer state, before this step's update
        out = self._step(StepInput(model, optimizer, norm, weight))
        if out.model_averaged:
            self._diverged = False
        elif not out.synced:
            self._diverged = True
        # A gradient average keeps equal replicas equal and unequal ones unequal: no change.
        record = SyncRecord(
            step=self._step_count,
            grad_norm=norm,
            smoothed_norm=out.smoothed_norm,
            delta=out.delta,
            votes=out.votes,
            synced=out.synced,
            sync_s=out.sync_s,
            compute_s=float(compute_s),
            bytes=out.bytes,
        )
        self._step_count += 1
        self._synced += int(out.synced)
        self._bytes += out.bytes
        if self._grad_bytes is None:  # the parameters are fixed for the run
            self._grad_bytes = gradient_bytes(model.parameters())
        self._bsp_bytes += self._grad_bytes
        self._sync_s += out.sync_s
        self._last_weight = weight
        if self.keep_records:
            self.records.append(record)
        return record

    def _decide(self, norm: float, weight: float | None, finite: bool | None) -> Agreement:
        """The step's control exchange, before anything changes: here only the non-finite
        check, when asked for. Policies that vote every step (SelSync) fold it into their vote
        and keep the decision for :meth:`_step`; they must leave their state as it was when
        some rank is not finite."""
        if finite is None:
            return Agreement(0, [])
        return agree_step(False, None, finite=finite, group=self.group)

    @abc.abstractmethod
    def _step(self, s: StepInput) -> Outcome:
        """Communicate as the policy says and call ``s.optimizer.step()`` exactly once."""

    def _agree_unanimous(self, weight: float | None) -> int:
        """The agreement of a step on which every rank votes yes; returns the votes.

        :func:`agree` checks the weights; with ``check_weights`` off nothing is exchanged.
        """
        if self.check_weights:
            return agree(True, weight, group=self.group)
        return comm.size() if self.group is None else self.group.size

    def _keeps_reference(self) -> bool:
        """Whether compressed parameter averages need :attr:`_reference` (the outer optimizer
        keeps its own start point; replicas kept equal are never averaged)."""
        return self.codec.compresses and not self.keeps_replicas_equal and self.outer is None

    def _reference_point(self, model: torch.nn.Module) -> list[torch.Tensor] | None:
        """The parameters every replica had at the last average: the outer optimizer's start
        point, or this policy's own reference (on the model's device); None when no
        parameters are known to be common to the replicas (they started unequal, or a resume
        brought none)."""
        if self.outer is not None:
            self.outer.place(model)
            return self.outer.start_point
        ref = self._reference
        device = next(model.parameters()).device
        if ref is not None and ref[0].device != device:  # restored from a checkpoint on the CPU
            ref = self._reference = [r.to(device) for r in ref]
        return ref

    def _round_weight(self, weight: float | None) -> float | None:
        """This rank's share of the samples processed since the last parameter average (its
        mean ``b_k / B`` over those steps); None without weights."""
        if weight is None or self._round_n == 0:
            return weight
        return self._round_sum / self._round_n

    def _average_params(
        self,
        model: torch.nn.Module,
        weight: float | None,
        optimizer: torch.optim.Optimizer | None = None,
    ) -> int:
        """One fused model average (with ``optimizer``'s state when :attr:`optimizer_state`),
        weighted by the samples each rank processed since the last one, then the outer step
        if there is one; returns bytes."""
        if self.drift is not None:
            self.drift.begin(p.data for p in model.parameters())
        w = self._round_weight(weight)
        reference = self._reference_point(model) if self.codec.compresses else None
        # Compressed, the replicas send their difference from a reference. Without one known
        # to be common (replicas that started unequal, a resume from an uncompressed run
        # after local steps) the average travels uncompressed and sets it: replicas that
        # sent differences from unequal references would stay apart.
        send = self.codec if reference is not None or not self.codec.compresses else None
        nbytes = average_model_(
            model, weight=w, group=self.group, codec=send, reference=reference
        )
        if send is None:
            self.codec.tally.add(nbytes, nbytes)
        if self._keeps_reference():  # the averaged parameters: the next round's reference
            averaged = [p.detach() for p in model.parameters()]
            if self._reference is None:
                self._reference = [p.clone() for p in averaged]
            else:
                with torch.no_grad():
                    torch._foreach_copy_(self._reference, averaged)
        if self._state_average is not None and optimizer is not None:
            state = optimizer_state_tensors(optimizer, model.parameters())
            nbytes += self._state_average.start(state, w, self.group)
        self._round_sum, self._round_n = 0.0, 0
        if self.drift is not None:
            self.drift.end([p.data for p in model.parameters()])
        if self.outer is not None:
            self.outer.apply(model)
        return nbytes

    def _average_model(
        self,
        model: torch.nn.Module,
        weight: float | None,
        optimizer: torch.optim.Optimizer | None = None,
    ) -> tuple[float, int]:
        """Check weights, then :meth:`_average_params`; returns ``(seconds, bytes)``."""
        t0 = time.perf_counter()
        self._agree_unanimous(weight)
        nbytes = self._average_params(model, weight, optimizer)
        return time.perf_counter() - t0, nbytes

    def finish(self, model: torch.nn.Module) -> bool:
        """Make the replicas equal before evaluation, if local steps may have made them differ.

        Averages parameters and buffers, weighted by the samples each rank processed since the
        last average (the ``weight`` values given to :meth:`step`).
        Every rank must call it; all take the same branch.

        Returns:
            Whether an average was taken.
        """
        self.settle()
        if not self._diverged:
            return False
        seconds, nbytes = self._average_model(model, self._last_weight)
        self._sync_s += seconds
        self._bytes += nbytes
        self._diverged = False
        return True

    def prepare(self, model: torch.nn.Module) -> None:
        """Set up what the policy shares across ranks, before the first step (collective where
        it shares anything; the first :meth:`step` does it otherwise)."""
        return None

    def before_backward(self, model: torch.nn.Module, *, weight: float | None = None) -> None:
        """Called before each step's ``loss.backward()`` with the step's weight: a policy that
        communicates during the backward pass (BSP with ``overlap``) gets ready; the others do
        nothing. Optional: without it, :meth:`step` does all the communication."""
        return None

    def loss_scale(self, weight: float | None = None) -> float:
        """The factor by which the caller may multiply this step's loss before
        ``loss.backward()`` so that the gradients come out already weighted for the average
        (then the policy skips its own scaling pass over them). 1.0 (the default): the policy
        scales them itself. Optional; a caller that uses it passes the same ``weight`` to
        :meth:`step`."""
        return 1.0

    def skip(self, model: torch.nn.Module) -> None:
        """A step this rank skips (non-finite gradients); synchronous policies have nothing to
        do, since every rank skips it alike."""
        return None

    def close(self) -> None:
        """Release what the policy holds across ranks (collective where it holds anything)."""
        self.settle()

    def settle(self) -> None:
        """Complete the communication still in flight: the optimizer state's average started
        at the last parameter average (``optimizer_state``), written into the optimizer's
        state. :meth:`step`, :meth:`finish`, :meth:`state_dict` and :meth:`close` call it;
        call it yourself before reading the optimizer's state between steps. Every rank must
        call it at the same point."""
        if self._state_average is not None:
            self._state_average.settle()

    def summary_fields(self) -> dict[str, Any]:
        """Figures of this policy beyond :meth:`summary` (none for most)."""
        return {}

    def summary(self) -> SyncSummary:
        """Fraction of steps synchronised and bytes communicated, against BSP."""
        steps = self._step_count
        return SyncSummary(
            policy=self.name,
            steps=steps,
            synced_steps=self._synced,
            sync_fraction=self._synced / steps if steps else 0.0,
            bytes=self._bytes,
            bsp_bytes=self._bsp_bytes,
            bytes_vs_bsp=self._bytes / self._bsp_bytes if self._bsp_bytes else 0.0,
            sync_s=self._sync_s,
            compression=self.codec.spec(),
            compression_ratio=self.codec.tally.ratio,
        )

    def state_dict(self) -> dict[str, Any]:
        """Counters and decision state (not the records), so a resumed run goes on identically.
        Settles the optimizer state's average first (see :meth:`settle`)."""
        self.settle()
        return {
            "policy": self.name,
            "step": self._step_count,
            "synced": self._synced,
            "bytes": self._bytes,
            "bsp_bytes": self._bsp_bytes,
            "sync_s": self._sync_s,
            "diverged": self._diverged,
            "last_weight": self._last_weight,
            "round_sum": self._round_sum,
            "round_n": self._round_n,
            "outer": None if self.outer is None else self.outer.state_dict(),
            "drift": None if self.drift is None else self.drift.state_dict(),
            "compression": self.codec.spec(),
            "tally": [self.codec.tally.raw, self.codec.tally.wire],
            "codec": self.codec.state_dict(),
            "reference": self._reference,
        }

    def for_other_parameters(self, state: dict[str, Any]) -> dict[str, Any]:
        """``state`` (a :meth:`state_dict`) with what belongs to the parameters it was saved
        for (:attr:`parameter_state`: drift corrections, compression residuals, the reference
        copy, ...) replaced by this fresh policy's own; counters and decisions kept. For a
        pipeline stage that holds other layers after a re-cut: those parts start afresh."""
        fresh = self.state_dict()
        return {**state, **{k: fresh[k] for k in self.parameter_state if k in fresh}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict`.

        Raises:
            SyncError: the state belongs to another policy.
        """
        if state.get("policy") != self.name:
            raise SyncError(
                f"sync state was saved by policy {state.get('policy')!r}, but this run uses "
                f"{self.name!r}; resume with the same policy"
            )
        self._step_count = int(state["step"])
        self._synced = int(state["synced"])
        self._bytes = int(state["bytes"])
        self._bsp_bytes = int(state["bsp_bytes"])
        self._sync_s = float(state["sync_s"])
        self._diverged = bool(state["diverged"])
        w = state["last_weight"]
        self._last_weight = None if w is None else float(w)
        self._round_sum = float(state.get("round_sum", 0.0))
        self._round_n = int(state.get("round_n", 0))
        # Another compression may follow (a job refuses it unless --resume-changes names it).
        # Without a saved reference the next average travels uncompressed and sets it.
        self.codec.tally.raw, self.codec.tally.wire = map(int, state.get("tally", (0, 0)))
        self.codec.load_state_dict(state.get("codec") or {})
        self._reference = state.get("reference") if self._keeps_reference() else None
        parts = (
            ("outer", self.outer, "an outer optimizer", ("one", "none"), "outer_optimizer"),
            ("drift", self.drift, "drift correction", ("it on", "it off"), "drift_correction"),
        )
        for key, mine, what, (has, lacks), setting in parts:
            saved = state.get(key)
            if (saved is None) != (mine is None):
                raise SyncError(
                    f"sync state was saved {'without' if saved is None else 'with'} {what}, "
                    f"but this run has {has if mine is not None else lacks}; resume with the "
                    f"same {setting} setting"
                )
            if mine is not None and saved is not None:
                mine.load_state_dict(saved)
