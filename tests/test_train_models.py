"""Built-in models: output shapes, the ResNet's residual blocks, the large pipeline model."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hethpc.models import MODELS, build_model
from hethpc.models.builtin import BasicBlock


@pytest.mark.parametrize(
    ("name", "shape"),
    [
        ("mlp", (40,)),
        ("cnn1d", (40,)),
        ("resnet", (3, 32, 32)),
        ("resnet", (1, 32, 32)),
        ("resnet", (3 * 32 * 32,)),
        ("large", (40,)),
    ],
    ids=["mlp", "cnn1d", "resnet-rgb", "resnet-gray", "resnet-flat", "large"],
)
def test_models_give_logits(name: str, shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    model = build_model(name, shape, 10)
    assert isinstance(model, nn.Sequential)
    out = model(torch.randn(4, *shape))
    assert out.shape == (4, 10)
    out.sum().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_resnet_has_three_stages_of_residual_blocks() -> None:
    model = build_model("resnet", (3, 32, 32), 10)
    blocks = [m for m in model if isinstance(m, BasicBlock)]
    assert len(blocks) == 3
    x = torch.randn(2, 16, 32, 32)
    assert blocks[1](x).shape == (2, 32, 16, 16)  # stride 2 halves, channels double


def test_large_model_is_large_and_cuttable() -> None:
    model = build_model("large", (40,), 10)
    assert sum(p.numel() for p in model.parameters()) > 7_000_000
    assert len(model) == 1 + 3 * 8 + 1


@pytest.mark.parametrize("shape", [(3, 32, 16), (5000,)], ids=["not-square", "flat-not-image"])
def test_resnet_refuses_non_images(shape: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match="resnet needs"):
        build_model("resnet", shape, 10)


def test_unknown_model() -> None:
    with pytest.raises(ValueError, match="unknown model"):
        build_model("transformer", (40,), 10)
    assert set(MODELS) >= {"mlp", "cnn1d", "resnet", "large"}
