"""Measure each layer's forward + backward time, and balance stages by it (on one rank).

A layer costs more on some stages than on others: a stage after the first receives an input
that needs a gradient, so its first layer computes one (for a Linear, one more matmul); on the
first stage the data needs none, so the layers up to and including the first one with trainable
parameters compute none; the last stage also runs the loss. :func:`profile_layers` measures
each of these costs, and :meth:`LayerProfile.balance` splits the layers so that the slowest
stage, so counted, is as fast as possible (the bound on any schedule's speedup). Timings differ
between ranks and between runs: :func:`profile_layers` measures on one rank and broadcasts, so
every rank cuts the model the same way; :func:`partition_by_speed` measures on every rank and
gives each stage as much as its own rank's speed allows (ranks of unequal speed), each rank
cutting alike from the same gathered profiles.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from hethpc import comm
from hethpc.comm import Group
from hethpc.pipeline.balance import balance_chunks, balance_costs, chunk_costs, stage_costs
from hethpc.pipeline.errors import BalanceError

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class LayerProfile:
    """Measured seconds per layer of one micro-batch's forward and backward.

    Attributes:
        layer_s: each layer with its input's gradient (as on stages after the first).
        first_stage_s: each layer as on the first stage, where the data's gradient is not
            computed (differs from ``layer_s`` up to the first layer with trainable parameters).
        loss_s: the loss's forward and backward on the model's output (the last stage's).
        trainable: whether each layer holds trainable parameters (empty: not known); the
            balance gives every stage one when there are enough.
        saved_bytes: the bytes each layer keeps for its backward pass on the micro-batch
            (its activations, parameters not counted; empty: not measured).
        param_bytes: each layer's trainable parameters, bytes.
    """

    layer_s: tuple[float, ...]
    first_stage_s: tuple[float, ...]
    loss_s: float = 0.0
    trainable: tuple[bool, ...] = ()
    saved_bytes: tuple[int, ...] = ()
    param_bytes: tuple[int, ...] = ()

    @property
    def whole_s(self) -> float:
        """The whole model on one rank: every layer as on the first stage, and the loss."""
        return sum(self.first_stage_s) + self.loss_s

    def balance(self, stages: int) -> tuple[int, ...]:
        """Layers per stage minimising the slowest stage's time (earliest cuts on ties).

        Raises:
            BalanceError: ``stages`` is out of range for the layers.
        """
        return balance_costs(
            self.layer_s, stages, first_costs=self.first_stage_s, last_extra=self.loss_s,
            holds=self.trainable or None,
        )

    def stage_s(self, balance: Sequence[int]) -> list[float]:
        """Each stage's seconds per micro-batch under ``balance``."""
        return stage_costs(
            self.layer_s, balance, first_costs=self.first_stage_s, last_extra=self.loss_s
        )


def profile_layers(
    model: nn.Sequential,
    sample: torch.Tensor,
    *,
    target: torch.Tensor | None = None,
    loss_fn: LossFn | None = None,
    repeats: int = 5,
    group: Group | None = None,
) -> LayerProfile:
    """Each layer's forward + backward seconds on ``sample``, measured on group rank 0.

    Every layer is run ``repeats`` times after one warm-up run, in each of the ways stages run
    it; the median is kept. The other ranks wait and receive rank 0's profile, so every rank
    gets the same one. Leaves no gradients on the model.

    Args:
        model: the layers to time, on the device they will run on.
        sample: one micro-batch of input ``[rows, ...]``, on the same device.
        target: the targets of ``sample`` ``[rows, ...]``, for timing ``loss_fn``.
        loss_fn: ``loss_fn(output, target)``; None (or no ``target``): the loss costs 0.
        repeats: timed runs per layer, at least 1.
        group: the ranks that get the profile (default: the world); all of them call this.
    """
    profile: LayerProfile | None = None
    if (group if group is not None else comm.world()).rank == 0:
        profile = _measure(model, sample, target, loss_fn, max(1, int(repeats)))
    got = comm.broadcast_object(profile, group=group)
    assert got is not None  # rank 0 measured it
    return got


def layer_times(
    model: nn.Sequential, sample: torch.Tensor, *, repeats: int = 3
) -> list[float]:
    """Measured forward + backward seconds per layer on ``sample`` (the median of ``repeats``),
    each layer computing its input's gradient; measured on this rank alone.

    Args:
        model: the layers to time, on the device they will run on.
        sample: one micro-batch of input, ``[batch, ...]``, on the same device.
        repeats: timed runs per layer after one warm-up run.
    """
    return list(_measure(model, sample, None, None, max(1, int(repeats))).layer_s)


def partition_by_time(
    model: nn.Sequential,
    stages: int,
    sample: torch.Tensor,
    *,
    target: torch.Tensor | None = None,
    loss_fn: LossFn | None = None,
    repeats: int = 5,
    group: Group | None = None,
) -> tuple[int, ...]:
    """Balance stages by measured time, so the slowest stage is as fast as possible.

    Measured on group rank 0 (:func:`profile_layers`), so every rank of ``group`` gets the
    same balance; all of them call this.

    Raises:
        BalanceError: ``stages`` is out of range for the model's layers.
    """
    profile = profile_layers(
        model, sample, target=target, loss_fn=loss_fn, repeats=repeats, group=group
    )
    return profile.balance(stages)


@dataclass(frozen=True)
class SpeedCosts:
    """Each layer's cost on the ranks of each chunk (the slowest of them), as
    :func:`measure_speeds` gathered them: what :func:`partition_by_speed` balances.

    Attributes:
        costs: per chunk, each layer's seconds on that chunk's slowest rank.
        first: each layer's seconds as in chunk 0 (no input gradient).
        last: the loss's seconds on the last chunk's slowest rank.
        holds: which layers hold trainable parameters.
        memory: per chunk, the bytes each layer needs there (:func:`layer_memory`; empty:
            memory not counted).
        limits: per chunk, the bytes its ranks have for its layers (None: no limit).
    """

    costs: tuple[tuple[float, ...], ...]
    first: tuple[float, ...]
    last: float
    holds: tuple[bool, ...]
    memory: tuple[tuple[float, ...], ...] = ()
    limits: tuple[float | None, ...] = ()

    def balance(self) -> tuple[int, ...]:
        """The layers per chunk minimising the slowest chunk (earliest cuts on ties), each
        chunk within its memory limit where there are limits.

        Raises:
            BalanceError: no cut fits the memory limits (the message says what is short).
        """
        return balance_chunks(
            self.costs, first_costs=self.first, last_extra=self.last, holds=self.holds or None,
            memory=self.memory or None, limits=self.limits or None,
        )  # fmt: skip

    def memory_use(self, balance: Sequence[int]) -> list[tuple[float, float | None]]:
        """Each chunk's (bytes needed, limit) under ``balance``; empty without memory."""
        if not self.memory:
            return []
        needs = chunk_costs(self.memory, balance)
        return list(zip(needs, self.limits or [None] * len(needs), strict=True))

    def fits(self, balance: Sequence[int]) -> bool:
        """Whether every chunk under ``balance`` is within its memory limit (none: True)."""
        return all(lim is None or need <= lim for need, lim in self.memory_use(balance))

    def slowest(self, balance: Sequence[int]) -> float:
        """The slowest chunk's seconds per micro-batch under ``balance``, at these speeds."""
        return max(chunk_costs(self.costs, balance, first_costs=self.first, last_extra=self.last))


@dataclass(frozen=True)
class MemoryBudget:
    """What the cut by speed keeps within each rank's memory (:func:`measure_speeds`).

    Attributes:
        left: the bytes this rank may still allocate (a GPU's free memory, on a CPU the
            cgroup's limit or a stated one less what the process holds); None: not known,
            which every rank refuses alike.
        in_flight: per chunk, the most micro-batches whose activations it holds at once
            under the schedule (:func:`~hethpc.pipeline.schedule.chunk_in_flight`).
        state_copies: bytes kept per byte of trainable parameter: the parameter, its
            gradient and the optimizer's state (SGD with momentum 3, Adam 4).
        share: of ``left``, what the layers may take (the rest: transients, communication
            buffers, the allocator's slack).
    """

    left: int | None
    in_flight: tuple[int, ...]
    state_copies: float = 3.0
    share: float = 0.8


def layer_memory(profile: LayerProfile, in_flight: int, state_copies: float) -> tuple[float, ...]:
    """Each layer's bytes on a chunk that holds ``in_flight`` micro-batches' activations: its
    saved activations times ``in_flight``, plus its parameters times ``state_copies``."""
    return tuple(
        a * in_flight + p * state_copies
        for a, p in zip(profile.saved_bytes, profile.param_bytes, strict=True)
    )


def measure_speeds(
    model: nn.Sequential,
    placement: Sequence[int],
    sample: torch.Tensor,
    *,
    target: torch.Tensor | None = None,
    loss_fn: LossFn | None = None,
    repeats: int = 5,
    memory: MemoryBudget | None = None,
) -> SpeedCosts:
    """Every world rank profiles every layer on itself (at once, each on its own device); the
    profiles are gathered, and chunk ``c`` is costed by the slowest of the ranks that run it
    (stage ``placement[c]`` of every replica: world ranks ``d * P + placement[c]``). All world
    ranks call this and get the same costs.

    Args:
        model: the layers, on this rank's device.
        placement: the stage of each chunk, in chunk order (``range(P)``, or a V's).
        sample: one micro-batch of input, on this rank's device.
        target, loss_fn, repeats: as in :func:`profile_layers`.
        memory: keep each chunk within the memory of the ranks that run it (the least of
            them, shared evenly among a stage's chunks in a V); None: memory not counted.

    Raises:
        BalanceError: on every rank alike, with ``memory``: a rank that does not know its
            memory (naming it and the fix).
    """
    mine = _measure(model, sample, target, loss_fn, max(1, int(repeats)))
    if sample.device.type == "cpu":  # a CPU quota stalls a rank now and then: count the stalls
        mine = _stretched(mine, _stall_factor(model, sample))
    left = memory.left if memory is not None else None
    gathered: list[tuple[LayerProfile, int | None]] = comm.allgather_object((mine, left))
    profiles = [p for p, _ in gathered]
    stages = max(placement) + 1
    replicas = max(1, len(profiles) // stages)

    def slowest(values: Callable[[LayerProfile], Sequence[float]], stage: int) -> tuple[float, ...]:
        ranks = [profiles[d * stages + stage] for d in range(replicas)]
        return tuple(max(v) for v in zip(*(values(p) for p in ranks), strict=True))

    mem: tuple[tuple[float, ...], ...] = ()
    limits: tuple[float | None, ...] = ()
    if memory is not None:
        unknown = [r for r, (_, b) in enumerate(gathered) if b is None]
        if unknown:
            raise BalanceError(
                f"the pipeline cut within memory needs every rank's memory, and rank(s) "
                f"{unknown} know none: on a CPU set a cgroup memory limit or memory_limit_gb "
                "(--memory-limit-gb) on those ranks; or max_rank_batch none"
            )
        per_stage = [placement.count(s) for s in range(stages)]
        mem = tuple(layer_memory(mine, memory.in_flight[c], memory.state_copies)
                    for c in range(len(placement)))  # fmt: skip
        limits = tuple(
            memory.share * min(int(gathered[d * stages + s][1] or 0) for d in range(replicas))
            / per_stage[s]
            for s in placement
        )
    return SpeedCosts(
        costs=tuple(slowest(lambda p: p.layer_s, s) for s in placement),
        first=slowest(lambda p: p.first_stage_s, placement[0]),
        last=max(profiles[d * stages + placement[-1]].loss_s for d in range(replicas)),
        holds=mine.trainable,
        memory=mem,
        limits=limits,
    )


def partition_by_speed(
    model: nn.Sequential, placement: Sequence[int], sample: torch.Tensor, **options: Any
) -> tuple[int, ...]:
    """Balance chunks by the time each layer takes on the rank that will run it, so that a
    slower rank gets less work: :func:`measure_speeds` (``options`` are its keywords: the
    target, the loss, the repeats, a memory budget), then :meth:`SpeedCosts.balance`. All
    world ranks call this and get the same balance.

    Raises:
        BalanceError: more chunks than layers, or no cut fits the memory.
    """
    return measure_speeds(model, placement, sample, **options).balance()


#: How long :func:`_stall_factor` runs whole passes: several periods of a CFS quota (100 ms).
STALL_WINDOW_S = 0.6


def _stall_factor(model: nn.Sequential, sample: torch.Tensor) -> float:
    """The mean over the median time of whole forward and backward passes run for
    :data:`STALL_WINDOW_S`: 1 on a rank that runs freely; about 2 on a rank capped at half a
    core, whose short passes run at full speed between stalls (a per-layer median of a few
    runs, shorter than the quota's period, never sees the cap)."""
    passes: list[float] = []
    end = time.perf_counter() + STALL_WINDOW_S
    while time.perf_counter() < end or len(passes) < 3:
        t0 = time.perf_counter()
        x = sample
        for layer in model:
            x = layer(x.detach().requires_grad_(x.is_floating_point()))
        if x.requires_grad:
            x.float().sum().backward()
        passes.append(time.perf_counter() - t0)
    model.zero_grad(set_to_none=True)
    return max(1.0, (sum(passes) / len(passes)) / _median(passes))


def _stretched(profile: LayerProfile, factor: float) -> LayerProfile:
    return replace(
        profile,
        layer_s=tuple(t * factor for t in profile.layer_s),
        first_stage_s=tuple(t * factor for t in profile.first_stage_s),
        loss_s=profile.loss_s * factor,
    )


def _measure(
    model: nn.Sequential,
    sample: torch.Tensor,
    target: torch.Tensor | None,
    loss_fn: LossFn | None,
    repeats: int,
) -> LayerProfile:
    dev = sample.device
    # Up to the first layer with trainable parameters, the whole model (and so the first
    # stage) computes no input gradient; from there on every layer does.
    trainable = [any(p.requires_grad for p in layer.parameters()) for layer in model]
    no_grad_upto = trainable.index(True) if True in trainable else len(model) - 1
    with_grad: list[list[float]] = [[] for _ in model]
    first: list[list[float]] = [[] for _ in model]
    grads: dict[tuple[int, bool], torch.Tensor] = {}
    loss_t: list[float] = []
    # Each run walks every layer, so that the host's drifting speed (10-30 % within seconds
    # on a shared machine) hits all layers alike instead of those timed last.
    saved = [0] * len(model)
    for run in range(repeats + 1):  # the first is a warm-up
        x = sample
        for k, layer in enumerate(model):
            with _on(layer, dev):  # one layer at a time on the device: the model may not fit
                if run == 0:  # the warm-up also counts what the layer keeps for backward
                    with _SavedBytes(layer) as count:
                        y = _timed(layer, x, x.is_floating_point(), grads, k, [], run, dev)
                    saved[k] = count.bytes
                else:
                    y = _timed(layer, x, x.is_floating_point(), grads, k, with_grad[k], run, dev)
                if k <= no_grad_upto:  # as on the first stage: the input needs no gradient
                    _timed(layer, x, False, grads, k, first[k], run, dev)
                layer.zero_grad(set_to_none=True)
            x = y
        if loss_fn is not None and target is not None:
            out = x.detach().requires_grad_(x.is_floating_point())
            _sync(dev)
            t0 = time.perf_counter()
            loss = loss_fn(out, target)
            if loss.requires_grad:
                loss.backward()
            _sync(dev)
            if run > 0:
                loss_t.append(time.perf_counter() - t0)
    layer_s = tuple(_median(t) for t in with_grad)
    first_s = tuple(_median(t) if t else layer_s[k] for k, t in enumerate(first))
    params = tuple(
        sum(p.numel() * p.element_size() for p in layer.parameters() if p.requires_grad)
        for layer in model
    )
    return LayerProfile(layer_s, first_s, _median(loss_t) if loss_t else 0.0, tuple(trainable),
                        tuple(saved), params)  # fmt: skip


class _SavedBytes:
    """Context manager: the bytes autograd keeps for backward inside it, each storage once,
    ``layer``'s parameters not counted (they are there whatever the batch)."""

    def __init__(self, layer: nn.Module) -> None:
        self._params = {p.untyped_storage().data_ptr() for p in layer.parameters()}
        self._seen: dict[int, int] = {}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    @property
    def bytes(self) -> int:
        return sum(self._seen.values())

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in self._params:
            self._seen[storage.data_ptr()] = storage.nbytes()
        return t

    def __enter__(self) -> _SavedBytes:
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._hooks.__exit__(*exc)


@contextmanager
def _on(layer: nn.Module, device: torch.device) -> Iterator[None]:
    """``layer`` moved to ``device`` for the block, then back where it was."""
    here = next(iter([*layer.parameters(), *layer.buffers()]), None)
    home = here.device if here is not None else device
    layer.to(device)
    try:
        yield
    finally:
        layer.to(home)


def _timed(
    layer: nn.Module,
    x: torch.Tensor,
    input_grad: bool,
    grads: dict[tuple[int, bool], torch.Tensor],
    k: int,
    into: list[float],
    run: int,
    dev: torch.device,
) -> torch.Tensor:
    """``layer(x)`` forward and backward, its seconds appended to ``into`` after the warm-up
    run 0; returns the output."""
    x_in = x.detach().requires_grad_(input_grad)
    _sync(dev)
    t0 = time.perf_counter()
    y = layer(x_in)
    if y.requires_grad:
        if (k, input_grad) not in grads:  # made in the warm-up run, outside the timed runs
            grads[k, input_grad] = torch.ones_like(y)
        y.backward(grads[k, input_grad])
    _sync(dev)
    if run > 0:
        into.append(time.perf_counter() - t0)
    return y.detach()


def _median(values: Sequence[float]) -> float:
    return sorted(values)[len(values) // 2]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
