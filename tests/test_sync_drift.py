"""Drift correction: its per-step math, its accumulation over rounds, and where it is refused."""

from __future__ import annotations

import pytest
import torch

from hethpc.sync import BSP, SelSync
from hethpc.sync.drift import DriftCorrection, correction
from hethpc.train import TrainConfig
from hethpc.train.parts.capabilities import drift_correction, make_policy
from hethpc.train.settings.config import ConfigError


def _t(*v: float) -> torch.Tensor:
    return torch.tensor(v, dtype=torch.float64)


def test_correction_is_the_average_minus_the_replica_per_step() -> None:
    torch.testing.assert_close(correction(_t(1.0, 2.0), _t(0.0, 4.0), 4), _t(-0.25, 0.5))
    with pytest.raises(ValueError, match="at least one step"):
        correction(_t(1.0), _t(1.0), 0)


def _round(dc: DriftCorrection, p: torch.Tensor, own: torch.Tensor, avg: torch.Tensor,
           k: int) -> None:  # fmt: skip
    """k steps of a replica whose own steps move it by ``own`` each, then an average to ``avg``."""
    for _ in range(k):
        dc.apply([p])
        p.add_(own)
    dc.begin([p])
    p.copy_(avg)
    dc.end([p])


def test_a_constant_drift_is_cancelled_from_the_second_round_on() -> None:
    """A replica that drifts by +1 per step while the average stays put: after one round its
    correction is -1 per step, and later rounds keep it there (no oscillation)."""
    dc, p = DriftCorrection(), _t(0.0)
    _round(dc, p, _t(1.0), _t(0.0), 4)
    assert dc.drift is not None
    torch.testing.assert_close(dc.drift[0], _t(-1.0))
    for _ in range(3):
        before = p.clone()
        for _ in range(4):  # the corrected replica now stays where the average is
            dc.apply([p])
            p.add_(_t(1.0))
        torch.testing.assert_close(p, before)
        dc.begin([p])
        dc.end([p])  # the average is where the replica already is
        torch.testing.assert_close(dc.drift[0], _t(-1.0))


def test_rounds_of_other_lengths_and_smoothing() -> None:
    dc, p = DriftCorrection(smoothing=0.5), _t(0.0)
    _round(dc, p, _t(2.0), _t(0.0), 2)  # drift +2 per step -> correction -2
    torch.testing.assert_close(dc.drift[0], _t(-2.0))
    _round(dc, p, _t(4.0), _t(0.0), 3)  # own drift now +4: halfway from -2 to -4
    torch.testing.assert_close(dc.drift[0], _t(-3.0))
    with pytest.raises(ValueError, match="smoothing"):
        DriftCorrection(smoothing=0.0)


def test_state_round_trips() -> None:
    dc, p = DriftCorrection(), _t(0.0, 1.0)
    _round(dc, p, _t(1.0, -1.0), _t(0.0, 0.0), 2)
    dc.apply([p])
    again = DriftCorrection()
    again.load_state_dict(dc.state_dict())
    assert again.steps == dc.steps == 1
    torch.testing.assert_close(again.drift[0], dc.drift[0])


def test_refused_where_gradients_are_averaged() -> None:
    with pytest.raises(ValueError, match="drift correction needs a policy that averages"):
        BSP(drift=DriftCorrection())
    with pytest.raises(ValueError, match="drift correction works on averaged parameters"):
        SelSync(aggregation="grads", drift=DriftCorrection())
    with pytest.raises(ConfigError, match="drift_correction = 'on'.*sync bsp"):
        TrainConfig(sync="bsp", drift_correction="on")
    with pytest.raises(ConfigError, match="drift_smoothing"):
        TrainConfig(drift_smoothing=1.5)


@pytest.mark.parametrize(
    ("settings", "on"),
    [
        ({"sync": "selsync", "partition": "labels"}, True),
        ({"sync": "selsync", "partition": "iid"}, False),
        ({"sync": "fedavg", "partition": "dirichlet"}, True),
        ({"sync": "bsp", "partition": "labels"}, False),
        ({"sync": "selsync", "partition": "labels", "aggregation": "grads"}, False),
        ({"sync": "selsync", "partition": "labels", "drift_correction": "off"}, False),
        ({"sync": "fedavg", "partition": "iid", "drift_correction": "on"}, True),
    ],
)
def test_auto_is_on_for_label_skewed_partitions(settings: dict[str, str], on: bool) -> None:
    cfg = TrainConfig(**settings)  # type: ignore[arg-type]
    assert (drift_correction(cfg) is not None) is on
    assert (make_policy(cfg).drift is not None) is on
