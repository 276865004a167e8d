"""Moving a pipeline's stage states to another cut: the training that follows is the same as
without the move, bit for bit; chunk costs and stage modules as the pipeline keys them."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import pytest
import torch
from torch import nn

from hethpc.pipeline import BalanceError
from hethpc.pipeline.balance import chunk_costs, stage_module
from hethpc.pipeline.profile import SpeedCosts
from hethpc.pipeline.recut import move_stage_states, skeleton
from hethpc.train.parts.optim import param_groups


def _model(seed: int) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(6, 8), nn.LayerNorm(8), nn.ReLU(), nn.Linear(8, 8), nn.BatchNorm1d(8),
        nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3),
    )  # fmt: skip


def _adamw(module: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(param_groups(module, 0.1), lr=0.01)


def _sgd(module: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(module.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3)


def _stages(
    model: nn.Sequential,
    balance: Sequence[int],
    placement: Sequence[int],
    make: Callable[[nn.Module], torch.optim.Optimizer],
) -> list[tuple[nn.Module, torch.optim.Optimizer]]:
    out = []
    for s in range(max(placement) + 1):
        part = stage_module(model, balance, placement, s)
        out.append((part, make(part)))
    return out


def _train(
    model: nn.Sequential, stages: list[tuple[nn.Module, torch.optim.Optimizer]], steps: range
) -> None:
    """Steps of the whole model, each stage's optimizer stepping its own layers (what a
    pipeline computes, without the pipeline)."""
    for step in steps:
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(16, 6, generator=g), torch.randint(0, 3, (16,), generator=g)
        for _, opt in stages:
            opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        for _, opt in stages:
            opt.step()


@pytest.mark.parametrize(
    ("old", "new", "placement"),
    [
        pytest.param((2, 6), (5, 3), (0, 1), id="2-stages"),
        pytest.param((1, 3, 4), (4, 2, 2), (0, 1, 2), id="3-stages"),
        pytest.param((2, 2, 2, 2), (1, 3, 3, 1), (0, 1, 1, 0), id="v-2-stages"),
    ],
)
@pytest.mark.parametrize("make", [_adamw, _sgd], ids=["adamw", "sgd"])
def test_moved_states_train_on_exactly_as_before(
    old: tuple[int, ...],
    new: tuple[int, ...],
    placement: tuple[int, ...],
    make: Callable[[nn.Module], torch.optim.Optimizer],
) -> None:
    # Two replicas that differ (replica 1 trained on other data), so that a mix-up shows.
    replicas = [_model(0), _model(0)]
    saved = []
    for d, model in enumerate(replicas):
        stages = _stages(model, old, placement, make)
        _train(model, stages, range(d * 100, d * 100 + 3))
        for s, (part, opt) in enumerate(stages):
            state = {"model": part.state_dict(), "optimizer": opt.state_dict()}
            saved.append({**copy.deepcopy(state), "rank": d * 10 + s})
        _train(model, stages, range(50, 53))  # the run as it would have gone on
    moved = move_stage_states(
        saved, model=skeleton(_model(7)), old=old, new=new, placement=placement,
        make_optimizer=make,
    )  # fmt: skip
    stages_count = max(placement) + 1
    for d, reference in enumerate(replicas):
        fresh = _model(9)  # other weights: everything must come from the moved states
        stages = _stages(fresh, new, placement, make)
        for s, (part, opt) in enumerate(stages):
            entry = moved[d * stages_count + s]
            assert entry["rank"] == d * 10 + s  # other entries kept
            part.load_state_dict(entry["model"])
            opt.load_state_dict(entry["optimizer"])
        _train(fresh, stages, range(50, 53))
        for (k, want), got in zip(reference.state_dict().items(), fresh.state_dict().values(),
                                  strict=True):  # fmt: skip
            assert torch.equal(want, got), (d, k)


def test_skeleton_holds_no_data_and_keeps_names() -> None:
    model = _model(0)
    bones = skeleton(model)
    assert all(t.device.type == "meta" for t in bones.state_dict().values())
    assert [(k, t.shape) for k, t in bones.state_dict().items()] == [
        (k, t.shape) for k, t in model.state_dict().items()
    ]
    assert next(model.parameters()).device.type == "cpu"  # the model itself untouched


def test_a_skeleton_of_a_model_with_lazy_layers_keeps_their_names() -> None:
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.LazyLinear(3))
    bones = skeleton(model)
    assert list(bones.state_dict()) == list(model.state_dict())
    assert bones[0].weight.device.type == "meta"


def test_a_saved_optimizer_of_another_grouping_is_refused() -> None:
    model = _model(0)
    stages = _stages(model, (2, 6), (0, 1), _sgd)
    saved = [{"model": p.state_dict(), "optimizer": o.state_dict()} for p, o in stages]
    with pytest.raises(ValueError, match="groups of .* resume with the checkpoint's optimizer"):
        move_stage_states(saved, model=skeleton(model), old=(2, 6), new=(4, 4),
                          placement=(0, 1), make_optimizer=_adamw)  # fmt: skip


def test_stage_module_keys_as_the_pipeline_and_refuses_a_wrong_placement() -> None:
    model = _model(0)
    one = stage_module(model, (2, 6), (0, 1), 1)
    assert isinstance(one, nn.Sequential) and one[0] is model[2]
    v = stage_module(model, (2, 2, 2, 2), (0, 1, 1, 0), 0)
    assert isinstance(v, nn.ModuleList) and v[1][0] is model[6]  # chunk 3 starts at layer 6
    with pytest.raises(BalanceError, match="names 3 chunks but balance"):
        stage_module(model, (2, 6), (0, 1, 1), 0)
    with pytest.raises(BalanceError, match="gives stage 2 no chunk"):
        stage_module(model, (2, 6), (0, 1), 2)


def test_chunk_costs_count_as_the_balance_does() -> None:
    costs = ((1.0, 2.0, 3.0, 4.0), (2.0, 4.0, 6.0, 8.0))
    assert chunk_costs(costs, (2, 2), first_costs=(0.5, 2.0, 3.0, 4.0), last_extra=1.0) == [
        2.5, 15.0,
    ]  # fmt: skip
    speeds = SpeedCosts(costs, (1.0, 2.0, 3.0, 4.0), 0.0, (True,) * 4)
    assert speeds.balance() == (3, 1)  # the second chunk's ranks are twice as slow
    assert speeds.slowest((3, 1)) == 8.0 and speeds.slowest((2, 2)) == 14.0
    with pytest.raises(BalanceError, match="2 chunks but there are 3 cost vectors"):
        chunk_costs((*costs, costs[0]), (2, 2))
