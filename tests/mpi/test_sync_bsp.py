"""BSP on real ranks matches plain Horovod's DistributedOptimizer on the same data.

This is the only test that imports ``horovod.torch`` directly: it is the reference being
compared against. Library code reaches Horovod only through :mod:`hethpc.comm`. Under the mpi
transport (the CPU default) Horovod is started for this test alone, so hethpc's BSP is
compared with Horovod on either transport.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from hethpc import comm
from hethpc.sync import BSP


def _model() -> nn.Module:
    torch.manual_seed(3)
    return nn.Sequential(
        nn.Linear(10, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4)
    )


def _batches(rank: int, steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(100 + rank)
    return [
        (torch.randn(8, 10, generator=g), torch.randint(0, 4, (8,), generator=g))
        for _ in range(steps)
    ]


@pytest.mark.parametrize("optim", ["sgd-momentum", "adam"])
def test_bsp_matches_hvd_distributed_optimizer(optim: str) -> None:
    comm.init()
    if comm.size() == 1:
        pytest.skip("needs Horovod running under mpirun with two or more ranks")
    import horovod.torch as hvd

    # With the mpi transport Horovod is not running: start it for the reference alone.
    own = comm.transport() != "horovod"
    if own:
        hvd.init(comm=comm.runtime.state().mpi.COMM_WORLD)
    try:
        _compare_with_horovod(hvd, optim)
    finally:
        if own:
            hvd.shutdown()


def _compare_with_horovod(hvd: Any, optim: str) -> None:
    def make_opt(model: nn.Module) -> torch.optim.Optimizer:
        if optim == "adam":
            return torch.optim.Adam(model.parameters(), lr=1e-2)
        return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)

    data = _batches(comm.rank(), steps=6)
    ours, ref = _model(), _model()
    opt = make_opt(ours)
    ref_opt = hvd.DistributedOptimizer(make_opt(ref), named_parameters=ref.named_parameters())
    policy = BSP()
    for x, y in data:
        opt.zero_grad()
        nn.functional.cross_entropy(ours(x), y).backward()
        policy.step(ours, opt)
        ref_opt.zero_grad()
        nn.functional.cross_entropy(ref(x), y).backward()
        ref_opt.step()
    for (name, p), q in zip(ours.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-6, msg=f"parameter {name} differs")
    assert policy.summary().sync_fraction == 1.0
