"""The schedule runner: walk a stage's F/B/W tasks, move tensors between neighbours, time them.

:func:`run_step` takes one stage (:class:`~hethpc.pipeline.stage.Stage`) and its tasks from a
schedule table (:mod:`hethpc.pipeline.schedule`) and runs one batch: it posts the receives
ahead, feeds each pass its input (the batch's micro-batch on the first stage, a neighbour's
message elsewhere), sends each output and input gradient as soon as it exists, keeps the
activations alive from F to B (or W), and fills the step's :class:`StepStats`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from hethpc import comm
from hethpc.comm import Group
from hethpc.comm.progress import Lookahead, Progress
from hethpc.pipeline.rng import rng_state
from hethpc.pipeline.schedule import BACKWARD, FORWARD, WEIGHT, Task
from hethpc.pipeline.stage import LossFn, Stage


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


def tag(micro_batch: int, kind: str) -> int:
    """The message tag of a micro-batch's activation (F) or gradient (B)."""
    # Unique per (micro-batch, direction); messages of successive steps reuse tags, which is
    # safe because MPI delivers messages between two ranks with one tag in order.
    return 2 * micro_batch + (0 if kind == FORWARD else 1)


def run_step(
    stage: Stage,
    tasks: Sequence[Task],
    group: Group,
    xs: Sequence[torch.Tensor | None],
    ys: Sequence[torch.Tensor | None],
    n: int,
    loss_fn: LossFn,
    *,
    checkpoint: bool,
    defer_weights: bool,
    interval: float | None,
) -> tuple[float, StepStats]:
    """Run this stage's ``tasks`` on one batch; gradients accumulate on its parameters.

    Args:
        stage: this rank's stage; its index is its rank in ``group``.
        tasks: the stage's F/B/W passes in the order it runs them.
        group: the pipeline's ranks, in stage order.
        xs: the micro-batches' inputs (used on the first stage).
        ys: the micro-batches' targets (used on the last stage).
        n: rows in the whole batch (each micro-batch's loss is weighted by its share).
        loss_fn: the mean loss over a micro-batch's rows.
        checkpoint: keep no activations from F; recompute them in B.
        defer_weights: the split backward's weight gradients wait for the W tasks (else B
            computes them).
        interval: seconds between the progress thread's tests (None: no thread).

    Returns:
        The sum of the micro-batches' weighted losses (0 except on the last stage), and the
        step's statistics (``step_s`` counts from the call).
    """
    t_start = time.perf_counter()
    s, dev = stage.index, stage.device
    inputs: dict[int, torch.Tensor] = {}
    outputs: dict[int, torch.Tensor] = {}
    taps: dict[int, Any] = {}  # split backward: each micro-batch's layer outputs
    weights: dict[int, Any] = {}  # taps and their output gradients, awaiting W
    rng: dict[int, Any] = {}
    loss_sum = torch.zeros((), dtype=torch.float64)
    busy = fwd = 0.0
    live = peak = 0
    with Progress(interval=interval) as net:
        acts, grads = _post_receives(stage, tasks, group, net)
        for task in tasks:
            i = task.micro_batch
            if task.kind == FORWARD:
                if stage.is_first:
                    inp = xs[i].to(dev)  # type: ignore[union-attr]
                else:
                    inp = acts.take(i)  # type: ignore[union-attr]
                    if inp.is_floating_point():
                        inp.requires_grad_(True)
                t0 = time.perf_counter()
                if checkpoint:
                    rng[i] = rng_state(dev)
                    with torch.no_grad():
                        out, _ = stage.forward(inp, ys[i], n, loss_fn)
                else:
                    out, taps[i] = stage.forward(inp, ys[i], n, loss_fn)
                dt = stage.elapsed(t0)
                busy += dt
                fwd += dt
                if stage.is_last:
                    loss_sum += out.detach().to("cpu", torch.float64)
                else:
                    net.send(out, s + 1, tag=tag(i, FORWARD), group=group)
                inputs[i], outputs[i] = inp, out
                live += 1
                peak = max(peak, live)
            elif task.kind == WEIGHT:
                if i in weights:  # else B computed them (a plain backward)
                    pending = weights.pop(i)
                    t0 = time.perf_counter()
                    stage.backward_weights(pending)
                    busy += stage.elapsed(t0)
                    del pending
                    live -= 1
            else:
                grad = None
                if not stage.is_last:
                    grad = grads.take(i)  # type: ignore[union-attr]
                inp, out, tap = inputs.pop(i), outputs.pop(i), taps.pop(i, None)
                t0 = time.perf_counter()
                if checkpoint:
                    out, tap = stage.recompute(inp, ys[i], n, loss_fn, rng.pop(i))
                g_in, pending = stage.backward_input(inp, out, tap, grad)
                busy += stage.elapsed(t0)
                if g_in is not None:  # the input's gradient first, sent at once
                    net.send(g_in, s - 1, tag=tag(i, BACKWARD), group=group)
                if pending is not None and defer_weights:
                    weights[i] = pending
                    live += 1  # held until W; the decrement below is for B
                elif pending is not None:
                    t0 = time.perf_counter()
                    stage.backward_weights(pending)
                    busy += stage.elapsed(t0)
                del out, tap, pending
                live -= 1
    step_s = time.perf_counter() - t_start
    return float(loss_sum), StepStats(step_s, busy, peak, fwd, net.wait_s)


def run_forward(
    stage: Stage,
    group: Group,
    xs: Sequence[torch.Tensor] | None,
    count: int,
    *,
    interval: float | None,
) -> torch.Tensor | None:
    """Inference on ``count`` micro-batches (``xs`` on the first stage): the concatenated
    output on the last stage, None on the others. Runs without autograd."""
    s, dev = stage.index, stage.device
    outs = []
    with torch.no_grad(), Progress(interval=interval) as net:
        for i in range(count):
            if xs is not None:
                inp = xs[i].to(dev)
            else:
                inp = comm.recv_tensor(s - 1, tag=tag(i, FORWARD), device=dev, group=group)
            out = stage.module(inp)
            if stage.is_last:
                outs.append(out)
            else:
                net.send(out, s + 1, tag=tag(i, FORWARD), group=group)
    return torch.cat(outs) if stage.is_last else None


def _post_receives(
    stage: Stage, tasks: Sequence[Task], group: Group, net: Progress
) -> tuple[Lookahead | None, Lookahead | None]:
    """Post this stage's receives ahead: activations from the left, gradients from the right."""
    depth = stage.stages + 1  # enough to cover 1F1B's warm-up; bounded so memory stays flat
    acts = grads = None
    kw: dict[str, Any] = {"device": stage.device, "group": group, "depth": depth}
    if not stage.is_first:
        order = [t.micro_batch for t in tasks if t.kind == FORWARD]
        tags = {i: tag(i, FORWARD) for i in order}
        acts = Lookahead(net, order, tags, source=stage.index - 1, **kw)
    if not stage.is_last:
        order = [t.micro_batch for t in tasks if t.kind == BACKWARD]
        tags = {i: tag(i, BACKWARD) for i in order}
        grads = Lookahead(net, order, tags, source=stage.index + 1, **kw)
    return acts, grads
