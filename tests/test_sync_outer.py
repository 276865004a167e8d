"""The outer optimizer (DiLoCo's outer step): its math, its state, and where it is refused."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from hethpc.sync import BSP, FedAvg, LocalOnly, SelSync, SyncError
from hethpc.sync.outer import OuterOptimizer, outer_update
from hethpc.train import TrainConfig
from hethpc.train.parts.pipeline_stage import check_pipeline_config
from hethpc.train.settings.config import ConfigError


def _t(*v: float) -> torch.Tensor:
    return torch.tensor(v, dtype=torch.float64)


def test_sgd_at_lr_1_without_momentum_is_exactly_the_average() -> None:
    start, avg = [_t(0.1, 0.7)], [_t(0.3, -0.2)]
    (new,) = outer_update(start, avg, None, lr=1.0, momentum=0.0, nesterov=False)
    assert torch.equal(new, avg[0])


def test_sgd_steps_along_the_pseudo_gradient() -> None:
    (new,) = outer_update([_t(1.0, 2.0)], [_t(0.0, 1.0)], None, lr=0.5, momentum=0.0,
                          nesterov=False)  # fmt: skip
    torch.testing.assert_close(new, _t(0.5, 1.5))  # start - 0.5 * (start - avg)


def test_nesterov_matches_torch_sgd_on_the_pseudo_gradient() -> None:
    """The outer step is torch's SGD(nesterov=True) with the pseudo-gradient as gradient."""
    lr, mu = 0.7, 0.9
    ref = nn.Parameter(_t(1.0, -2.0, 0.5))
    opt = torch.optim.SGD([ref], lr=lr, momentum=mu, nesterov=True)
    start = [ref.detach().clone()]
    buf = [torch.zeros(3, dtype=torch.float64)]
    g = torch.Generator().manual_seed(0)
    for _ in range(4):
        averaged = [start[0] - 0.1 * torch.randn(3, generator=g, dtype=torch.float64)]
        ref.grad = start[0] - averaged[0]
        opt.step()
        (new,) = outer_update(start, averaged, buf, lr=lr, momentum=mu, nesterov=True)
        torch.testing.assert_close(new, ref.detach(), rtol=0, atol=1e-12)
        start = [new]


def test_sgd_momentum_matches_torch_sgd() -> None:
    ref = nn.Parameter(_t(0.0, 1.0))
    opt = torch.optim.SGD([ref], lr=0.3, momentum=0.5)
    start, buf = [ref.detach().clone()], [torch.zeros(2, dtype=torch.float64)]
    for k in range(3):
        averaged = [start[0] + _t(0.2 * k, -0.1)]
        ref.grad = start[0] - averaged[0]
        opt.step()
        (new,) = outer_update(start, averaged, buf, lr=0.3, momentum=0.5, nesterov=False)
        torch.testing.assert_close(new, ref.detach(), rtol=0, atol=1e-12)
        start = [new]


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2))


def _train(policy: FedAvg | SelSync | LocalOnly, steps: int) -> list[torch.Tensor]:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        opt.zero_grad()
        x, y = torch.randn(8, 4, generator=g), torch.randint(0, 2, (8,), generator=g)
        nn.functional.cross_entropy(model(x), y).backward()
        policy.step(model, opt)
    policy.finish(model)
    return [p.detach().clone() for p in model.parameters()]


def test_fedavg_with_outer_sgd_lr_1_equals_plain_fedavg() -> None:
    plain = _train(FedAvg(period=3), 7)
    outer = _train(FedAvg(period=3, outer=OuterOptimizer("sgd", lr=1.0, momentum=0.0)), 7)
    for a, b in zip(plain, outer, strict=True):
        assert torch.equal(a, b)


def test_fedavg_with_nesterov_steps_from_the_start_point_at_each_sync() -> None:
    """One process: the average is the local model, so each sync is one outer step from it."""
    outer = OuterOptimizer("nesterov", lr=0.7, momentum=0.9)
    policy = FedAvg(period=2, outer=outer)
    model = _model()
    start = [p.detach().clone() for p in model.parameters()]
    buf = [torch.zeros_like(t) for t in start]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(6):
        opt.zero_grad()
        nn.functional.cross_entropy(model(torch.randn(8, 4)), torch.randint(0, 2, (8,))).backward()
        if step % 2 == 1:  # the sync step: predict the outer result from the local update
            local = [p.detach() - 0.1 * p.grad for p in model.parameters()]  # type: ignore[operator]
            want = outer_update(start, local, buf, lr=0.7, momentum=0.9, nesterov=True)
        policy.step(model, opt)
        if step % 2 == 1:
            for p, w in zip(model.parameters(), want, strict=True):
                torch.testing.assert_close(p.detach(), w, rtol=0, atol=1e-6)
            start = [w.clone() for w in want]
    assert policy.summary().synced_steps == 3


def test_outer_state_resumes_identically() -> None:
    """Stopping after 3 steps (a local one, after a sync) and resuming from the state dicts
    gives the 6-step result: the start point and the momentum come back."""
    g = torch.Generator().manual_seed(2)
    data = [(torch.randn(8, 4, generator=g), torch.randint(0, 2, (8,), generator=g))
            for _ in range(6)]  # fmt: skip

    def make() -> tuple[nn.Module, torch.optim.Optimizer, FedAvg]:
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)
        return model, opt, FedAvg(period=2, outer=OuterOptimizer("nesterov"))

    def steps(model: nn.Module, opt: torch.optim.Optimizer, policy: FedAvg, part: list) -> None:
        for x, y in part:
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            policy.step(model, opt)

    model, opt, policy = make()
    steps(model, opt, policy, data)
    first = make()
    steps(*first, data[:3])
    saved = [first[0].state_dict(), first[1].state_dict(), first[2].state_dict()]
    again = make()
    for piece, state in zip(again, saved, strict=True):
        piece.load_state_dict(state)  # type: ignore[attr-defined]
    steps(*again, data[3:])
    assert policy.summary().synced_steps == 3
    for a, b in zip(model.parameters(), again[0].parameters(), strict=True):
        assert torch.equal(a, b)


def test_restored_state_moves_to_the_models_device() -> None:
    """A checkpoint loads on the CPU; a GPU run's outer step must not mix devices. The meta
    device stands in for the GPU here (a tensor moves onto it, and mixing raises the same)."""
    cpu = OuterOptimizer("nesterov", momentum=0.5)
    cpu.start(nn.Linear(3, 2))
    moved = OuterOptimizer("nesterov", momentum=0.5)
    moved.load_state_dict(cpu.state_dict())
    model = nn.Linear(3, 2, device="meta")
    moved.apply(model)  # a CPU start point against meta parameters would raise here
    assert moved.start_point is not None and moved.state_dict()["buf"] is not None
    assert {t.device.type for t in [*moved.start_point, *moved.state_dict()["buf"]]} == {"meta"}


def test_state_saved_without_an_outer_optimizer_is_refused() -> None:
    plain = FedAvg(period=2)
    _train(plain, 2)
    with pytest.raises(SyncError, match="saved without an outer optimizer"):
        FedAvg(period=2, outer=OuterOptimizer()).load_state_dict(plain.state_dict())
    outer = FedAvg(period=2, outer=OuterOptimizer("sgd", momentum=0.5))
    _train(outer, 2)
    with pytest.raises(ValueError, match="saved as sgd with momentum 0.5"):
        FedAvg(period=2, outer=OuterOptimizer("nesterov")).load_state_dict(outer.state_dict())


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"kind": "adam"}, "outer_optimizer must be one of"),
        ({"lr": 0.0}, "outer_lr must be a finite number > 0"),
        ({"lr": -1.0}, "outer_lr must be a finite number > 0"),
        ({"lr": math.nan}, "outer_lr must be a finite number > 0"),
        ({"lr": math.inf}, "outer_lr must be a finite number > 0"),
        ({"lr": True}, "outer_lr must be a finite number > 0"),
        ({"momentum": 1.0}, r"outer_momentum must be in \[0, 1\)"),
        ({"momentum": -0.1}, r"outer_momentum must be in \[0, 1\)"),
    ],
    ids=["kind", "lr-0", "lr-neg", "lr-nan", "lr-inf", "lr-bool", "mom-1", "mom-neg"],
)
def test_bad_outer_settings_are_refused(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        OuterOptimizer(**kwargs)  # type: ignore[arg-type]


def test_policies_that_average_gradients_refuse_an_outer_optimizer() -> None:
    with pytest.raises(ValueError, match="not 'bsp'"):
        BSP(outer=OuterOptimizer())
    with pytest.raises(ValueError, match="use aggregation 'params', not 'grads'"):
        SelSync(aggregation="grads", outer=OuterOptimizer())


@pytest.mark.parametrize(
    ("settings", "key", "match"),
    [
        ({"sync": "bsp", "outer_optimizer": "nesterov"}, "outer_optimizer", "sync bsp averages"),
        ({"sync": "selsync", "aggregation": "grads", "outer_optimizer": "sgd"},
         "outer_optimizer", "selsync with aggregation grads"),
        ({"sync": "fedavg", "outer_lr": 0.0}, "outer_lr", "outer_lr must be positive, got 0.0"),
        ({"sync": "fedavg", "outer_lr": math.nan}, "outer_lr", "expected a finite number"),
        ({"sync": "fedavg", "outer_momentum": 1.0}, "outer_momentum", r"must be in \[0, 1\)"),
        ({"sync": "fedavg", "outer_optimizer": "adam"}, "outer_optimizer", "is not one of"),
    ],
    ids=["bsp", "selsync-grads", "lr-0", "lr-nan", "momentum-1", "kind"],
)  # fmt: skip
def test_job_settings_are_checked(settings: dict[str, object], key: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as e:
        TrainConfig(**settings)  # type: ignore[arg-type]
    assert e.value.key == key


def test_pipeline_stages_refuse_an_outer_optimizer() -> None:
    cfg = TrainConfig(sync="fedavg", outer_optimizer="nesterov", pipeline_stages=2)
    with pytest.raises(ConfigError, match="supports only: no --outer-optimizer"):
        check_pipeline_config(cfg, 2)


@pytest.mark.parametrize(
    ("sizes", "replica", "want"),
    [([96, 32], 0, [32, 32, 32]), ([96, 32], 1, [32]), ([64, 64], 1, [64]),
     ([100, 28], 0, [25, 25, 25, 25]), ([70, 30, 28], 1, [30]), ([5, 1], 0, [1] * 5)],
    ids=["3x", "slowest", "equal", "uneven-split", "three-ranks", "one-row-steps"],
)  # fmt: skip
def test_speed_sized_local_steps(sizes: list[int], replica: int, want: list[int]) -> None:
    import numpy as np

    from hethpc.train.run.shares import inner_step_sizes

    assert inner_step_sizes(np.array(sizes), replica) == want


@pytest.mark.parametrize(
    ("settings", "match"),
    [({"sync": "bsp", "batching": "dynamic", "inner_steps": "speed"}, "sync bsp has none"),
     ({"sync": "fedavg", "inner_steps": "speed"}, "use batching dynamic")],
    ids=["bsp", "uniform"],
)  # fmt: skip
def test_speed_sized_steps_need_averaging_and_unequal_batches(
    settings: dict[str, object], match: str
) -> None:
    with pytest.raises(ConfigError, match=match) as e:
        TrainConfig(**settings)  # type: ignore[arg-type]
    assert e.value.key == "inner_steps"
