"""BSP with the allreduce overlapped with the backward pass: the same update as after it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hethpc.sync import BSP, SyncError


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 3)
        )
        self.unused = nn.Linear(2, 2)  # never in the graph: its gradient must come back zero

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def _model() -> _Net:
    torch.manual_seed(0)
    return _Net()


def _batch(rank: int, step: int, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 * rank + step)
    return torch.randn(rows, 6, generator=g), torch.randint(0, 3, (rows,), generator=g)


@pytest.mark.parametrize("bucket_bytes", [64, 1 << 20], ids=["many-buckets", "one-bucket"])
@pytest.mark.parametrize("weighted", [False, True], ids=["equal", "weighted"])
def test_overlapped_steps_equal_the_plain_ones(
    world: tuple[int, int], bucket_bytes: int, weighted: bool
) -> None:
    r, n = world
    sizes = [4 + 3 * k for k in range(n)]
    weight = sizes[r] / sum(sizes) if weighted else None
    models = {"plain": _model(), "overlap": _model()}
    policies = {"plain": BSP(), "overlap": BSP(overlap=True, bucket_bytes=bucket_bytes)}
    opts = {k: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for k, m in models.items()}
    for step in range(4):
        x, y = _batch(r, step, sizes[r])
        for k, model in models.items():
            opts[k].zero_grad(set_to_none=step % 2 == 0)  # fresh and accumulated-into grads
            policies[k].before_backward(model, weight=weight)
            nn.functional.cross_entropy(model(x), y).backward()
            policies[k].step(model, opts[k], weight=weight)
    for a, b in zip(models["plain"].parameters(), models["overlap"].parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    assert torch.count_nonzero(models["overlap"].unused.weight.grad) == 0
    policies["overlap"].close()


def test_overlap_refuses_two_backward_passes_in_one_step(world: tuple[int, int]) -> None:
    r, _ = world
    model, policy = _model(), BSP(overlap=True)
    x, y = _batch(r, 0, 4)
    policy.before_backward(model)
    nn.functional.cross_entropy(model(x), y).backward()
    with pytest.raises(SyncError, match="one backward per step"):
        nn.functional.cross_entropy(model(x), y).backward()
    policy.close()


def test_overlap_checks_the_weights_in_its_last_bucket(world: tuple[int, int]) -> None:
    r, n = world
    model, policy = _model(), BSP(overlap=True, bucket_bytes=64)
    x, y = _batch(r, 0, 4)
    policy.before_backward(model, weight=0.5 / n)
    nn.functional.cross_entropy(model(x), y).backward()
    with pytest.raises(SyncError, match="weights sum to 0.5, not 1"):
        policy.step(model, torch.optim.SGD(model.parameters(), lr=0.1), weight=0.5 / n)
    policy.close()
