"""The outer optimizer on real ranks: equal replicas after every sync, the DiLoCo step on the
average, and plain averaging at outer SGD lr 1."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from hethpc import comm
from hethpc.sync import FedAvg, LocalOnly, SelSync, SyncPolicy
from hethpc.sync.outer import OuterOptimizer, outer_update


def _model() -> nn.Module:
    torch.manual_seed(5)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))


def _flat(model: nn.Module) -> np.ndarray:
    return torch.cat([p.detach().flatten() for p in model.parameters()]).double().numpy()


def _same_on_every_rank(model: nn.Module) -> None:
    rows = comm.allgather_array(_flat(model))
    for r in range(1, len(rows)):
        np.testing.assert_array_equal(rows[r], rows[0], err_msg=f"rank {r} differs from rank 0")


def _step(model: nn.Module, opt: torch.optim.Optimizer, policy: SyncPolicy, k: int) -> bool:
    g = torch.Generator().manual_seed(1000 * comm.rank() + k)  # different data on every rank
    opt.zero_grad()
    x, y = torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)
    nn.functional.cross_entropy(model(x), y).backward()
    weight = (comm.rank() + 1) / (comm.size() * (comm.size() + 1) / 2)  # unequal shares
    return policy.step(model, opt, weight=weight).synced


def test_outer_sgd_at_lr_1_is_plain_averaging() -> None:
    comm.init()
    runs = []
    for outer in (None, OuterOptimizer("sgd", lr=1.0, momentum=0.0)):
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        policy = FedAvg(period=3, outer=outer)
        for k in range(7):
            _step(model, opt, policy, k)
        policy.finish(model)
        runs.append(_flat(model))
    np.testing.assert_array_equal(runs[0], runs[1])


def test_nesterov_steps_on_the_weighted_average_and_keeps_replicas_equal() -> None:
    comm.init()
    model, ref = _model(), _model()  # ref: plain averaging, to know the first average
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    start = [p.detach().clone() for p in model.parameters()]
    policy = FedAvg(period=2, outer=OuterOptimizer("nesterov", lr=0.7, momentum=0.9))
    plain = FedAvg(period=2)
    for k in range(2):
        _step(model, opt, policy, k)
        _step(ref, ref_opt, plain, k)
    averaged = [p.detach() for p in ref.parameters()]
    buf = [torch.zeros_like(t) for t in start]
    want = outer_update(start, averaged, buf, lr=0.7, momentum=0.9, nesterov=True)
    for p, w in zip(model.parameters(), want, strict=True):
        torch.testing.assert_close(p.detach(), w, rtol=0, atol=1e-6)
    _same_on_every_rank(model)
    for k in range(2, 9):  # later syncs keep the replicas equal
        if _step(model, opt, policy, k):
            _same_on_every_rank(model)


def test_selsync_and_local_with_an_outer_step_end_equal() -> None:
    comm.init()
    for policy in (SelSync(threshold=0.2, window=3, outer=OuterOptimizer("nesterov")),
                   LocalOnly(outer=OuterOptimizer("sgd", lr=0.8, momentum=0.0))):  # fmt: skip
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for k in range(10):
            if _step(model, opt, policy, k):
                _same_on_every_rank(model)
        policy.finish(model)
        _same_on_every_rank(model)
