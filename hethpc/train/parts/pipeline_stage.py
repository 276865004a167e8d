"""The pipeline step engine: this rank runs one stage of its replica's pipeline, and the
settings a pipelined run refuses (checked before any stage is built, alike on every rank)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from hethpc import comm
from hethpc.batching.memory_cap import memory_left, parse_max_rank_batch
from hethpc.comm import Group, ReduceOp
from hethpc.data import ArrayDataset
from hethpc.data.transform import is_sequence, to_batch
from hethpc.pipeline import build_pipeline
from hethpc.pipeline.balance import parse_balance, partition_by_counts
from hethpc.pipeline.build import choose_balance, memory_budget, speed_costs
from hethpc.pipeline.errors import BalanceError
from hethpc.pipeline.groups import make_pipeline_groups
from hethpc.pipeline.pipe import default_device
from hethpc.pipeline.profile import MemoryBudget
from hethpc.pipeline.recut import move_stage_states, skeleton
from hethpc.pipeline.schedule import V_SCHEDULES, chunks_per_stage, v_chunks
from hethpc.sync import POLICIES
from hethpc.sync.factory import policy_class
from hethpc.train.evaluation import Metric
from hethpc.train.parts.data_parallel import Loss
from hethpc.train.parts.device import describe_device, run_facts
from hethpc.train.settings.config import ConfigError, TrainConfig

#: A resumed run cut by time takes a new cut when the speeds measured at its start predict
#: the slowest chunk at least this many times faster under it than under the saved cut.
RECUT_GAIN = 1.1

# Settings a pipelined run does not support yet; refused up front, named in the error. Of the
# sync policies only those whose ranks step together are wired in (not the asynchronous: ssp).
_ASYNCHRONOUS = " or ".join(name for name, policy in POLICIES.items() if policy.asynchronous)
_PIPELINE_UNSUPPORTED: tuple[tuple[Callable[[TrainConfig], bool], str], ...] = (
    (lambda cfg: cfg.inject_alpha != 0.0, "no --inject-alpha"),
    (lambda cfg: cfg.outer_optimizer != "none", "no --outer-optimizer"),
    (lambda cfg: policy_class(cfg.sync).asynchronous, f"no --sync {_ASYNCHRONOUS}"),
    (lambda cfg: cfg.inner_steps != "fixed", "no --inner-steps speed"),
)


def check_pipeline_config(cfg: TrainConfig, world_size: int) -> None:
    """Refuse settings a pipelined run cannot honour (the same decision on every rank).

    Raises:
        ConfigError: ``--pipeline-stages`` does not divide the world size, the global batch
            does not split into replicas and micro-batches, or a setting is unsupported
            (SSP, injection, an outer optimizer, speed-sized inner steps).
    """
    p = cfg.pipeline_stages
    if world_size % p:
        raise ConfigError(
            f"--pipeline-stages {p} must divide the number of ranks {world_size} "
            f"(world = stages x replicas); launch a multiple of {p} ranks"
        )
    d = world_size // p
    if cfg.batch_size // d < cfg.micro_batches:
        raise ConfigError(
            f"--batch-size {cfg.batch_size} must give each of the {d} replica(s) at least "
            f"--micro-batches {cfg.micro_batches} rows"
        )
    wrong = [need for unsupported, need in _PIPELINE_UNSUPPORTED if unsupported(cfg)]
    if wrong:
        raise ConfigError(
            f"--pipeline-stages {p} supports only: {', '.join(wrong)} (not wired in yet)"
        )


def model_chunks(cfg: TrainConfig, layers: int, stages: int) -> int:
    """How many chunks ``cfg.schedule`` cuts a model of ``layers`` layers into on ``stages``
    stages: one per stage, or two in a V (zbv), in chunk order.

    Raises:
        ConfigError: zbv's 2P chunks need more layers than the model has (a model with fewer
            layers than stages is refused by the balance, for every schedule).
    """
    chunks = chunks_per_stage(cfg.schedule) * stages
    if chunks > layers >= stages:
        raise ConfigError(
            f"--schedule {cfg.schedule} cuts the model into two chunks per stage, {chunks} "
            f"for --pipeline-stages {stages}, but model {cfg.model} has {layers} layers; use "
            f"--schedule zb (one chunk per stage) or a model with at least {chunks} layers",
            key="schedule",
        )
    return chunks


def check_stage_parameters(
    cfg: TrainConfig, model: nn.Sequential, balance: tuple[int, ...], stages: int
) -> None:
    """Refuse a cut that leaves a pipeline stage without trainable parameters (pure: every
    rank decides alike, before any stage is built).

    ``balance`` is the layers per chunk, in chunk order; a stage holds one chunk, or two in a
    V (:func:`~hethpc.pipeline.schedule.v_chunks`).

    Raises:
        ConfigError: naming the stage count, the layers with parameters and the fix.
    """
    holds = [any(p.requires_grad for p in layer.parameters()) for layer in model]
    placement = v_chunks(stages) if cfg.schedule in V_SCHEDULES else list(range(stages))
    has = [False] * stages
    start = 0
    for chunk, count in enumerate(balance):
        has[placement[chunk]] |= any(holds[start : start + count])
        start += count
    empty = [s for s in range(stages) if not has[s]]
    if not empty:
        return
    named = [f"#{i} {type(layer).__name__}" for i, layer in enumerate(model) if holds[i]]
    fewer = "1 (no pipeline)" if len(named) <= 1 else f"{len(named)} or fewer"
    fix = (
        f"use --pipeline-stages {fewer}, or a model with at least {stages} layers that hold "
        "parameters"
        if len(named) < stages
        else "use --schedule 1f1b (one chunk per stage), or a model with more layers that "
        "hold parameters"
    )
    raise ConfigError(
        f"--pipeline-stages {stages}: stage(s) {empty} would hold no trainable parameters "
        f"(nothing for their optimizer to train): model {cfg.model} has {len(named)} layer(s) "
        f"with parameters among its {len(model)} layers ({', '.join(named) or 'none'}); {fix}",
        key="pipeline_stages",
    )


def describe_memory(use: Sequence[tuple[float, float | None]]) -> str:
    """``"chunk 0 12.0 of 40.0 MiB, chunk 1 ..."``: each chunk's bytes needed of its limit."""
    return ", ".join(
        f"chunk {c} {need / 2**20:.1f}" + ("" if lim is None else f" of {lim / 2**20:.1f}")
        + " MiB"
        for c, (need, lim) in enumerate(use)
    )  # fmt: skip


class PipelineStage:
    """This rank runs one stage of its replica's pipeline; world = stages x replicas.

    Replica ``d`` is world ranks ``d*P .. d*P+P-1`` and reads slice ``d`` of each global batch;
    stage ``s`` of every replica forms :attr:`group`, in which the sync policy averages that
    stage's parameters or gradients.
    """

    def __init__(
        self,
        cfg: TrainConfig,
        model: nn.Module,
        device: torch.device | None = None,
        *,
        sample: tuple[torch.Tensor, torch.Tensor] | None = None,
        cut_file: Path | None = None,
    ) -> None:
        if not isinstance(model, nn.Sequential):
            raise ConfigError(
                f"model {cfg.model} is not an nn.Sequential, so it cannot be cut into "
                "pipeline stages; give an nn.Sequential or use --pipeline-stages 1"
            )
        groups = make_pipeline_groups(cfg.pipeline_stages)
        lay = self.layout = groups.layout
        model_chunks(cfg, len(model), lay.stages)  # zbv's 2P chunks: named in the settings' words
        #: the cut the run's file held at a resume (None: a fresh run), and a re-cut's
        #: ``(old, new)`` predicted slowest-chunk seconds, or None
        self.saved_cut: tuple[int, ...] | None = None
        self.recut: tuple[float, float] | None = None
        self.moved_from: tuple[int, ...] | None = None  # the checkpoint's cut, if it moved
        #: with max_rank_batch auto: each chunk's (bytes needed, bytes it has) under the cut
        self.memory_use: list[tuple[float, float | None]] = []
        # names and shapes of the whole model, no data: what a checkpoint from another cut
        # is moved with (see adopt_checkpoint)
        self._skeleton = skeleton(model) if cfg.resume else None
        self.balance: tuple[int, ...] = self._cut(cfg, model, device, sample, cut_file)
        check_stage_parameters(cfg, model, self.balance, lay.stages)
        self.pipe = build_pipeline(
            model,
            stages=lay.stages,
            micro_batches=cfg.micro_batches,
            schedule=cfg.schedule,
            balance=self.balance,
            device=device,
            groups=groups,
            average_replicas=False,  # the sync policy synchronises the replicas
        )
        self.module = self.pipe.module
        self.device = self.pipe.device
        # One replica: a one-rank group, which never communicates (never the world).
        self.group = groups.dp_group or Group((comm.rank(),), 0)
        self.replica, self.replicas = lay.replica, lay.replicas
        self.replica_leaders = [d * lay.stages for d in range(lay.replicas)]
        # the world rank of replica 0's last chunk: its last stage, or in a V its first
        self.loss_rank = self.pipe.placement[-1]
        self.collective_eval = True
        self.saves_own_state = True  # each rank holds a different stage
        self.min_batch = cfg.micro_batches  # a replica's batch splits into m micro-batches
        self.takes_loss_scale = False  # the pipeline weights its replicas' gradients itself
        self.zero_in_place = False  # each step drops the stage's gradients (see compute)
        self._stage_group = groups.stage_group

    def _cut(
        self,
        cfg: TrainConfig,
        model: nn.Sequential,
        device: torch.device | None,
        sample: tuple[torch.Tensor, torch.Tensor] | None,
        cut_file: Path | None,
    ) -> tuple[int, ...]:
        """The layers per chunk, by ``pipeline_balance`` (a collective for ``time``; as given
        for a list), written to ``cut_file`` by rank 0. A resumed run keeps the cut in
        ``cut_file`` unless it was made by time and the speeds measured now predict the slowest
        chunk at least :data:`RECUT_GAIN` times faster under a new one;
        :meth:`adopt_checkpoint` then moves the checkpoint's stages to the new cut."""
        saved = None
        if cfg.resume and cut_file is not None and comm.rank() == 0 and cut_file.is_file():
            doc = json.loads(cut_file.read_text())
            saved = (tuple(int(v) for v in doc["balance"]), str(doc.get("by", "")))
        saved = comm.broadcast_object(saved)
        lay = self.layout
        if saved is not None:
            self.saved_cut, by = saved
        if cfg.pipeline_balance == "time":
            speeds = speed_costs(
                model, stages=lay.stages, schedule=cfg.schedule, micro_batches=cfg.micro_batches,
                sample=sample, device=device, memory=self._memory_budget(cfg, device),
            )  # fmt: skip
            try:
                balance = speeds.balance()
            except BalanceError as e:  # no cut within the ranks' memory: alike on every rank
                raise ConfigError(str(e), key="max_rank_batch") from None
            if saved is not None and by == "time":
                before, after = speeds.slowest(saved[0]), speeds.slowest(balance)
                if balance == saved[0] or (speeds.fits(saved[0]) and before < RECUT_GAIN * after):
                    self.memory_use = speeds.memory_use(saved[0])
                    return saved[0]
                self.recut = (before, after)
            self.memory_use = speeds.memory_use(balance)
        elif saved is not None and by == cfg.pipeline_balance:
            return saved[0]  # by parameters, or as given: the same cut again
        elif isinstance(given := parse_balance(cfg.pipeline_balance), tuple):
            try:
                balance = partition_by_counts(len(model), given)
            except BalanceError as e:  # counts that do not add up to the model's layers
                raise ConfigError(
                    f"pipeline_balance = {cfg.pipeline_balance!r} for model {cfg.model}: {e}; "
                    "or give params or time",
                    key="pipeline_balance",
                ) from None
        else:
            balance = choose_balance(
                model, stages=lay.stages, schedule=cfg.schedule, balance=cfg.pipeline_balance,
                micro_batches=cfg.micro_batches, sample=sample, device=device,
            )  # fmt: skip
        if cut_file is not None and comm.rank() == 0:
            cut_file.write_text(json.dumps({"balance": list(balance), "by": cfg.pipeline_balance}))
        return balance

    @staticmethod
    def _memory_budget(cfg: TrainConfig, device: torch.device | None) -> MemoryBudget | None:
        """With ``max_rank_batch auto``: what the cut by time keeps each stage within (this
        rank's memory left, the schedule's micro-batches in flight, the optimizer's state per
        parameter); else None."""
        if parse_max_rank_batch(cfg.max_rank_batch) != "auto":
            return None
        dev = device if device is not None else default_device()
        slots = 2 if cfg.optimizer in ("adam", "adamw") else int(cfg.momentum != 0.0)
        return memory_budget(
            memory_left(dev, cfg.memory_limit_gb), stages=cfg.pipeline_stages,
            schedule=cfg.schedule, micro_batches=cfg.micro_batches, state_copies=2 + slots,
        )  # fmt: skip

    def adopt_checkpoint(
        self, state: dict[str, Any], make_optimizer: Callable[[nn.Module], torch.optim.Optimizer]
    ) -> str:
        """Move the checkpoint's stage states to this run's cut where it was saved under
        another (its ``"cut"``; a checkpoint without one was saved under :attr:`saved_cut`):
        every rank's parameters, buffers and optimizer state go to the rank that now holds
        those layers (:func:`~hethpc.pipeline.recut.move_stage_states`)."""
        cut = tuple(int(v) for v in state.get("cut") or self.saved_cut or self.balance)
        if cut == self.balance:
            return ""
        assert self._skeleton is not None, "a resumed run keeps the model's skeleton"
        self.moved_from = cut
        state["ranks"] = move_stage_states(
            state["ranks"], model=self._skeleton, old=cut, new=self.balance,
            placement=self.pipe.placement, make_optimizer=make_optimizer,
        )  # fmt: skip
        why = (
            f" (speeds measured now: slowest chunk {self.recut[0] * 1e3:.1f} ms per "
            f"micro-batch under the saved cut, {self.recut[1] * 1e3:.1f} ms under the new)"
            if self.recut is not None
            else ""
        )
        return (
            f"pipeline re-cut: layers per chunk {list(cut)} -> {list(self.balance)}{why}; "
            "the stages' parameters and optimizer state moved with their layers"
        )

    def step_time(self, seconds: float) -> float:
        """The replica's step time, the same on each of its stages (one tiny allreduce).

        Every stage's batch controller (over its stage's replicas) then sees the same times
        and takes the same decisions, so the stages of a replica keep one batch size.
        """
        return float(comm.allreduce_array(np.array([seconds]), ReduceOp.MAX, self._stage_group)[0])

    def control_time(self, own_s: float, compute_s: float) -> float:
        """The replica's step time (:meth:`step_time`): a stage's compute includes its waits
        for its neighbours' messages, so its CPU time says too little."""
        return compute_s

    def describe(self) -> str:
        lay = self.layout
        return (
            f"{comm.size()} ranks = {lay.stages} pipeline stages x {lay.replicas} replica(s), "
            f"layers per {'chunk' if len(self.balance) > lay.stages else 'stage'} "
            f"{list(self.balance)}, {self.pipe.micro_batches} micro-batches "
            f"({self.pipe.schedule}), on {describe_device(self.device)}"
            + (f"; within memory: {describe_memory(self.memory_use)}" if self.memory_use else "")
        )

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
        """One batch through the pipeline; ``(loss on the last stage, None)``. The policy
        scales a pipeline's gradients itself: ``loss_scale`` must be 1; the pipeline's own
        micro-batches stand for ``pieces``, which must be 1 (the settings' rules refuse
        ``accumulate`` with pipeline stages)."""
        assert loss_scale == 1.0, "a pipeline stage takes no loss scale"
        assert pieces == 1, "a pipeline stage splits its batch into its own micro-batches"
        if before_backward is not None:
            before_backward()
        for p in self.module.parameters():
            p.grad = None
        value = self.pipe.train_step(x, y, loss_fn)
        marker = poison(torch.zeros(()))  # a deliberate NaN fault poisons this stage's step
        if not bool(torch.isfinite(marker)):
            first = next((p for p in self.module.parameters() if p.grad is not None), None)
            if first is not None:
                first.grad.mul_(float("nan"))  # type: ignore[union-attr]
        loss = torch.tensor(value, dtype=torch.float32) if value is not None else None
        if loss is not None and not bool(torch.isfinite(marker)):
            loss = loss * float("nan")
        return loss, None

    def step_fields(self) -> dict[str, Any]:
        lay = self.layout
        return {"idle": self.pipe.stats.idle_fraction, "stage": lay.stage, "replica": lay.replica}

    def summary_fields(self) -> dict[str, Any]:
        return {
            "pipeline_stages": self.layout.stages,
            "replicas": self.layout.replicas,
            "balance": list(self.balance),
            "recut_from": None if self.moved_from is None else list(self.moved_from),
            **(
                {"chunk_memory_mib": [
                    [round(need / 2**20, 1), None if lim is None else round(lim / 2**20, 1)]
                    for need, lim in self.memory_use]}
                if self.memory_use
                else {}
            ),  # fmt: skip
            **run_facts(self.device),
        }

    def evaluate(
        self,
        data: ArrayDataset,
        metrics: Sequence[Metric],
        *,
        batch: int = 2048,
        tick: Any = None,
    ) -> list[float]:
        """Each of ``metrics`` through the pipelines (a collective over the world; equal
        everywhere)."""
        totals = np.zeros(len(metrics))
        sequence = is_sequence(data)
        self.module.eval()
        for i in range(0, len(data), batch):
            if tick is not None:
                tick()
            # as in training: uint8 scaled, token windows split into inputs and targets
            x, y = to_batch(data.x[i : i + batch], data.y[i : i + batch], sequence=sequence)
            out = self.pipe.forward(x)
            if out is not None:
                y = y.to(out.device)
                for j, metric in enumerate(metrics):
                    totals[j] += float(metric(out, y)) * len(y)
        self.module.train()
        # Each replica's last stage scored every sample: average the replicas.
        summed = comm.allreduce_array(totals, ReduceOp.SUM) / self.replicas
        return [float(v) / max(len(data), 1) for v in summed]
