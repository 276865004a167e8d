"""Step engines: what the training loop asks of this rank's forward and backward, data-parallel
(:class:`~hethpc.train.parts.data_parallel.DataParallel`) or as one pipeline stage
(:class:`~hethpc.train.parts.pipeline_stage.PipelineStage`).

The training loop (:mod:`hethpc.train.run.loop`) is the same for both: it reads batches, calls
:meth:`Engine.compute`, lets the sync policy step the optimizer over :attr:`Engine.module`
within :attr:`Engine.group`, and evaluates, checkpoints and reports. An engine says where this
rank sits: which replica's batch it reads (:attr:`Engine.replica` of :attr:`Engine.replicas`),
which ranks hold the same parameters (:attr:`Engine.group`), and whether it computes the loss.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from hethpc import comm
from hethpc.comm import Group
from hethpc.data import ArrayDataset
from hethpc.train.evaluation import Metric
from hethpc.train.parts.data_parallel import DataParallel, Loss
from hethpc.train.parts.device import this_device
from hethpc.train.parts.pipeline_stage import PipelineStage, check_pipeline_config
from hethpc.train.settings.config import TrainConfig


class Engine(Protocol):
    """What the training loop reads and calls on a step engine."""

    module: nn.Module  # this rank's parameters: the whole model, or its stage's chunks
    device: torch.device
    replica: int  # which replica's share of each global batch this rank reads
    replicas: int
    replica_leaders: list[int]  # a world rank of each replica
    loss_rank: int  # the world rank whose losses the summary reports
    collective_eval: bool  # evaluation is a collective over the world (a pipeline's)
    saves_own_state: bool  # each rank checkpoints its own state (else rank 0's stands for all)
    min_batch: int  # the fewest rows a replica's batch may have
    takes_loss_scale: bool  # compute() scales the loss by the policy's weight
    # Zero gradients in place instead of dropping them (set by the loop under data-parallel
    # BSP, where a missing gradient counts as zeros anyway); an engine may ignore it.
    zero_in_place: bool

    @property
    def balance(self) -> tuple[int, ...] | None:
        """A pipeline's layers per chunk (None: every rank holds the whole model)."""
        ...

    @property
    def group(self) -> Group | None:
        """The ranks holding the same parameters (None: the world)."""
        ...

    def describe(self) -> str:
        """One line for the log: ranks, layout, device."""
        ...

    def adopt_checkpoint(
        self, state: dict[str, Any], make_optimizer: Callable[[nn.Module], torch.optim.Optimizer]
    ) -> str:
        """Fit a checkpoint's per-rank states (``state["ranks"]``) to this engine's layout, in
        place, where it was saved under another (a pipeline re-cut); ``make_optimizer`` builds
        the run's optimizer over some layers. Returns a note for the log ("" if nothing
        moved)."""
        ...

    def step_time(self, seconds: float) -> float:
        """This replica's step time from this rank's ``seconds`` (the same on its ranks)."""
        ...

    def control_time(self, own_s: float, compute_s: float) -> float:
        """The time the batch controller follows, from the rank's own and timed compute."""
        ...

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
        """Forward and backward of one batch; ``(loss, output)``, either None where this rank
        does not hold it; gradients on :attr:`module`."""
        ...

    def step_fields(self) -> dict[str, Any]:
        """Extra fields of each step's record."""
        ...

    def summary_fields(self) -> dict[str, Any]:
        """Extra fields of the run's summary."""
        ...

    def evaluate(
        self, data: ArrayDataset, metrics: Sequence[Metric], *, tick: Any = None
    ) -> list[float]:
        """Each of ``metrics`` over all of ``data``."""
        ...


def make_engine(
    cfg: TrainConfig,
    model: nn.Module,
    *,
    sample: Callable[[int], tuple[torch.Tensor, torch.Tensor]] | None = None,
    run_dir: Path | None = None,
) -> Engine:
    """The engine for ``cfg``: pipeline stages when ``pipeline_stages > 1`` (cut by
    ``pipeline_balance`` on a replica's batch of ``sample(rows)``, the cut kept in
    ``run_dir`` for a resumed run)."""
    device = this_device(cfg.device, comm.local_rank())
    if cfg.pipeline_stages > 1:
        check_pipeline_config(cfg, comm.size())
        rows = cfg.batch_size // (comm.size() // cfg.pipeline_stages)
        return PipelineStage(
            cfg, model, device,
            sample=sample(rows) if sample is not None and cfg.pipeline_balance == "time" else None,
            cut_file=None if run_dir is None else run_dir / "pipeline_cut.json",
        )  # fmt: skip
    return DataParallel(model, device)
