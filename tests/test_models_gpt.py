"""gpt_tiny: next-byte logits of the right shape, causal, and cuttable into pipeline stages."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hethpc.models import ModelError, build_model
from hethpc.models.builtin import TransformerBlock, gpt_tiny

T = 17


def _model(**kw: int) -> nn.Sequential:
    torch.manual_seed(0)
    return gpt_tiny((T,), 256, d_model=32, layers=3, heads=4, **kw)


def test_logits_per_position() -> None:
    model = build_model("gpt_tiny", (T,), 256)
    x = torch.randint(0, 256, (3, T - 1))
    out = model(x)
    assert out.shape == (3, T - 1, 256)
    nn.functional.cross_entropy(out.reshape(-1, 256), x.reshape(-1)).backward()
    assert all(p.grad is not None for p in model.parameters())


def test_a_later_byte_changes_no_earlier_logit() -> None:
    model = _model().eval()
    x = torch.randint(0, 256, (2, T))
    y = x.clone()
    y[:, 9] = (y[:, 9] + 1) % 256
    with torch.no_grad():
        a, b = model(x), model(y)
    torch.testing.assert_close(a[:, :9], b[:, :9])
    assert not torch.allclose(a[:, 9:], b[:, 9:])


def test_children_split_into_stages() -> None:
    model = _model()
    kinds = [type(m).__name__ for m in model]
    assert kinds == ["TokenEmbedding", *["TransformerBlock"] * 3, "LayerNorm", "Linear"]
    assert all(isinstance(model[i], TransformerBlock) for i in range(1, 4))
    x = torch.randint(0, 256, (2, T))
    with torch.no_grad():
        whole = model(x)
        h = x
        for stage in (model[:2], model[2:4], model[4:]):  # three stages, run one after another
            h = stage(h)
    torch.testing.assert_close(h, whole)


@pytest.mark.parametrize(
    ("x", "message"),
    [(torch.rand(2, T), "takes integer tokens"), (torch.zeros(2, T + 1, dtype=torch.long),
                                                  r"T <= 17")],
    ids=["float-input", "too-long"],
)
def test_refuses_what_it_cannot_read(x: torch.Tensor, message: str) -> None:
    with pytest.raises(ModelError, match=message):
        _model()(x)


def test_refuses_shapes_it_cannot_build() -> None:
    with pytest.raises(ValueError, match=r"sequences of shape \(T,\)"):
        gpt_tiny((3, 32, 32), 10)
    with pytest.raises(ValueError, match="multiple of heads"):
        gpt_tiny((T,), 256, d_model=30, heads=4)
