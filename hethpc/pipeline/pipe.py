"""The stage runtime: one rank runs one stage; micro-batches stream between neighbour ranks."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from hethpc import comm
from hethpc.comm import Group
from hethpc.comm.progress import Lookahead, Progress, auto_interval
from hethpc.pipeline.backward import can_split, input_gradient, tapped_forward, weight_gradients
from hethpc.pipeline.balance import partition_by_counts, partition_by_params, split_model
from hethpc.pipeline.errors import PipelineError
from hethpc.pipeline.groups import make_pipeline_groups
from hethpc.pipeline.profile import partition_by_time
from hethpc.pipeline.schedule import (
    BACKWARD,
    FORWARD,
    WEIGHT,
    has_weight_passes,
    make_schedule,
    stage_tasks,
)
from hethpc.sync.averaging import average_gradients_

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

# comm's point-to-point uses tags 2*tag and 2*tag+1; MPI guarantees tags up to 32767.
MAX_MICRO_BATCHES = 4096


def default_device() -> torch.device:
    """``cuda:<local rank>`` when a GPU is visible, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", comm.local_rank() % torch.cuda.device_count())
    return torch.device("cpu")


@dataclass(frozen=True)
class StepStats:
    """Timings of this rank's last :meth:`Pipeline.train_step`.

    Attributes:
        step_s: wall seconds of the whole step (communication and waiting included).
        busy_s: seconds spent computing forward and backward passes.
        peak_in_flight: most micro-batches whose activations this stage held at once.
        forward_s: the part of ``busy_s`` spent in forward passes (recomputation excluded).
        wait_s: seconds spent waiting for activations or gradients from the neighbours.
    """

    step_s: float
    busy_s: float
    peak_in_flight: int
    forward_s: float = 0.0
    wait_s: float = 0.0

    @property
    def idle_fraction(self) -> float:
        """Share of the step this stage was not computing."""
        return 1.0 - self.busy_s / self.step_s if self.step_s > 0 else 0.0


def _tag(micro_batch: int, kind: str) -> int:
    # Unique per (micro-batch, direction); messages of successive steps reuse tags, which is
    # safe because MPI delivers messages between two ranks with one tag in order.
    return 2 * micro_batch + (0 if kind == FORWARD else 1)


class Pipeline:
    """This rank's stage of a model cut into stages across the ranks of ``stage_group``.

    Every rank builds the same whole model (same seed) and keeps the layers of its stage.
    ``train_step`` splits the batch into micro-batches, runs the schedule, and leaves on
    the stage's parameters the gradient of the whole batch's mean loss, exactly as one
    process running the whole model would (up to float rounding). Layers that mix samples
    of a batch (BatchNorm in training) see micro-batches instead and so differ.

    Args:
        model: the whole model; its layers are cut by ``balance``.
        balance: layers per stage, one entry per rank of ``stage_group``.
        micro_batches: m, micro-batches per batch (1..4096); batches need at least m rows.
        schedule: "1f1b" (at most P micro-batches of activations per stage), "gpipe", or
            "zb" (ZB-H1: 1F1B whose stages other than the first run each backward as B, the
            input's gradient, sent at once, and W, the weights' gradients, later, where 1F1B
            would wait; needs ``split_backward``, else each W is empty and it runs as 1F1B).
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
        if len(balance) != stage_group.size:
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
        if not 1 <= micro_batches <= MAX_MICRO_BATCHES:
            raise PipelineError(
                f"micro_batches must be in 1..{MAX_MICRO_BATCHES}, got {micro_batches}"
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
        self.module = split_model(model, balance)[self.stage].to(self.device)
        self.split_backward = bool(split_backward) and self.stage > 0 and can_split(self.module)
        # the schedule's W passes compute the weights' gradients (else B computes them)
        self._deferred_weights = self.split_backward and has_weight_passes(self.table, self.stage)
        self.stats = StepStats(0.0, 0.0, 0)
        self._task_s: float | None = None  # mean forward or backward pass, last step

    @property
    def is_first(self) -> bool:
        """Whether this rank runs the first stage (it needs the inputs)."""
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        """Whether this rank runs the last stage (it needs the targets; it has the loss)."""
        return self.stage == self.stages - 1

    @property
    def current_progress_interval(self) -> float | None:
        """The progress thread's interval for the next step (None: no thread)."""
        if self.progress_interval == "auto":
            return auto_interval(self._task_s)
        return None if self.progress_interval is None else float(self.progress_interval)

    def parameters(self) -> Iterator[nn.Parameter]:
        """This stage's parameters (give them to the optimizer)."""
        return self.module.parameters()

    def state_dict(self) -> dict[str, Any]:
        """This stage's parameters and buffers."""
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
            y: the targets ``[N, ...]``; needed on the last stage (ignored elsewhere).
            loss_fn: ``loss_fn(output, target)`` returning the MEAN loss over its rows
                (e.g. ``nn.CrossEntropyLoss()``); micro-batch losses are weighted by their
                share of the batch so the sum is the batch's mean loss.
            dp_weight: with a ``dp_group``: None averages the replicas' gradients; a number
                (this replica's share of the global batch, b_k / B) scales them before a sum.

        Returns:
            The batch's mean loss on the last stage, None on the others.

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
        g, dev, s = self.stage_group, self.device, self.stage
        inputs: dict[int, torch.Tensor] = {}
        outputs: dict[int, torch.Tensor] = {}
        taps: dict[int, Any] = {}  # split backward: each micro-batch's layer outputs
        weights: dict[int, Any] = {}  # taps and their output gradients, awaiting W
        rng: dict[int, Any] = {}
        loss_sum = torch.zeros((), dtype=torch.float64)
        busy = fwd = 0.0
        live = peak = 0
        with Progress(interval=self.current_progress_interval) as net:
            acts, grads = self._post_receives(net)
            for task in self._tasks:
                i = task.micro_batch
                if task.kind == FORWARD:
                    if self.is_first:
                        inp = xs[i].to(dev)  # type: ignore[union-attr]
                    else:
                        inp = acts.take(i)  # type: ignore[union-attr]
                        if inp.is_floating_point():
                            inp.requires_grad_(True)
                    t0 = time.perf_counter()
                    if self.checkpoint:
                        rng[i] = _rng_state(dev)
                        with torch.no_grad():
                            out, _ = self._forward(inp, ys[i], n, loss_fn)
                    else:
                        out, taps[i] = self._forward(inp, ys[i], n, loss_fn)
                    dt = self._elapsed(t0)
                    busy += dt
                    fwd += dt
                    if self.is_last:
                        loss_sum += out.detach().to("cpu", torch.float64)
                    else:
                        net.send(out, s + 1, tag=_tag(i, FORWARD), group=g)
                    inputs[i], outputs[i] = inp, out
                    live += 1
                    peak = max(peak, live)
                elif task.kind == WEIGHT:
                    if i in weights:  # else B computed them (a plain backward)
                        tap, tap_grads = weights.pop(i)
                        t0 = time.perf_counter()
                        weight_gradients(tap, tap_grads)
                        busy += self._elapsed(t0)
                        del tap, tap_grads
                        live -= 1
                else:
                    grad = None
                    if not self.is_last:
                        grad = grads.take(i)  # type: ignore[union-attr]
                    inp, out, tap = inputs.pop(i), outputs.pop(i), taps.pop(i, None)
                    t0 = time.perf_counter()
                    if self.checkpoint:
                        with _rng_restored(dev, rng.pop(i)):
                            out, tap = self._forward(inp, ys[i], n, loss_fn)
                    if tap is not None and out.requires_grad and inp.requires_grad:
                        # the input's gradient first, sent at once; the weights' after it
                        g_in, tap_grads = input_gradient(out, grad, inp, tap)
                        busy += self._elapsed(t0)
                        net.send(g_in, s - 1, tag=_tag(i, BACKWARD), group=g)
                        if self._deferred_weights:
                            weights[i] = (tap, tap_grads)
                            live += 1  # held until W; the decrement below is for B
                        else:
                            t0 = time.perf_counter()
                            weight_gradients(tap, tap_grads)
                            busy += self._elapsed(t0)
                        del tap_grads
                    else:
                        if out.requires_grad:
                            torch.autograd.backward(out, grad)
                        busy += self._elapsed(t0)
                        if not self.is_first:
                            g_in = inp.grad if inp.grad is not None else torch.zeros_like(inp)
                            net.send(g_in, s - 1, tag=_tag(i, BACKWARD), group=g)
                    del out, tap
                    live -= 1
        self._reduce_replicas(dp_weight)
        self._task_s = busy / len(self._tasks) if self._tasks else None
        self.stats = StepStats(time.perf_counter() - t_start, busy, peak, fwd, net.wait_s)
        return float(loss_sum) if self.is_last else None

    @torch.no_grad()
    def forward(self, x: torch.Tensor | None) -> torch.Tensor | None:
        """Inference: the model's output ``[N, ...]`` on the last stage, None on the others.

        Args:
            x: the inputs ``[N, ...]`` on the first stage (ignored elsewhere, may be None).
        """
        n = self._agree_batch(x, None, need_targets=False)
        g, dev, s = self.stage_group, self.device, self.stage
        xs = torch.tensor_split(x, self.micro_batches) if self.is_first and x is not None else None
        outs = []
        with Progress(interval=self.current_progress_interval) as net:
            for i in range(min(self.micro_batches, n)):
                if xs is not None:
                    inp = xs[i].to(dev)
                else:
                    inp = comm.recv_tensor(s - 1, tag=_tag(i, FORWARD), device=dev, group=g)
                out = self.module(inp)
                if self.is_last:
                    outs.append(out)
                else:
                    net.send(out, s + 1, tag=_tag(i, FORWARD), group=g)
        return torch.cat(outs) if self.is_last else None

    def _post_receives(self, net: Progress) -> tuple[Lookahead | None, Lookahead | None]:
        """Post this stage's receives ahead: activations from the left, gradients from the right."""
        depth = self.stages + 1  # enough to cover 1F1B's warm-up; bounded so memory stays flat
        acts = grads = None
        kw: dict[str, Any] = {"device": self.device, "group": self.stage_group, "depth": depth}
        if not self.is_first:
            order = [t.micro_batch for t in self._tasks if t.kind == FORWARD]
            tags = {i: _tag(i, FORWARD) for i in order}
            acts = Lookahead(net, order, tags, source=self.stage - 1, **kw)
        if not self.is_last:
            order = [t.micro_batch for t in self._tasks if t.kind == BACKWARD]
            tags = {i: _tag(i, BACKWARD) for i in order}
            grads = Lookahead(net, order, tags, source=self.stage + 1, **kw)
        return acts, grads

    def _forward(
        self, inp: torch.Tensor, target: torch.Tensor | None, n: int, loss_fn: LossFn
    ) -> tuple[torch.Tensor, Any]:
        """The stage's output (its loss share on the last stage), and its layers' outputs for
        the split backward (None when not splitting or without autograd)."""
        taps = None
        if self.split_backward and torch.is_grad_enabled() and inp.requires_grad:
            out, taps = tapped_forward(self.module, inp)
        else:
            out = self.module(inp)
        if not self.is_last:
            return out, taps
        assert target is not None
        return loss_fn(out, target.to(self.device)) * (inp.shape[0] / n), taps

    def _elapsed(self, t0: float) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter() - t0

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
        for stage, nx, ny in facts:
            if stage == 0:
                if nx is None:
                    problems.append("the first stage got no inputs x")
                else:
                    rows["inputs x on stage 0"] = nx
            if stage == self.stages - 1 and need_targets:
                if ny is None:
                    problems.append(f"the last stage ({stage}) got no targets y")
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


def _rng_state(device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda


@contextmanager
def _rng_restored(
    device: torch.device, state: tuple[torch.Tensor, torch.Tensor | None]
) -> Iterator[None]:
    """Replay the forward's random numbers (dropout) during recomputation."""
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.set_rng_state(state[0])
        if state[1] is not None:
            torch.cuda.set_rng_state(state[1], device)
        yield


def build_pipeline(
    model: nn.Sequential,
    *,
    stages: int,
    micro_batches: int,
    schedule: str = "1f1b",
    balance: Sequence[int] | str | None = None,
    sample: tuple[torch.Tensor, torch.Tensor] | None = None,
    loss_fn: LossFn | None = None,
    checkpoint: bool = False,
    device: torch.device | str | None = None,
    progress_interval: float | str | None = "auto",
    split_backward: bool = True,
) -> Pipeline:
    """Cut ``model`` into ``stages`` across the world (world = stages x replicas).

    Every world rank calls it with the same arguments. Replicas average their gradients.

    Args:
        model: the whole model, built identically (same seed) on every rank.
        stages: P; must divide the world size.
        micro_batches: m.
        schedule: "1f1b", "gpipe" or "zb".
        balance: layers per stage; or "params" (default, also None): balanced by parameter
            count; or "time": balanced by each layer's measured time on one micro-batch of
            ``sample`` (:func:`~hethpc.pipeline.profile.partition_by_time`: measured on world
            rank 0 and broadcast, so every rank cuts alike; the loss and the input gradients
            that stages after the first compute are counted).
        sample: with ``balance="time"``: a batch ``(x [N, ...], y [N, ...])`` like the
            training batches; its first ``N // micro_batches`` rows are timed.
        loss_fn: with ``balance="time"``: the training loss, timed on the last stage's output
            (None: not counted).
        checkpoint: recompute activations in the backward pass.
        device: default ``cuda:<local rank>`` when present, else CPU.
        progress_interval: see :class:`Pipeline` (None: no progress thread).
        split_backward: see :class:`Pipeline`.

    Raises:
        PipelineError: ``stages`` does not divide the world size, bad settings, or
            ``balance="time"`` without a ``sample``.
        BalanceError: the model cannot be cut that way.
    """
    groups = make_pipeline_groups(stages)
    if balance is None or balance == "params":
        balance = partition_by_params(model, stages)
    elif balance == "time":
        if sample is None:
            raise PipelineError(
                'balance="time" times the layers on a sample batch; pass sample=(x, y)'
            )
        dev = torch.device(device) if device is not None else default_device()
        rows = max(1, sample[0].shape[0] // micro_batches)
        balance = partition_by_time(
            model, stages, sample[0][:rows].to(dev), target=sample[1][:rows].to(dev),
            loss_fn=loss_fn,
        )  # fmt: skip
    elif isinstance(balance, str):
        raise PipelineError(
            f"balance must be 'params', 'time' or layers per stage, got {balance!r}"
        )
    return Pipeline(
        model,
        balance=balance,
        micro_batches=micro_batches,
        schedule=schedule,
        stage_group=groups.stage_group,
        dp_group=groups.dp_group,
        checkpoint=checkpoint,
        device=device,
        progress_interval=progress_interval,
        split_backward=split_backward,
    )
