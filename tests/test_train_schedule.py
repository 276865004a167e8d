"""The learning-rate schedules of the job (``lr_schedule``), as plain functions and as built."""

from __future__ import annotations

import pytest
import torch

from hethpc.train.parts.optim import make_optimizer, wsd_factor
from hethpc.train.settings.config import TrainConfig


@pytest.mark.parametrize(
    ("step", "want"),
    [(0, 1.0), (80, 1.0), (85, 0.75), (90, 0.5), (99, 0.05), (100, 0.0), (120, 0.0)],
)
def test_wsd_is_constant_then_a_straight_line_to_zero_over_the_last_fifth(
    step: int, want: float
) -> None:
    assert wsd_factor(step, 100) == pytest.approx(want)


def test_wsd_with_no_steps_keeps_the_rate() -> None:
    assert wsd_factor(0, 0) == 1.0


@pytest.mark.parametrize("schedule", ["constant", "cosine", "step", "wsd"])
def test_each_schedule_starts_at_the_configured_rate(schedule: str) -> None:
    model = torch.nn.Linear(3, 2)
    opt, sched = make_optimizer(TrainConfig(lr=0.05, lr_schedule=schedule), model, 100)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.05)
    rates = []
    for _ in range(100):
        opt.step()
        sched.step()
        rates.append(opt.param_groups[0]["lr"])
    last = {"constant": 0.05, "cosine": 0.0, "step": 0.05 * 1e-3, "wsd": 0.0}[schedule]
    assert rates[-1] == pytest.approx(last, abs=1e-9)
    if schedule == "wsd":
        assert rates[78] == pytest.approx(0.05) and rates[89] == pytest.approx(0.025)
