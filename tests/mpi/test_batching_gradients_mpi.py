"""Weighted gradients on real ranks: unequal batches combine to the gradient of the whole batch."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from hethpc import comm
from hethpc.batching import weighted_gradient_allreduce
from hethpc.batching.allocation import allocate
from hethpc.batching.gradients import WeightError

B = 30


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
        self.unused = nn.Linear(2, 2)  # gets no gradient from the forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)  # type: ignore[no-any-return]


def _model() -> nn.Module:
    torch.manual_seed(0)
    return _Net().double()


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(B, 6, generator=g, dtype=torch.float64)
    return x, torch.randint(0, 3, (B,), generator=g)


def _splits(n: int) -> dict[str, list[int]]:
    return {
        "proportional": allocate(B, [k + 1 for k in range(n)]).tolist(),
        "one-big": [B - (n - 1)] + [1] * (n - 1),
        "uniform": allocate(B, [1] * n).tolist(),
    }


@pytest.mark.parametrize("split", ["proportional", "one-big", "uniform"])
def test_combined_gradient_equals_whole_batch_gradient(split: str) -> None:
    r, n = comm.rank(), comm.size()
    sizes = _splits(n)[split]
    x, y = _batch()
    loss_fn = nn.CrossEntropyLoss()

    ref = _model()
    loss_fn(ref(x), y).backward()

    model = _model()
    lo = sum(sizes[:r])
    loss_fn(model(x[lo : lo + sizes[r]]), y[lo : lo + sizes[r]]).backward()
    weighted_gradient_allreduce(model.parameters(), weight=sizes[r] / B)

    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        expected = q.grad if q.grad is not None else torch.zeros_like(q)
        torch.testing.assert_close(p.grad, expected, rtol=1e-6, atol=1e-6, msg=name)


@pytest.mark.parametrize(
    "weights",
    ["half-each", "nan-on-last", "negative-on-first"],
)
def test_bad_weights_raise_on_every_rank(weights: str) -> None:
    r, n = comm.rank(), comm.size()
    w = {
        "half-each": 0.5 / n,
        "nan-on-last": math.nan if r == n - 1 else 1.0 / n,
        "negative-on-first": -1.0 if r == 0 else 1.0 / n,
    }[weights]
    model = _model()
    with pytest.raises(WeightError, match=f"sum to 1 over the {n} rank"):
        weighted_gradient_allreduce(model.parameters(), weight=w)
    # Every rank raised before the allreduce: a following collective still lines up.
    assert comm.allgather_object(r) == list(range(n))


def test_weights_within_a_group() -> None:
    r, n = comm.rank(), comm.size()
    group = comm.new_group(list(reversed(range(n))))
    p = nn.Parameter(torch.zeros(3, dtype=torch.float64))
    p.grad = torch.full((3,), float(r + 1), dtype=torch.float64)
    weighted_gradient_allreduce([p], weight=1.0 / n, group=group)
    np.testing.assert_allclose(p.grad.numpy(), (n + 1) / 2)
