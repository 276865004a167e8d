"""The schedule runner: walk a stage's F/B/W tasks, move tensors between neighbours, time them.

:func:`run_step` takes this rank's stages (:class:`~hethpc.pipeline.stage.Stage`: one, or the
two chunks of a V) and their tasks from a schedule table (:mod:`hethpc.pipeline.schedule`) and
runs one batch: it posts the receives ahead, feeds each pass its input (the batch's
micro-batch in the first chunk, a neighbour's message elsewhere, or the other chunk's output
where both run on this rank), sends each output and input gradient as soon as it exists, keeps
the activations alive from F to B (or W), and fills the step's :class:`StepStats`.
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
from hethpc.pipeline.schedule import BACKWARD, FORWARD, WEIGHT, Task, chunk_of
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


def tag(micro_batch: int, kind: str, lane: int = 0, lanes: int = 1) -> int:
    """The message tag of a micro-batch's activation (F) or gradient (B) on ``lane``.

    Where each stage holds one chunk there is one lane; a V (two chunks per stage) has two, the
    way down (0) and the way back up (1), so tags are unique per chunk, micro-batch and
    direction. Messages of successive steps reuse tags, which is safe because MPI delivers
    messages between two ranks with one tag in order.
    """
    return 2 * (lanes * micro_batch + lane) + (0 if kind == FORWARD else 1)


class _Links:
    """Where this rank's chunks send and receive: the neighbour chunks' group ranks.

    Args:
        placement: ``placement[c]``, the group rank running chunk ``c``.
        rank: this rank in the pipeline group.
        v: the chunks lie in a V (two per rank), else one per rank.
    """

    def __init__(self, placement: Sequence[int], rank: int, *, v: bool) -> None:
        self.placement, self.rank, self.v = list(placement), rank, v

    def remote(self, chunk: int) -> bool:
        """Whether ``chunk`` runs on another rank."""
        return self.placement[chunk] != self.rank

    def tag(self, micro_batch: int, kind: str, boundary: int) -> int:
        """The tag of the message crossing ``boundary`` (between chunks ``boundary`` and
        ``boundary + 1``)."""
        lane, lanes = (int(boundary >= len(self.placement) // 2), 2) if self.v else (0, 1)
        return tag(micro_batch, kind, lane, lanes)


def run_step(
    stages: Sequence[Stage],
    tasks: Sequence[Task],
    group: Group,
    xs: Sequence[torch.Tensor | None],
    ys: Sequence[torch.Tensor | None],
    n: int,
    loss_fn: LossFn,
    *,
    placement: Sequence[int],
    checkpoint: bool,
    defer_weights: bool,
    interval: float | None,
) -> tuple[float, StepStats]:
    """Run this rank's ``tasks`` on one batch; gradients accumulate on its chunks' parameters.

    Args:
        stages: this rank's chunks (one, or two in a V); each one's index is its chunk's.
        tasks: the rank's F/B/W passes in the order it runs them (``chunk_of`` names the
            chunk of each).
        group: the pipeline's ranks, in stage order.
        xs: the micro-batches' inputs (used by the first chunk).
        ys: the micro-batches' targets (used by the last chunk).
        n: rows in the whole batch (each micro-batch's loss is weighted by its share).
        loss_fn: the mean loss over a micro-batch's rows.
        placement: ``placement[c]``, the group rank running chunk ``c``; a chunk's output
            for a chunk on the same rank is handed over locally, without MPI.
        checkpoint: keep no activations from F; recompute them in B.
        defer_weights: the split backward's weight gradients wait for the W tasks (else B
            computes them).
        interval: seconds between the progress thread's tests (None: no thread).

    Returns:
        The sum of the micro-batches' weighted losses (0 except on the rank of the last
        chunk), and the step's statistics (``step_s`` counts from the call).
    """
    t_start = time.perf_counter()
    me = group.rank
    links = _Links(placement, me, v=len(placement) > group.size)
    by_chunk = {st.index: st for st in stages}
    last = len(placement) - 1
    Key = tuple[int, int]  # (chunk, micro_batch)
    inputs: dict[Key, torch.Tensor] = {}
    outputs: dict[Key, torch.Tensor] = {}
    taps: dict[Key, Any] = {}  # split backward: each micro-batch's layer outputs
    weights: dict[Key, Any] = {}  # taps and their output gradients, awaiting W
    rng: dict[Key, Any] = {}
    local: dict[tuple[int, int, str], torch.Tensor] = {}  # hand-offs between this rank's chunks
    loss_sum = torch.zeros((), dtype=torch.float64)
    busy = fwd = 0.0
    live = peak = 0
    with Progress(interval=interval) as net:
        acts, grads = _post_receives(stages, tasks, group, net, links)
        for task in tasks:
            i, c = task.micro_batch, chunk_of(task)
            stage, key = by_chunk[c], (c, i)
            dev = stage.device
            if task.kind == FORWARD:
                if stage.is_first:
                    inp = xs[i].to(dev)  # type: ignore[union-attr]
                else:
                    if links.remote(c - 1):
                        inp = acts[c].take(i)
                    else:  # a leaf, as a received activation is: B returns its gradient
                        inp = local.pop((c, i, FORWARD)).detach()
                    if inp.is_floating_point():
                        inp.requires_grad_(True)
                t0 = time.perf_counter()
                if checkpoint:
                    rng[key] = rng_state(dev)
                    with torch.no_grad():
                        out, _ = stage.forward(inp, ys[i], n, loss_fn)
                else:
                    out, taps[key] = stage.forward(inp, ys[i], n, loss_fn)
                dt = stage.elapsed(t0)
                busy += dt
                fwd += dt
                if stage.is_last:
                    loss_sum += out.detach().to("cpu", torch.float64)
                elif links.remote(c + 1):
                    net.send(out, placement[c + 1], tag=links.tag(i, FORWARD, c), group=group)
                else:
                    local[c + 1, i, FORWARD] = out
                inputs[key], outputs[key] = inp, out
                live += 1
                peak = max(peak, live)
            elif task.kind == WEIGHT:
                if key in weights:  # else B computed them (a plain backward)
                    pending = weights.pop(key)
                    t0 = time.perf_counter()
                    stage.backward_weights(pending)
                    busy += stage.elapsed(t0)
                    del pending
                    live -= 1
            else:
                grad = None
                if c < last:
                    remote = links.remote(c + 1)
                    grad = grads[c].take(i) if remote else local.pop((c, i, BACKWARD))
                inp, out, tap = inputs.pop(key), outputs.pop(key), taps.pop(key, None)
                t0 = time.perf_counter()
                if checkpoint:
                    out, tap = stage.recompute(inp, ys[i], n, loss_fn, rng.pop(key))
                g_in, pending = stage.backward_input(inp, out, tap, grad)
                busy += stage.elapsed(t0)
                if g_in is not None and links.remote(c - 1):  # the input's gradient first
                    net.send(g_in, placement[c - 1], tag=links.tag(i, BACKWARD, c - 1),
                             group=group)  # fmt: skip
                elif g_in is not None:
                    local[c - 1, i, BACKWARD] = g_in
                if pending is not None and defer_weights:
                    weights[key] = pending
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
    stages: Sequence[Stage],
    group: Group,
    xs: Sequence[torch.Tensor] | None,
    count: int,
    *,
    placement: Sequence[int],
    interval: float | None,
) -> torch.Tensor | None:
    """Inference on ``count`` micro-batches (``xs`` where the first chunk runs): the
    concatenated output on the rank of the last chunk, None on the others. Runs without
    autograd.

    Each rank runs its chunks in chunk order, all micro-batches of one before the next: a
    chunk then only waits for chunks of lower index, which never wait for it.
    """
    me = group.rank
    links = _Links(placement, me, v=len(placement) > group.size)
    outs = []
    local: dict[tuple[int, int], torch.Tensor] = {}
    with torch.no_grad(), Progress(interval=interval) as net:
        for stage in sorted(stages, key=lambda st: st.index):
            c, dev = stage.index, stage.device
            for i in range(count):
                if stage.is_first:
                    assert xs is not None
                    inp = xs[i].to(dev)
                elif links.remote(c - 1):
                    inp = comm.recv_tensor(placement[c - 1], tag=links.tag(i, FORWARD, c - 1),
                                           device=dev, group=group)  # fmt: skip
                else:
                    inp = local.pop((c, i))
                out = stage.module(inp)
                if stage.is_last:
                    outs.append(out)
                elif links.remote(c + 1):
                    net.send(out, placement[c + 1], tag=links.tag(i, FORWARD, c), group=group)
                else:
                    local[c + 1, i] = out
    return torch.cat(outs) if outs else None


def _post_receives(
    stages: Sequence[Stage],
    tasks: Sequence[Task],
    group: Group,
    net: Progress,
    links: _Links,
) -> tuple[dict[int, Lookahead], dict[int, Lookahead]]:
    """Post each chunk's receives ahead: activations from the chunk before it, gradients from
    the chunk after it, where that chunk runs on another rank."""
    acts: dict[int, Lookahead] = {}
    grads: dict[int, Lookahead] = {}
    for stage in stages:
        c = stage.index
        depth = stage.stages + 1  # enough to cover 1F1B's warm-up; bounded so memory stays flat
        kw: dict[str, Any] = {"device": stage.device, "group": group, "depth": depth}
        mine = [t for t in tasks if chunk_of(t) == c]
        if not stage.is_first and links.remote(c - 1):
            order = [t.micro_batch for t in mine if t.kind == FORWARD]
            tags = {i: links.tag(i, FORWARD, c - 1) for i in order}
            acts[c] = Lookahead(net, order, tags, source=links.placement[c - 1], **kw)
        if not stage.is_last and links.remote(c + 1):
            order = [t.micro_batch for t in mine if t.kind == BACKWARD]
            tags = {i: links.tag(i, BACKWARD, c) for i in order}
            grads[c] = Lookahead(net, order, tags, source=links.placement[c + 1], **kw)
    return acts, grads
