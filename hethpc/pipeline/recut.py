"""Move a pipeline's checkpointed stage states from one cut to another: each stage rank's
parameters, buffers and optimizer state go to the rank that holds those layers under the new
cut. Pure: no communication; every rank computes its new state from all ranks' saved ones.

A stage keys its layers from 0 (``"0.weight"`` is the stage's first layer), or in a V
``"<k>.<j>.weight"`` for layer ``j`` of its ``k``-th chunk (:func:`~hethpc.pipeline.balance.
stage_module`); its optimizer keys per-parameter state by position in its groups. Both are
translated to the whole model's names (``"<layer>.weight"``) through a :func:`skeleton` of
the model (its structure on the meta device, no data) cut the old way, then back to stage keys
cut the new way. Nothing is recomputed: the moved tensors are the saved ones.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.nn.parameter import UninitializedBuffer, UninitializedParameter

from hethpc.pipeline.balance import stage_module

MakeOptimizer = Callable[[nn.Module], torch.optim.Optimizer]


def skeleton(model: nn.Sequential) -> nn.Sequential:
    """A copy of ``model`` whose parameters and buffers live on the meta device: its layers,
    names, shapes and ``requires_grad``, without their data (kept by a pipeline stage for a
    later :func:`move_stage_states`)."""
    memo: dict[int, Any] = {}
    for t in itertools.chain(model.parameters(), model.buffers()):
        if isinstance(t, (UninitializedParameter, UninitializedBuffer)):
            continue  # a lazy layer's, not yet materialised: it holds no data to leave out
        meta = torch.empty_like(t, device="meta")
        memo[id(t)] = nn.Parameter(meta, t.requires_grad) if isinstance(t, nn.Parameter) else meta
    return copy.deepcopy(model, memo)


def _whole_names(part: nn.Module, whole: nn.Module) -> dict[str, str]:
    """``part``'s state-dict keys -> ``whole``'s, for the tensors they share."""
    named = {id(t): k for k, t in whole.state_dict(keep_vars=True).items()}
    return {k: named[id(t)] for k, t in part.state_dict(keep_vars=True).items()}


def _group_names(
    part: nn.Module, names: Mapping[str, str], make_optimizer: MakeOptimizer
) -> list[list[str]]:
    """The whole model's names of the parameters of ``make_optimizer(part)``, group by group
    (the order its state dict numbers them in)."""
    own = {id(p): k for k, p in part.named_parameters()}
    optimizer = make_optimizer(part)
    return [[names[own[id(p)]] for p in g["params"]] for g in optimizer.param_groups]


def move_stage_states(
    saved: Sequence[Mapping[str, Any]],
    *,
    model: nn.Sequential,
    old: Sequence[int],
    new: Sequence[int],
    placement: Sequence[int],
    make_optimizer: MakeOptimizer,
) -> list[dict[str, Any]]:
    """Every world rank's saved state moved from cut ``old`` to cut ``new``.

    Args:
        saved: one entry per world rank (replica ``d``'s stage ``s`` at ``d * P + s``), each
            with this stage's ``"model"`` (state dict) and ``"optimizer"`` (optimizer state
            dict); other entries are kept as they are.
        model: the whole model or its :func:`skeleton` (only names and structure are read).
        old, new: layers per chunk, in chunk order, before and after.
        placement: the stage of each chunk (``range(P)``, or a V's).
        make_optimizer: builds the run's optimizer over a stage's layers (its groups and their
            order, as the run builds them; nothing is stepped).

    Returns:
        The entries of ``saved`` with ``"model"`` and ``"optimizer"`` for the new cut: each
        optimizer group keeps the hyperparameters (learning rate, decay, ...) its parameters
        had, each parameter its state (momentum, Adam's moments and step).

    Raises:
        ValueError: ``saved`` is not a whole number of replicas, or a saved optimizer's groups
            do not match the run's (another optimizer or grouping than the checkpoint's).
        BalanceError: a cut does not fit the model or the placement.
    """
    stages = max(placement) + 1
    if not saved or len(saved) % stages:
        raise ValueError(f"{len(saved)} saved ranks are not whole replicas of {stages} stages")
    was = [stage_module(model, old, placement, s) for s in range(stages)]
    now = [stage_module(model, new, placement, s) for s in range(stages)]
    was_names = [_whole_names(m, model) for m in was]
    now_names = [_whole_names(m, model) for m in now]
    was_groups = [_group_names(m, n, make_optimizer) for m, n in zip(was, was_names, strict=True)]
    now_groups = [_group_names(m, n, make_optimizer) for m, n in zip(now, now_names, strict=True)]
    out = [dict(s) for s in saved]
    for first in range(0, len(saved), stages):
        tensors: dict[str, Any] = {}
        per_param: dict[str, Any] = {}
        hyper: dict[str, dict[str, Any]] = {}
        for s in range(stages):
            entry = saved[first + s]
            for k, v in entry["model"].items():
                tensors[was_names[s][k]] = v
            groups = entry["optimizer"]["param_groups"]
            sizes = [len(g["params"]) for g in groups]
            if sizes != [len(g) for g in was_groups[s]]:
                raise ValueError(
                    f"rank {first + s}'s saved optimizer has groups of {sizes} parameters, but "
                    f"the run's optimizer groups that stage's as {[len(g) for g in was_groups[s]]}"
                    "; resume with the checkpoint's optimizer settings"
                )
            position = [n for g in was_groups[s] for n in g]
            for i, state in entry["optimizer"]["state"].items():
                per_param[position[int(i)]] = state
            for group, names in zip(groups, was_groups[s], strict=True):
                for n in names:
                    hyper[n] = {k: v for k, v in group.items() if k != "params"}
        for s in range(stages):
            moved_groups: list[dict[str, Any]] = []
            moved_state: dict[int, Any] = {}
            i = 0
            for names in now_groups[s]:
                moved_groups.append({**hyper[names[0]], "params": list(range(i, i + len(names)))})
                for j, n in enumerate(names, start=i):
                    if n in per_param:
                        moved_state[j] = per_param[n]
                i += len(names)
            out[first + s]["model"] = {k: tensors[w] for k, w in now_names[s].items()}
            out[first + s]["optimizer"] = {"state": moved_state, "param_groups": moved_groups}
    return out
