"""Guards without MPI: model signatures, non-finite skips, faults, buffered metrics."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import nn

from hethpc.train import Fault, read_metrics
from hethpc.train.report.metrics import MetricsWriter
from hethpc.train.report.summary import format_summary
from hethpc.train.watch.guards import (
    AveragedGradientGuard,
    describe_mismatch,
    local_nonfinite,
    model_signature,
    poison_if_nonfinite_,
)


def _sig(model: nn.Module) -> list:
    return model_signature(model)


@pytest.mark.parametrize(
    ("other", "expect"),
    [
        (nn.Sequential(nn.Linear(4, 3)), ""),
        (nn.Sequential(nn.Linear(4, 5)), "0.weight: rank 0 has shape (3, 4)"),
        (nn.Sequential(nn.Linear(4, 3).double()), "torch.float64"),
        (
            nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 3)),
            "rank 1 has extra ['1.bias', '1.weight']",
        ),
        (nn.Sequential(nn.Identity(), nn.Linear(4, 3)), "rank 1 lacks ['0.bias', '0.weight']"),
    ],
    ids=["same", "shape", "dtype", "extra", "missing"],
)
def test_describe_mismatch(other: nn.Module, expect: str) -> None:
    got = describe_mismatch([_sig(nn.Sequential(nn.Linear(4, 3))), _sig(other)])
    assert (got == "") if expect == "" else (expect in got), got


@pytest.mark.parametrize(
    ("loss", "grad", "bad"),
    [
        (1.0, [1.0, 2.0], False),
        (math.nan, [1.0], True),
        (math.inf, [1.0], True),
        (1.0, [1.0, math.nan], True),
        (1.0, [-math.inf], True),
    ],
    ids=["finite", "nan-loss", "inf-loss", "nan-grad", "inf-grad"],
)
def test_local_nonfinite(loss: float, grad: list[float], bad: bool) -> None:
    assert local_nonfinite(torch.tensor(loss), [torch.tensor(grad), None]) is bad


@pytest.mark.parametrize(
    ("text", "fault"),
    [("1:20:kill", Fault(1, 20, "kill")), ("0:0:nan", Fault(0, 0, "nan"))],
    ids=["kill", "nan"],
)
def test_fault_parse(text: str, fault: Fault) -> None:
    assert Fault.parse(text) == fault


@pytest.mark.parametrize("text", ["1:2", "a:1:kill", "1:2:explode"], ids=["short", "nan", "kind"])
def test_fault_parse_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="fault"):
        Fault.parse(text)


def test_summary_table_has_one_column_per_run() -> None:
    text = format_summary(
        [{"test_acc": 0.9, "final_batch_sizes": [40, 88]}, {"test_acc": 0.5}], names=["a", "b"]
    )
    lines = text.splitlines()
    assert lines[0].split() == ["a", "b"]
    assert "90.00 %" in text and "50.00 %" in text and "40 / 88" in text


def _sgd_step(loss_value: float) -> tuple[nn.Linear, torch.optim.SGD, AveragedGradientGuard]:
    torch.manual_seed(0)
    layer = nn.Linear(3, 2)
    opt = torch.optim.SGD(layer.parameters(), lr=0.1, momentum=0.9)
    guard = AveragedGradientGuard(opt)
    loss = layer(torch.ones(4, 3)).sum()
    loss.backward()
    poison_if_nonfinite_(torch.tensor(loss_value), [p.grad for p in layer.parameters()])
    return layer, opt, guard


@pytest.mark.parametrize(
    ("loss", "skipped"),
    [(1.0, False), (math.nan, True), (math.inf, True), (-math.inf, True)],
    ids=["finite", "nan", "inf", "-inf"],
)
def test_guard_skips_the_update_of_a_nonfinite_loss(loss: float, skipped: bool) -> None:
    layer, opt, guard = _sgd_step(loss)
    before = [p.detach().clone() for p in layer.parameters()]
    opt.step()
    assert guard.tripped is skipped
    changed = [not torch.equal(a, p) for a, p in zip(before, layer.parameters(), strict=True)]
    assert changed == [not skipped] * 2
    assert (len(opt.state) == 0) is skipped  # no momentum buffer for a skipped step


def test_guard_skips_a_nonfinite_gradient_and_recovers() -> None:
    layer, opt, guard = _sgd_step(1.0)
    layer.bias.grad[0] = math.inf  # type: ignore[index]
    opt.step()
    assert guard.tripped and layer.weight.grad is None
    layer(torch.ones(1, 3)).sum().backward()
    opt.step()
    assert not guard.tripped and len(opt.state) == 2
    guard.remove()


def test_metrics_are_buffered_until_flushed(tmp_path: Path) -> None:
    w = MetricsWriter(tmp_path, 3, buffer=3)
    w.write("step", step=0, loss=torch.tensor(0.5), acc=torch.tensor(math.nan))
    assert read_metrics(w.path) == []
    w.write("step", step=1)
    w.flush()
    assert [r["step"] for r in read_metrics(w.path)] == [0, 1]
    assert read_metrics(w.path)[0]["loss"] == 0.5 and read_metrics(w.path)[0]["acc"] is None
    for s in range(2, 5):
        w.write("step", step=s)  # the third queued record flushes all three
    assert [r["step"] for r in read_metrics(w.path)] == [0, 1, 2, 3, 4]
    w.write("event", step=5)
    w.close()
    assert read_metrics(w.path)[-1] == {"kind": "event", "step": 5}
