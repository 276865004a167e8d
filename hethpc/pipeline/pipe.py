"""The pipeline object: this rank's stage of a model cut across ranks, one batch at a time.

:class:`Pipeline` checks its settings, agrees on each batch with the other stages, hands the
micro-batches to the schedule runner (:mod:`hethpc.pipeline.runner`), which drives this rank's
:class:`~hethpc.pipeline.stage.Stage` (or, with ``schedule="zbv"``, its two chunks' stages),
and reduces the replicas' gradients after the step.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn

from hethpc import comm
from hethpc.comm import Group
from hethpc.comm.progress import auto_interval
from hethpc.pipeline.balance import partition_by_counts, split_model
from hethpc.pipeline.errors import PipelineError
from hethpc.pipeline.runner import StepStats, run_forward, run_step, tag
from hethpc.pipeline.schedule import (
    BACKWARD,
    V_SCHEDULES,
    chunks_per_stage,
    has_weight_passes,
    make_schedule,
    stage_tasks,
    v_chunks,
)
from hethpc.pipeline.stage import LossFn, Stage
from hethpc.sync.averaging import average_gradients_

# comm's point-to-point uses tags 2*tag and 2*tag+1; MPI guarantees tags up to 32767.
MAX_MICRO_BATCHES = 4096
MPI_TAG_UB = 32767


def max_micro_batches(schedule: str) -> int:
    """The most micro-batches whose message tags stay within MPI's guaranteed ``32767`` under
    ``schedule`` (a V's two lanes of messages take twice the tags), at most 4096."""
    lanes = chunks_per_stage(schedule)
    # tag(i, B, lanes - 1, lanes) = 2 * (lanes * i + lanes - 1) + 1; comm sends on 2*tag+1
    most = ((MPI_TAG_UB - 1) // 2 - 1) // 2 // lanes + 1
    return min(MAX_MICRO_BATCHES, most)


def default_device() -> torch.device:
    """``cuda:<local rank>`` when a GPU is visible, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", comm.local_rank() % torch.cuda.device_count())
    return torch.device("cpu")


class Pipeline:
    """This rank's stage of a model cut into stages across the ranks of ``stage_group``.

    Every rank builds the same whole model (same seed) and keeps the layers of its stage.
    ``train_step`` splits the batch into micro-batches, runs the schedule, and leaves on
    the stage's parameters the gradient of the whole batch's mean loss, exactly as one
    process running the whole model would (up to float rounding). Layers that mix samples
    of a batch (BatchNorm in training) see micro-batches instead and so differ.

    Args:
        model: the whole model; its layers are cut by ``balance``.
        balance: layers per stage, one entry per rank of ``stage_group``; with "zbv", layers
            per chunk, 2P entries in chunk order (chunk ``c`` runs on rank ``c`` for
            ``c < P``, else on rank ``2P-1-c``).
        micro_batches: m, micro-batches per batch (1..4096); batches need at least m rows.
        schedule: "1f1b" (at most P micro-batches of activations per stage), "gpipe",
            "zb" (ZB-H1: 1F1B whose stages other than the first run each backward as B, the
            input's gradient, sent at once, and W, the weights' gradients, later, where 1F1B
            would wait; needs ``split_backward``, else each W is empty and it runs as 1F1B),
            or "zbv" (ZB-V: the model in 2P chunks, two per rank in a V, split backwards,
            a bubble about half ZB-H1's with 1F1B's peak of activations; rank 0 holds the
            first and the last chunk, so it takes both the inputs and the targets and
            returns the loss).
        stage_group: the ranks of this pipeline, in stage order; this rank's group rank is
            its stage.
        dp_group: the ranks holding this same stage in other replicas; their gradients are
            averaged (or weight-summed, see ``train_step``) after each step. None: no
            data parallelism here (the caller may still synchronise, e.g. with a sync policy).
        checkpoint: recompute each micro-batch's forward during its backward instead of
            keeping its activations (saves memory, costs one more forward).
        device: where this stage runs (default: ``cuda:<local rank>`` if present, else CPU).
        progress_interval: seconds between the background thread's tests of pending
            transfers; ``"auto"`` (default): a tenth of this stage's mean forward or backward
            pass in the previous step, within 0.5-10 ms (0.5 ms in the first step); None runs
            no thread, so transfers move only while the stage waits for a message (enough
            when MPI copies large messages in one step, e.g. Open MPI with
            ``btl_vader_single_copy_mechanism=cma``).
        split_backward: on stages other than the first, compute the input's gradient first,
            send it, then the weights' gradients (:mod:`hethpc.pipeline.backward`): the
            previous stage gets it about half a backward earlier, for the same arithmetic.
            Used when every parametrised layer of the stage holds its parameters directly
            (else a plain backward). With "zb" the weights' gradients wait for the
            schedule's W pass; otherwise they follow at once.

    Raises:
        PipelineError: the balance does not match the group, or settings are out of range.
        PartitionError: the balance does not cover the model's layers.
    """

    def __init__(
        self,
        model: nn.Sequential,
        *,
        balance: Sequence[int],
        micro_batches: int,
        schedule: str = "1f1b",
        stage_group: Group,
        dp_group: Group | None = None,
        checkpoint: bool = False,
        device: torch.device | str | None = None,
        progress_interval: float | str | None = "auto",
        split_backward: bool = True,
    ) -> None:
        balance = partition_by_counts(len(model), balance)
        per = chunks_per_stage(schedule)
        if len(balance) != per * stage_group.size and per > 1:
            raise PipelineError(
                f"balance {list(balance)} has {len(balance)} chunks but schedule {schedule!r} "
                f"cuts the model into {per} chunks per rank of the pipeline group's "
                f"{stage_group.size}; give {per * stage_group.size} layer counts, one per chunk "
                "in chunk order"
            )
        if len(balance) != stage_group.size and per == 1:
            raise PipelineError(
                f"balance {list(balance)} has {len(balance)} stages but the pipeline group has "
                f"{stage_group.size} ranks; give one layer count per stage"
            )
        if not stage_group.is_member:
            raise PipelineError(
                f"rank {comm.rank()} is not in the pipeline group {list(stage_group.ranks)}"
            )
        if progress_interval != "auto" and not (
            progress_interval is None
            or (isinstance(progress_interval, (int, float)) and progress_interval > 0)
        ):
            raise PipelineError(
                "progress_interval must be a positive number of seconds, 'auto' or None (no "
                f"thread), got {progress_interval!r}"
            )
        most = max_micro_batches(schedule)
        if not 1 <= micro_batches <= most:
            raise PipelineError(
                f"micro_batches must be in 1..{most} (message tags stay within MPI's "
                f"{MPI_TAG_UB}), got {micro_batches}"
            )
        self.balance = balance
        self.micro_batches = int(micro_batches)
        self.schedule = schedule
        self.stage_group = stage_group
        self.dp_group = dp_group
        self.checkpoint = bool(checkpoint)
        self.progress_interval = progress_interval
        self.stage = stage_group.rank
        self.stages = stage_group.size
        self.device = torch.device(device) if device is not None else default_device()
        self.table = make_schedule(schedule, self.stages, self.micro_batches)
        self._tasks = stage_tasks(self.table, self.stage)
        # chunk c runs on group rank placement[c]: one chunk per rank, or two in a V
        v = schedule in V_SCHEDULES
        self.placement = v_chunks(self.stages) if v else list(range(self.stages))
        #: this rank's chunks, in chunk order (its stage alone, except in a V)
        self.chunks = [c for c, r in enumerate(self.placement) if r == self.stage]
        parts = split_model(model, balance)
        self._stages = [Stage(parts[c], index=c, stages=len(self.placement), device=self.device,
                              split_backward=split_backward) for c in self.chunks]  # fmt: skip
        #: this rank's layers: its stage's ``nn.Sequential``, or in a V an ``nn.ModuleList``
        #: of its two chunks' (``module[k]`` is chunk ``chunks[k]``)
        self.module: nn.Module = (
            self._stages[0].module if len(self._stages) == 1
            else nn.ModuleList(st.module for st in self._stages)
        )  # fmt: skip
        #: whether this rank splits its backward (in a V: in either of its chunks)
        self.split_backward = any(st.split_backward for st in self._stages)
        last = (self.micro_batches - 1, BACKWARD, per - 1, per)
        assert 2 * tag(*last) + 1 <= MPI_TAG_UB, "max_micro_batches bounds the tags"
        # the schedule's W passes compute the weights' gradients (else B computes them)
        self._deferred_weights = self.split_backward and has_weight_passes(self.table, self.stage)
        self.stats = StepStats(0.0, 0.0, 0)
        self._task_s: float | None = None  # mean forward or backward pass, last step

    @property
    def is_first(self) -> bool:
        """Whether this rank runs the first stage or chunk (it needs the inputs)."""
        return any(st.is_first for st in self._stages)

    @property
    def is_last(self) -> bool:
        """Whether this rank runs the last stage or chunk (it needs the targets; it has the
        loss): the last rank, or rank 0 with "zbv"."""
        return any(st.is_last for st in self._stages)

    @property
    def current_progress_interval(self) -> float | None:
        """The progress thread's interval for the next step (None: no thread)."""
        if self.progress_interval == "auto":
            return auto_interval(self._task_s)
        return None if self.progress_interval is None else float(self.progress_interval)

    def parameters(self) -> Iterator[nn.Parameter]:
        """This stage's parameters, of both its chunks in a V (give them to the optimizer)."""
        return self.module.parameters()

    def state_dict(self) -> dict[str, Any]:
        """This stage's parameters and buffers (in a V, keyed ``"<k>.<layer>..."`` for its
        ``k``-th chunk)."""
        return self.module.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned on the same stage."""
        self.module.load_state_dict(state)

    def train_step(
        self,
        x: torch.Tensor | None,
        y: torch.Tensor | None,
        loss_fn: LossFn,
        *,
        dp_weight: float | None = None,
    ) -> float | None:
        """Forward and backward one batch through the pipeline; gradients accumulate.

        Call ``optimizer.zero_grad()`` before and ``optimizer.step()`` after, as usual.

        Args:
            x: the batch's inputs ``[N, ...]``; needed on the first stage (ignored elsewhere,
                may be None).
            y: the targets ``[N, ...]``; needed on the last stage (ignored elsewhere). With
                "zbv" rank 0 holds both the first and the last chunk: it needs x and y.
            loss_fn: ``loss_fn(output, target)`` returning the MEAN loss over its rows
                (e.g. ``nn.CrossEntropyLoss()``); micro-batch losses are weighted by their
                share of the batch so the sum is the batch's mean loss.
            dp_weight: with a ``dp_group``: None averages the replicas' gradients; a number
                (this replica's share of the global batch, b_k / B) scales them before a sum.

        Returns:
            The batch's mean loss on the rank of the last stage or chunk, None on the others.

        Raises:
            PipelineError: on every rank of the pipeline, when the batch is missing where it
                is needed, the ranks' batch sizes differ, or there are fewer rows than
                micro-batches.
        """
        t_start = time.perf_counter()
        n = self._agree_batch(x, y)
        m = self.micro_batches
        xs = torch.tensor_split(x, m) if self.is_first and x is not None else [None] * m
        ys = torch.tensor_split(y, m) if self.is_last and y is not None else [None] * m
        loss, stats = run_step(self._stages, self._tasks, self.stage_group, xs, ys, n, loss_fn,
                               placement=self.placement, checkpoint=self.checkpoint,
                               defer_weights=self._deferred_weights,
                               interval=self.current_progress_interval)  # fmt: skip
        self._reduce_replicas(dp_weight)
        self._task_s = stats.busy_s / len(self._tasks) if self._tasks else None
        # the whole call: the batch agreement and the replicas' reduction too
        self.stats = dataclasses.replace(stats, step_s=time.perf_counter() - t_start)
        return loss if self.is_last else None

    @torch.no_grad()
    def forward(self, x: torch.Tensor | None) -> torch.Tensor | None:
        """Inference: the model's output ``[N, ...]`` on the rank of the last stage or chunk,
        None on the others.

        Args:
            x: the inputs ``[N, ...]`` on the first stage (ignored elsewhere, may be None).
        """
        n = self._agree_batch(x, None, need_targets=False)
        xs = torch.tensor_split(x, self.micro_batches) if self.is_first and x is not None else None
        return run_forward(self._stages, self.stage_group, xs, min(self.micro_batches, n),
                           placement=self.placement,
                           interval=self.current_progress_interval)  # fmt: skip

    def _agree_batch(
        self, x: torch.Tensor | None, y: torch.Tensor | None, *, need_targets: bool = True
    ) -> int:
        """Check the batch on gathered facts, so every rank raises the same error or none."""
        mine = (
            self.stage,
            None if not self.is_first or x is None else int(x.shape[0]),
            None if not self.is_last or y is None else int(y.shape[0]),
        )
        facts = comm.allgather_object(mine, group=self.stage_group)
        problems = []
        rows = {}
        first, last = self.placement[0], self.placement[-1]
        for stage, nx, ny in facts:
            if stage == first:
                if nx is None:
                    problems.append("the first stage got no inputs x")
                else:
                    rows[f"inputs x on stage {stage}"] = nx
            if stage == last and need_targets:
                holds = " (it holds the last chunk)" if len(self.chunks) > 1 else ""
                if ny is None:
                    problems.append(f"the last stage ({stage}){holds} got no targets y")
                else:
                    rows[f"targets y on stage {stage}"] = ny
        if len(set(rows.values())) > 1:
            problems.append(f"batch sizes differ: {rows}")
        n = min(rows.values()) if rows else 0
        if not problems and need_targets and n < self.micro_batches:
            problems.append(
                f"the batch has {n} rows but micro_batches is {self.micro_batches}; use a batch "
                "of at least as many rows as micro-batches"
            )
        if problems:
            raise PipelineError(
                f"pipeline {list(self.stage_group.ranks)}: " + "; ".join(problems)
            )
        return n

    def _reduce_replicas(self, dp_weight: float | None) -> None:
        if self.dp_group is not None:  # the one weighted gradient sum of data parallelism
            average_gradients_(self.module.parameters(), weight=dp_weight, group=self.dp_group,
                               name="hethpc.pipeline.grads")  # fmt: skip
