"""The split backward (input gradient first, weight gradients after) against plain backward."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hethpc.pipeline.backward import can_split, input_gradient, tapped_forward, weight_gradients


def _model(inplace: bool = False) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(6, 10), nn.ReLU(inplace=inplace), nn.Linear(10, 10), nn.Tanh(),
        nn.Linear(10, 3),
    )


def _grads(model: nn.Module) -> list[torch.Tensor | None]:
    return [None if p.grad is None else p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("case", ["loss", "output-grad", "inplace-relu", "frozen", "accumulate"])
def test_split_backward_equals_plain_backward(case: str) -> None:
    x = torch.randn(5, 6, generator=torch.Generator().manual_seed(1))
    y = torch.randn(5, 3, generator=torch.Generator().manual_seed(2))
    results = []
    for split in (False, True):
        model = _model(inplace=case == "inplace-relu")
        if case == "frozen":
            model[2].weight.requires_grad_(False)
        if case == "accumulate":  # backward adds into existing gradients
            for p in model.parameters():
                p.grad = torch.ones_like(p)
        inp = x.clone().requires_grad_(True)
        grad = y if case == "output-grad" else None
        if split:
            out, taps = tapped_forward(model, inp)
            if grad is None:
                out = nn.functional.mse_loss(out, y)
            g_in, tap_grads = input_gradient(out, grad, inp, taps)
            before = _grads(model)
            weight_gradients(taps, tap_grads)
            if case != "accumulate":
                assert all(g is None for g in before)  # the first pass left weights alone
        else:
            out = model(inp)
            if grad is None:
                out = nn.functional.mse_loss(out, y)
            torch.autograd.backward(out, grad)
            g_in = inp.grad
        results.append((g_in, _grads(model)))
    (g_plain, w_plain), (g_split, w_split) = results
    torch.testing.assert_close(g_split, g_plain, rtol=0, atol=0)
    assert len(w_split) == len(w_plain)
    for a, b in zip(w_split, w_plain, strict=True):
        if b is None:
            assert a is None
        else:
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_can_split_only_flat_parametrised_layers() -> None:
    assert can_split(_model())
    block = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    assert not can_split(nn.Sequential(block, nn.Linear(4, 2)))
    for p in block.parameters():
        p.requires_grad_(False)
    assert can_split(nn.Sequential(block, nn.Linear(4, 2)))  # frozen inside: nothing to redo
    assert can_split(nn.Sequential(nn.ReLU(), nn.Flatten()))


def test_taps_skip_layers_without_trainable_parameters_or_grad() -> None:
    model = _model()
    model[0].requires_grad_(False)
    x = torch.randn(2, 6)
    out, taps = tapped_forward(model, x)  # input without grad
    assert [len(p) for _, p in taps] == [2, 2]  # model[2] and model[4]; model[0] frozen
    torch.testing.assert_close(out, model(x), rtol=0, atol=0)
