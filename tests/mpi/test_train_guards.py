"""Cross-rank guards on real ranks: config digests, model layouts, non-finite votes.

Each bad input differs on one rank only; the error must be raised on every rank and name it.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from hethpc import comm
from hethpc.sync import make_policy
from hethpc.train import ConfigError, TrainConfig
from hethpc.train.errors import ModelMismatchError
from hethpc.train.settings.compare import check_same_config
from hethpc.train.watch.guards import check_same_model, nonfinite_ranks


def test_same_config_passes(world: tuple[int, int]) -> None:
    r, _ = world
    check_same_config(TrainConfig(cache_dir=f"/node{r}", progress=r == 0))  # local settings


@pytest.mark.parametrize(
    ("setting", "value"),
    [("seed", 7), ("batch_size", 64), ("threshold", 0.5), ("model", "mlp")],
    ids=["seed", "global-batch", "sync-threshold", "model"],
)
def test_config_mismatch_is_named_on_every_rank(
    world: tuple[int, int], setting: str, value: object
) -> None:
    r, n = world
    if n == 1:
        pytest.skip("needs two ranks")
    cfg = TrainConfig(**({setting: value} if r == n - 1 else {}))
    with pytest.raises(ConfigError, match=rf"{setting} \(rank 0: .*rank {n - 1}: {value!r}\)"):
        check_same_config(cfg)


def test_same_model_passes(world: tuple[int, int]) -> None:
    torch.manual_seed(world[0])  # different values are fine; the layout must agree
    check_same_model(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)))


@pytest.mark.parametrize(
    ("odd", "match"),
    [
        (
            nn.Sequential(nn.Linear(4, 9), nn.ReLU(), nn.Linear(9, 2)),
            r"0\.weight: rank 0 has shape",
        ),
        (nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).double(), "torch.float64"),
        (nn.Sequential(nn.Linear(4, 8)), r"lacks \['2\.bias', '2\.weight'\]"),
        (
            nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)),
            r"module 1 is ReLU on rank 0, module 1 is Tanh on rank",
        ),
    ],
    ids=["shape", "dtype", "missing-layer", "other-activation"],
)
def test_model_mismatch_is_named_on_every_rank(
    world: tuple[int, int], odd: nn.Module, match: str
) -> None:
    r, n = world
    if n == 1:
        pytest.skip("needs two ranks")
    model = odd if r == n - 1 else nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    with pytest.raises(ModelMismatchError, match=match) as e:
        check_same_model(model)
    assert f"rank {n - 1}" in str(e.value)


@pytest.mark.parametrize("bad_rank", [None, 0, -1], ids=["none", "first", "last"])
def test_nonfinite_vote_is_agreed(world: tuple[int, int], bad_rank: int | None) -> None:
    r, n = world
    bad = None if bad_rank is None else bad_rank % n
    assert nonfinite_ranks(r == bad) == ([] if bad is None else [bad])


@pytest.mark.parametrize("policy", ["bsp", "fedavg"], ids=["bsp", "fedavg"])
def test_unchecked_weights_average_like_checked(world: tuple[int, int], policy: str) -> None:
    # The loop turns the per-step weight check off (its weights come from agreed sizes): the
    # result must be the same as with the check, with unequal shares b_k / B.
    r, n = world
    sizes = np.arange(1, n + 1)
    kw = {"period": 1} if policy == "fedavg" else {}
    finals = []
    for check in (True, False):
        torch.manual_seed(0)
        model = nn.Linear(3, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        sync = make_policy(policy, check_weights=check, **kw)
        for step in range(3):
            opt.zero_grad()
            model(torch.full((2, 3), float(r + step))).pow(2).sum().backward()
            sync.step(model, opt, weight=float(sizes[r] / sizes.sum()))
        finals.append([p.detach().clone() for p in model.parameters()])
    for a, b in zip(*finals, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize(
    ("odd", "match"),
    [
        (lambda x, y: (x[:50], y[:50]), r"rank 0: 60 samples .*; rank 1: 50 samples"),
        (lambda x, y: (x + 1, y), "rank 1: 60 samples of shape \\(4,\\), 3 classes, other values"),
    ],
    ids=["length", "values"],
)
def test_fit_names_training_data_that_differs_between_ranks(
    world: tuple[int, int], tmp_path: object, odd: object, match: str
) -> None:
    import hethpc
    from hethpc.data import DatasetError

    r, n = world
    if n == 1:
        pytest.skip("needs two ranks")
    rng = np.random.default_rng(0)  # the same on every rank, but for the odd one
    x, y = rng.normal(size=(60, 4)).astype(np.float32), np.arange(60) % 3
    data = odd(x, y) if r == 1 else (x, y)  # type: ignore[operator]
    run_dir = comm.broadcast_object(str(tmp_path))
    with pytest.raises(DatasetError, match=f"train_data differs between ranks .*{match}"):
        hethpc.fit(nn.Linear(4, 3), data, batch_size=10, run_dir=run_dir, progress=False)
