"""Cut an ``nn.Sequential`` into contiguous stages: by counts, parameters or measured time."""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
from torch import nn

from hethpc.pipeline.errors import BalanceError


def partition_by_counts(num_layers: int, counts: Sequence[int]) -> tuple[int, ...]:
    """Validate an explicit split: ``counts[s]`` layers go to stage ``s``, in order.

    Args:
        num_layers: layers in the ``nn.Sequential``.
        counts: layers per stage; each at least 1, summing to ``num_layers``.

    Returns:
        The balance as a tuple of ints.

    Raises:
        BalanceError: a count is below 1, or the counts do not add up to ``num_layers``.
    """
    balance = tuple(int(c) for c in counts)
    if not balance:
        raise BalanceError("the balance is empty; give one layer count per stage, e.g. [2, 3]")
    if any(c < 1 for c in balance):
        raise BalanceError(
            f"every stage needs at least one layer, got balance {list(balance)}; "
            "use fewer stages or move layers to the empty ones"
        )
    if sum(balance) != num_layers:
        raise BalanceError(
            f"balance {list(balance)} covers {sum(balance)} layers but the model has "
            f"{num_layers}; the counts must add up to the number of layers"
        )
    return balance


def balance_costs(costs: Sequence[float], stages: int) -> tuple[int, ...]:
    """Split ``costs`` into ``stages`` contiguous non-empty runs minimising the largest sum.

    Exact dynamic programme, O(n^2 * stages); among equally good splits the one with the
    earliest cut points wins, so every rank computes the same answer.

    Args:
        costs: one non-negative cost per layer (parameters, seconds, ...).
        stages: number of stages, 1 <= stages <= len(costs).

    Returns:
        Layers per stage.

    Raises:
        BalanceError: ``stages`` is out of range or a cost is negative.
    """
    n = len(costs)
    if stages < 1:
        raise BalanceError(f"stages must be at least 1, got {stages}")
    if stages > n:
        raise BalanceError(
            f"cannot cut {n} layers into {stages} stages (each stage needs a layer); "
            f"use at most {n} stages or a model with more layers"
        )
    c = [float(v) for v in costs]
    if any(v < 0 for v in c):
        raise BalanceError(f"layer costs must be non-negative, got {c}")
    prefix = [0.0]
    for v in c:
        prefix.append(prefix[-1] + v)
    inf = float("inf")
    # best[k][i]: smallest max-stage cost of the first i layers in k stages;
    # cut[k][i]: where stage k starts in that split.
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for k in range(1, stages + 1):
        for i in range(k, n - (stages - k) + 1):
            for j in range(k - 1, i):
                cost = max(best[k - 1][j], prefix[i] - prefix[j])
                if cost < best[k][i] - 1e-12 * max(1.0, abs(cost)):
                    best[k][i], cut[k][i] = cost, j
    bounds = [n]
    for k in range(stages, 0, -1):
        bounds.append(cut[k][bounds[-1]])
    bounds.reverse()
    return tuple(bounds[s + 1] - bounds[s] for s in range(stages))


def partition_by_params(model: nn.Sequential, stages: int) -> tuple[int, ...]:
    """Balance stages by parameter count (a proxy for memory and, often, for time).

    Raises:
        BalanceError: ``stages`` is out of range for the model's layers.
    """
    costs = [sum(p.numel() for p in layer.parameters()) for layer in model]
    return balance_costs(costs, stages)


def layer_times(
    model: nn.Sequential, sample: torch.Tensor, *, repeats: int = 3
) -> list[float]:
    """Measured forward + backward seconds per layer on ``sample`` (the median of ``repeats``).

    Args:
        model: the layers to time, on the device they will run on.
        sample: one micro-batch of input, ``[batch, ...]``, on the same device.
        repeats: timed runs per layer after one warm-up run.
    """
    times: list[list[float]] = [[] for _ in model]
    for run in range(repeats + 1):
        x = sample
        for k, layer in enumerate(model):
            x_in = x.detach().requires_grad_(x.is_floating_point())
            _sync(sample.device)
            t0 = time.perf_counter()
            y = layer(x_in)
            if y.requires_grad:
                y.backward(torch.ones_like(y))
            _sync(sample.device)
            if run > 0:
                times[k].append(time.perf_counter() - t0)
            x = y.detach()
    model.zero_grad(set_to_none=True)
    return [sorted(t)[len(t) // 2] for t in times]


def partition_by_time(
    model: nn.Sequential, stages: int, sample: torch.Tensor, *, repeats: int = 3
) -> tuple[int, ...]:
    """Balance stages by measured time per layer, so the slowest stage is as fast as possible.

    Timings differ between ranks: measure on one rank and broadcast the balance (or the
    times) so that every rank cuts the model the same way.

    Raises:
        BalanceError: ``stages`` is out of range for the model's layers.
    """
    return balance_costs(layer_times(model, sample, repeats=repeats), stages)


def split_model(model: nn.Sequential, balance: Sequence[int]) -> list[nn.Sequential]:
    """The stages of ``model`` as ``nn.Sequential`` objects sharing its layers.

    Raises:
        BalanceError: ``balance`` does not cover the model's layers exactly.
    """
    balance = partition_by_counts(len(model), balance)
    layers = list(model)
    out, start = [], 0
    for count in balance:
        out.append(nn.Sequential(*layers[start : start + count]))
        start += count
    return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
