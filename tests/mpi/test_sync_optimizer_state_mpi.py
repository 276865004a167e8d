"""Averaging the optimizer's state with the parameters on real ranks: after an average every
replica holds the weighted mean of the momentum buffers (its allreduce in flight until the
next step or ``settle``); without it each keeps its own."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from hethpc import comm
from hethpc.sync import FedAvg, SelSync, SyncPolicy


def _momenta(
    policy: SyncPolicy, optimizer: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Steps on rank-specific gradients up to the first average after a local step.

    Returns every rank's momentum (SGD's buffer, Adam's or AdamW's first moment) as that step
    leaves it before the average (the same arithmetic by hand), after the average, after one
    more local step, and the average's bytes.
    """
    r, n = comm.rank(), comm.size()
    shares = np.arange(1, n + 1) / (n * (n + 1) / 2)
    model = nn.Module()
    model.x = nn.Parameter(torch.zeros(3, dtype=torch.float64))
    opt = {
        "sgd": lambda: torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        "adam": lambda: torch.optim.Adam(model.parameters(), lr=0.01),
        # decoupled decay moves the parameter, not the moments
        "adamw": lambda: torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1),
    }[optimizer]()
    key = "momentum_buffer" if optimizer == "sgd" else "exp_avg"
    grad = torch.tensor([1.0 + r, -2.0 * r, 0.5], dtype=torch.float64)
    local = False
    for _ in range(10):
        old = opt.state[model.x].get(key)
        old = torch.zeros(3, dtype=torch.float64) if old is None else old.clone()
        mine = 0.9 * old + grad if optimizer == "sgd" else 0.9 * old + 0.1 * grad
        opt.zero_grad()
        model.x.grad = grad.clone()
        record = policy.step(model, opt, weight=float(shares[r]))
        if record.synced and local:
            before = comm.allgather_array(mine.numpy())
            policy.settle()
            after = comm.allgather_array(opt.state[model.x][key].numpy())
            opt.zero_grad()
            model.x.grad = grad.clone()
            policy.step(model, opt, weight=float(shares[r]))
            policy.settle()
            nxt = comm.allgather_array(opt.state[model.x][key].numpy())
            return before, after, nxt, record.bytes
        local = local or not record.synced
    raise AssertionError("no average after a local step in 10 steps")


@pytest.mark.parametrize("optimizer", ["sgd", "adam", "adamw"])
@pytest.mark.parametrize("kind", ["selsync", "fedavg"])
def test_an_average_gives_every_replica_the_weighted_mean_momentum(
    kind: str, optimizer: str
) -> None:
    comm.init()
    if comm.size() < 2:
        pytest.skip("needs 2 ranks or more")
    n = comm.size()
    shares = np.arange(1, n + 1) / (n * (n + 1) / 2)

    def policy(state: bool) -> SyncPolicy:
        if kind == "fedavg":
            return FedAvg(period=4, optimizer_state=state)
        # The votes never pass a threshold of 10: the bound alone syncs, every 4th step.
        return SelSync(threshold=10.0, window=1, max_local_steps=3, optimizer_state=state)

    grads = np.array([[1.0 + r, -2.0 * r, 0.5] for r in range(n)])
    keep, new = (0.9, 1.0) if optimizer == "sgd" else (0.9, 0.1)
    before, after, nxt, nbytes = _momenta(policy(True), optimizer)
    assert np.abs(before - before[0]).max() > 0.5  # the replicas' momenta differ
    np.testing.assert_allclose(after, np.tile(shares @ before, (n, 1)), rtol=1e-12)
    # the next local step builds on the average (its allreduce completed before the update)
    np.testing.assert_allclose(nxt, keep * after + new * grads, rtol=1e-12)
    states = 2 if optimizer == "sgd" else 3  # the parameter and its moments
    assert nbytes == states * 3 * 8
    before, after, nxt, nbytes = _momenta(policy(False), optimizer)
    np.testing.assert_allclose(after, before, rtol=1e-12)  # each kept its own
    assert nbytes == 3 * 8
