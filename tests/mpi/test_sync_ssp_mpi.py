"""SSP on real ranks: S = 0 is BSP, the staleness bound holds (and binds only when reached),
and the replicas end equal."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from torch import nn

from hethpc import comm
from hethpc.sync import BSP, SSP


def _model() -> nn.Module:
    torch.manual_seed(7)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))


def _weight() -> float:
    return (comm.rank() + 1) / (comm.size() * (comm.size() + 1) / 2)  # unequal shares


def _step(model: nn.Module, opt: torch.optim.Optimizer, k: int) -> None:
    g = torch.Generator().manual_seed(1000 * comm.rank() + k)  # different data on every rank
    opt.zero_grad()
    x, y = torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)
    nn.functional.cross_entropy(model(x), y).backward()


def _flat(model: nn.Module) -> np.ndarray:
    return torch.cat([p.detach().flatten() for p in model.parameters()]).double().numpy()


def test_staleness_0_is_bsp() -> None:
    comm.init()
    finals = []
    for policy in (BSP(), SSP(staleness=0)):
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
        for k in range(8):
            _step(model, opt, k)
            policy.step(model, opt, weight=_weight())
        policy.finish(model)
        policy.close()
        finals.append(_flat(model))
    np.testing.assert_allclose(finals[1], finals[0], rtol=0, atol=1e-6)


def test_a_fast_rank_runs_ahead_exactly_to_the_bound() -> None:
    """The last rank is slow (0.1 s per step); the others run S steps ahead, then wait."""
    comm.init()
    if comm.size() == 1:
        pytest.skip("needs two or more ranks")
    s, steps = 3, 8
    slow = comm.rank() == comm.size() - 1
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    policy = SSP(staleness=s)
    policy.prepare(model)
    for k in range(steps):
        _step(model, opt, k)
        if slow:
            time.sleep(0.1)
        policy.step(model, opt)
    policy.finish(model)
    policy.close()
    assert policy.max_clock_gap <= s
    if slow:
        assert policy.waits == 0, policy.waited  # the slowest never waits
    else:
        # Free for the first S steps (gaps 1..S, no wait), then held at the bound.
        assert policy.gaps[:s] == list(range(1, s + 1)), policy.gaps
        assert policy.waited[:s] == [False] * s, policy.waited
        assert policy.waited[s], policy.waited
        assert policy.max_clock_gap == s
    rows = comm.allgather_array(_flat(model))
    for r in range(1, len(rows)):
        np.testing.assert_array_equal(rows[r], rows[0], err_msg=f"rank {r} differs after finish")


def test_equal_ranks_stay_within_the_bound() -> None:
    comm.init()
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    policy = SSP(staleness=2)
    for k in range(20):
        _step(model, opt, k)
        policy.step(model, opt, weight=_weight())
    policy.finish(model)
    policy.close()
    assert policy.max_clock_gap <= 2
    assert policy.summary().sync_fraction == 1.0
