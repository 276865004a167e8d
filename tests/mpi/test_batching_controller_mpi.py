"""BatchController on real ranks: the same decisions everywhere, from closed-form times."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from hethpc import comm
from hethpc.batching import (
    BatchController,
    BatchingError,
    ControlSettings,
    weighted_gradient_allreduce,
)
from hethpc.batching.allocation import allocate


def _time(rank: int, b: int, step: int, change_at: int = 10**9) -> float:
    """Rank k needs (k+1) ms per sample; after ``change_at`` the last rank needs 5x that."""
    n = comm.size()
    slow = 5.0 if step >= change_at and rank == n - 1 and n > 1 else 1.0
    return b * (rank + 1) * 1e-3 * slow


def test_sizes_follow_times_and_agree_on_every_rank() -> None:
    r, n = comm.rank(), comm.size()
    B = 12 * n
    c = BatchController(B, settings=ControlSettings(interval=4))
    assert c.batch_sizes.tolist() == allocate(B, [1] * n).tolist()
    for step in range(24):
        c.update(step=step, compute_s=_time(r, c.local_batch, step, change_at=12))
        if step == 11:
            assert c.batch_sizes.tolist() == allocate(B, [1 / (k + 1) for k in range(n)]).tolist()
    x = [1 / (k + 1) for k in range(n)]
    if n > 1:
        x[-1] /= 5
    assert c.batch_sizes.tolist() == allocate(B, x).tolist()
    assert int(c.batch_sizes.sum()) == B
    records = [a.as_dict() for a in c.adjustments]
    assert [a["step"] for a in records] == [3, 7, 11, 15, 19, 23]
    seen = comm.allgather_object(records)
    assert all(s == seen[0] for s in seen)
    if n > 1:
        assert [a["applied"] for a in records] == [True, False, False, True, False, False]
        assert records[1]["reason"] == "unchanged"
        # Balanced: per-rank smoothed step times equal to rounding after the first adoption.
        times = np.array(records[1]["times"])
        assert times.max() / times.min() < 1.6


def test_static_and_uniform_never_change() -> None:
    r, n = comm.rank(), comm.size()
    B = 10 * n
    weights = [float(k + 1) for k in range(n)]
    every_2 = ControlSettings(interval=2)
    static = BatchController(B, mode="static", weights=weights, settings=every_2)
    uniform = BatchController(B, mode="uniform", settings=every_2)
    for step in range(6):
        static.update(step=step, compute_s=_time(r, static.local_batch, step))
        uniform.update(step=step, compute_s=_time(r, uniform.local_batch, step))
    assert static.batch_sizes.tolist() == allocate(B, weights).tolist()
    assert uniform.batch_sizes.tolist() == allocate(B, [1] * n).tolist()


def test_invalid_time_on_one_rank_keeps_sizes_on_every_rank() -> None:
    r, n = comm.rank(), comm.size()
    c = BatchController(8 * n, settings=ControlSettings(interval=3))
    before = c.batch_sizes.tolist()
    for step in range(3):
        c.update(step=step, compute_s=math.nan if r == n - 1 else _time(r, c.local_batch, step))
    (rec,) = c.adjustments
    assert not rec.applied and c.batch_sizes.tolist() == before
    assert rec.reason.startswith(f"invalid time: rank(s) {n - 1} (nan)")


def test_settings_that_differ_between_ranks_raise_on_every_rank() -> None:
    r, n = comm.rank(), comm.size()
    if n == 1:
        pytest.skip("needs two ranks")
    with pytest.raises(BatchingError, match=r"settings differ between ranks: rank\(s\)"):
        BatchController(8 * n, settings=ControlSettings(interval=10 + (r == n - 1)))


def test_slowdown_naming_a_missing_rank_raises_on_every_rank() -> None:
    n = comm.size()
    with pytest.raises(BatchingError, match=f"names rank {n}, but the group has {n} rank"):
        BatchController(8 * n, slowdown=f"{n}:2")


def test_group_ranks_order_sizes() -> None:
    n = comm.size()
    group = comm.new_group(list(reversed(range(n))))
    c = BatchController(6 * n, settings=ControlSettings(interval=2), group=group)
    for step in range(2):
        c.update(step=step, compute_s=_time(group.rank, c.local_batch, step))
    assert c.local_batch == int(c.batch_sizes[group.rank])
    assert c.batch_sizes.tolist() == allocate(6 * n, [1 / (k + 1) for k in range(n)]).tolist()


def test_training_with_changing_sizes_equals_one_process_training() -> None:
    """Dynamic sizes + weighted gradients give the same model as full batches on one process."""
    r, n = comm.rank(), comm.size()
    B, steps = 8 * n + 3, 12
    g = torch.Generator().manual_seed(3)
    data_x = torch.randn(B * steps, 5, generator=g, dtype=torch.float64)
    data_y = torch.randint(0, 4, (B * steps,), generator=g)
    perm = np.random.default_rng(7).permutation(B * steps)

    def new_model() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 4)).double()

    def sgd_step(m: nn.Module) -> None:
        # Plain SGD by hand: torch.optim's first import (torch._dynamo) costs seconds.
        with torch.no_grad():
            for p in m.parameters():
                p -= 0.5 * p.grad
                p.grad = None

    loss_fn = nn.CrossEntropyLoss()
    ref = new_model()
    model = new_model()
    c = BatchController(B, settings=ControlSettings(interval=3))
    seen_sizes = set()
    for step in range(steps):
        idx = perm[step * B : (step + 1) * B]
        loss_fn(ref(data_x[idx]), data_y[idx]).backward()
        sgd_step(ref)

        sizes = c.batch_sizes
        seen_sizes.add(tuple(sizes.tolist()))
        lo = int(sizes[:r].sum())
        mine = idx[lo : lo + int(sizes[r])]
        loss_fn(model(data_x[mine]), data_y[mine]).backward()
        weighted_gradient_allreduce(model.parameters(), weight=int(sizes[r]) / B)
        sgd_step(model)
        c.update(step=step, compute_s=_time(r, int(sizes[r]), step))

    if n > 1:
        assert len(seen_sizes) == 2, "the sizes should have changed once"
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-6)
