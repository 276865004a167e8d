"""Drift correction on real ranks: replicas with different optima stop drifting apart, the
corrections cancel in the weighted average, and the averaged model still reaches the optimum."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from hethpc import comm
from hethpc.sync import FedAvg, SelSync, SyncPolicy
from hethpc.sync.drift import DriftCorrection


def _run(policy: SyncPolicy) -> tuple[float, float, float]:
    """Local SGD on ``0.5 * ||x - a_k||^2``, rank k's own optimum ``a_k`` (label skew in one
    line), 80 steps with unequal weights.

    Returns the replicas' largest distance from their weighted mean over the last 20 steps,
    the final averaged model's distance from the weighted optimum, and ``|sum_k w_k d_k|``.
    """
    r, n = comm.rank(), comm.size()
    shares = np.arange(1, n + 1) / (n * (n + 1) / 2)
    a = torch.full((4,), 3.0 * r, dtype=torch.float64)
    model = nn.Module()
    model.x = nn.Parameter(torch.zeros(4, dtype=torch.float64))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    spread = 0.0
    for step in range(80):
        opt.zero_grad()
        model.x.grad = (model.x.detach() - a).clone()
        policy.step(model, opt, weight=float(shares[r]))
        if step >= 60:
            rows = comm.allgather_array(model.x.detach().numpy())
            spread = max(spread, float(np.abs(rows - shares @ rows).max()))
    policy.finish(model)
    optimum = float(shares @ (3.0 * np.arange(n)))
    gap = float(np.abs(model.x.detach().numpy() - optimum).max())
    total = 0.0
    if policy.drift is not None and policy.drift.drift is not None:
        d = comm.allgather_array(policy.drift.drift[0].numpy())
        total = float(np.abs(shares @ d).max())
    return spread, gap, total


@pytest.mark.parametrize("kind", ["fedavg", "selsync"])
def test_corrected_replicas_stay_together_and_the_average_reaches_the_optimum(kind: str) -> None:
    comm.init()
    if comm.size() < 2:
        pytest.skip("needs 2 ranks or more")

    def policy(drift: DriftCorrection | None) -> SyncPolicy:
        if kind == "fedavg":
            return FedAvg(period=5, drift=drift)
        # The votes never pass a threshold of 10: the bound alone syncs, every 5th step.
        return SelSync(threshold=10.0, window=1, max_local_steps=4, drift=drift)

    plain, plain_gap, _ = _run(policy(None))
    fixed, fixed_gap, total = _run(policy(DriftCorrection()))
    assert plain > 0.5, plain  # uncorrected, each replica heads for its own optimum
    assert fixed < plain / 20, (fixed, plain)
    assert total < 1e-9, total  # the corrections cancel in the weighted average
    assert fixed_gap < 0.05, (fixed_gap, plain_gap)
