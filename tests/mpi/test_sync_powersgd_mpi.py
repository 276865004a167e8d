"""BSP with PowerSGD on real ranks: exact where the summed gradient has rank r, and replicas
that stay identical (every rank rebuilds the same factors)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from hethpc import comm
from hethpc.sync import BSP
from hethpc.sync.powersgd import PowerSGD


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(30, 40), nn.Tanh(), nn.Linear(40, 3))


@pytest.mark.parametrize("weighted", [False, True], ids=["equal", "weighted"])
def test_a_summed_gradient_of_rank_r_arrives_exactly(
    world: tuple[int, int], weighted: bool
) -> None:
    r, n = world
    rank = 3
    g = torch.Generator().manual_seed(7)
    left, right = torch.randn(40, rank, generator=g), torch.randn(rank, 30, generator=g)
    # Every rank's gradient lies in the same rank-3 subspaces, with weights of its own; so
    # does their sum.
    mix = [torch.diag(torch.tensor([1.0 + k, 2.0 - k, 0.5 * k + 0.1])) for k in range(n)]
    grads = [left @ mix[k] @ right for k in range(n)]
    sizes = [3 + 2 * k for k in range(n)]
    weights = [s / sum(sizes) if weighted else 1.0 / n for s in sizes]
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    policy = BSP(compression=PowerSGD(rank, start_step=0))
    for i, p in enumerate(model.parameters()):
        p.grad = grads[r] if i == 0 else torch.full_like(p, float(r + i))
    record = policy.step(model, opt, weight=weights[r] if weighted else None)
    want = sum(w * gk for w, gk in zip(weights, grads, strict=True))
    assert isinstance(want, torch.Tensor)
    first = next(iter(model.parameters()))
    torch.testing.assert_close(first.grad, want, atol=1e-4, rtol=1e-4)
    bias = list(model.parameters())[1]
    want_bias = sum(w * (k + 1) for k, w in enumerate(weights))
    torch.testing.assert_close(bias.grad, torch.full_like(bias, want_bias))
    # The 40 x 30 weight as factors; the 3 x 40 one is too small to gain; biases as they are.
    assert record.bytes == 4 * ((40 + 30) * rank + 40 + 3 * 40 + 3)


def test_replicas_stay_identical_through_powersgd_steps(world: tuple[int, int]) -> None:
    r, n = world
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    policy = BSP(compression=PowerSGD(2, start_step=2))
    for step in range(6):
        gen = torch.Generator().manual_seed(10 * r + step)
        x, y = torch.randn(8, 30, generator=gen), torch.randint(0, 3, (8,), generator=gen)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        policy.step(model, opt)
    assert isinstance(policy.codec, PowerSGD) and policy.codec.step == 6
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()
    table = comm.allgather_array(flat)
    for k in range(n):
        np.testing.assert_array_equal(table[k], flat, err_msg=f"rank {k} differs")


@pytest.mark.parametrize("bucket_bytes", [600, 1 << 20], ids=["many-buckets", "one-bucket"])
@pytest.mark.parametrize("weighted", [False, True], ids=["equal", "weighted"])
def test_overlapped_powersgd_trains_as_after_the_backward_pass(
    world: tuple[int, int], bucket_bytes: int, weighted: bool
) -> None:
    # One PowerSGD round per bucket, its first sum during the backward pass: the same errors,
    # Qs and factors, keyed alike, so the same training as one round after the backward
    # (to float rounding: the sums are cut into other pieces), the same bytes, and replicas
    # that stay identical.
    r, n = world
    sizes = [6 + 3 * k for k in range(n)]
    weight = sizes[r] / sum(sizes) if weighted else None
    models = {"plain": _model(), "overlap": _model()}
    policies = {
        "plain": BSP(compression=PowerSGD(2, start_step=2)),
        "overlap": BSP(compression=PowerSGD(2, start_step=2), overlap=True,
                       bucket_bytes=bucket_bytes),
    }  # fmt: skip
    opts = {k: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for k, m in models.items()}
    records = {k: [] for k in models}
    for step in range(6):
        gen = torch.Generator().manual_seed(10 * r + step)
        x = torch.randn(sizes[r], 30, generator=gen)
        y = torch.randint(0, 3, (sizes[r],), generator=gen)
        for k, model in models.items():
            opts[k].zero_grad()
            policies[k].before_backward(model, weight=weight)
            nn.functional.cross_entropy(model(x), y).backward()
            records[k].append(policies[k].step(model, opts[k], weight=weight).bytes)
    for a, b in zip(models["plain"].parameters(), models["overlap"].parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert records["overlap"] == records["plain"]
    overlap = policies["overlap"].codec
    assert isinstance(overlap, PowerSGD) and overlap.step == 6
    plain = policies["plain"].codec
    assert isinstance(plain, PowerSGD)
    # the one compressed matrix (the 40 x 30 weight) keeps an error; one rank sends nothing
    assert sorted(overlap.errors) == sorted(plain.errors) == ([0] if n > 1 else [])
    flat = torch.cat([p.detach().reshape(-1) for p in models["overlap"].parameters()]).numpy()
    table = comm.allgather_array(flat)
    for k in range(n):
        np.testing.assert_array_equal(table[k], flat, err_msg=f"rank {k} differs")
    policies["overlap"].close()
