"""Accumulation and clipping on real ranks, with unequal batches: an accumulated step is the
step of the whole batch under every synchronous policy, and BSP clips the averaged gradient
after the allreduce, so the replicas stay bit-identical."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import hethpc
from hethpc import comm


def _blobs(n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, n)
    x = rng.normal(0, 0.3, (n, 4)).astype(np.float32) + np.eye(4, dtype=np.float32)[y]
    return x, y


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 3))


def _fit(tmp_path: Path, name: str, **settings: Any) -> list[torch.Tensor]:
    """The parameters after ``fit`` with every rank's batch weighted 1 : 3 : 5 ..."""
    weights = ",".join(str(2 * r + 1) for r in range(comm.size()))
    settings = {"batching": "static", "weights": weights, "batch_size": 30, "max_steps": 3,
                **settings}  # fmt: skip
    run_dir = comm.broadcast_object(str(tmp_path / name))
    result = hethpc.fit(
        _model(), _blobs(600), run_dir=run_dir, progress=False, eval_every=0, lr=0.1,
        **settings,
    )  # fmt: skip
    return [p.detach().clone() for p in result.model.parameters()]


def _same_on_every_rank(params: list[torch.Tensor]) -> bool:
    blob = b"".join(p.numpy().tobytes() for p in params)
    return len(set(comm.allgather_object(blob))) == 1


@pytest.mark.parametrize(
    "settings",
    [
        {"sync": "bsp"},
        {"sync": "bsp", "overlap": True},
        {"sync": "bsp", "batching": "dynamic", "batch_interval": 10},  # the first split
        {"sync": "selsync"},  # its warm-up: a parameter average every step
        {"sync": "selsync", "aggregation": "grads", "threshold": 0.0},
        {"sync": "fedavg", "fedavg_period": 2},
        {"sync": "local"},
        {"sync": "bsp", "optimizer": "adamw", "weight_decay": 0.1, "clip_grad_norm": 0.2},
    ],
    ids=["bsp", "bsp-overlap", "bsp-dynamic", "selsync", "selsync-grads", "fedavg", "local",
         "bsp-adamw-clipped"],  # fmt: skip
)
def test_an_accumulated_step_is_the_step_of_the_whole_batch(
    world: tuple[int, int], tmp_path: Path, settings: dict[str, Any]
) -> None:
    whole = _fit(tmp_path, "whole", **settings)
    pieces = _fit(tmp_path, "pieces", accumulate=4, **settings)
    for a, b, start in zip(whole, pieces, _model().parameters(), strict=True):
        assert not torch.allclose(a, start.detach(), rtol=0, atol=1e-3)  # it trained
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("overlap", [False, True], ids=["after-backward", "overlap"])
def test_bsp_clips_the_averaged_gradient_alike_on_every_rank(
    world: tuple[int, int], tmp_path: Path, overlap: bool
) -> None:
    start = [p.detach().clone() for p in _model().parameters()]
    clip, lr = 1e-3, 0.1
    one = _fit(tmp_path, "one", momentum=0.0, max_steps=1, clip_grad_norm=clip, overlap=overlap)
    moved = torch.cat([(a - b).reshape(-1) for a, b in zip(one, start, strict=True)])
    # Clipped after the allreduce: the step is lr x clip long. Clipping each rank's own
    # gradient before the weighted average would make it shorter (their directions differ).
    assert float(moved.norm()) == pytest.approx(lr * clip, rel=1e-4)
    assert _same_on_every_rank(one)
    more = _fit(tmp_path, "more", max_steps=6, clip_grad_norm=clip, overlap=overlap,
                accumulate=3)  # fmt: skip
    assert _same_on_every_rank(more)
