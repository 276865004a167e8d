"""Averaging the optimizer's state with the parameters: when the job turns it on, and where it
is refused (the averages themselves are tested on real ranks in tests/mpi)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hethpc.sync import SelSync
from hethpc.sync.state_average import StateAverage
from hethpc.train.parts.capabilities import make_policy
from hethpc.train.settings.config import ConfigError, TrainConfig
from hethpc.train.settings.policy import averages_optimizer_state

# DiLoCo-like: ranks take local steps sized by their speed, different numbers between averages.
SPEED = {"sync": "fedavg", "partition": "labels", "inner_steps": "speed", "batching": "dynamic"}


@pytest.mark.parametrize(
    ("settings", "on"),
    [
        ({"sync": "selsync", "partition": "labels"}, True),
        ({"sync": "selsync", "partition": "iid"}, False),
        ({"sync": "fedavg", "partition": "dirichlet"}, True),
        ({"sync": "bsp", "partition": "labels"}, False),
        ({"sync": "local", "partition": "labels"}, False),
        ({"sync": "selsync", "partition": "labels", "aggregation": "grads"}, False),
        ({"sync": "selsync", "partition": "labels", "average_optimizer_state": "off"}, False),
        ({"sync": "fedavg", "partition": "iid", "average_optimizer_state": "on"}, True),
        ({**SPEED, "average_optimizer_state": "auto"}, False),
        ({**SPEED, "average_optimizer_state": "on"}, True),
    ],
)
def test_auto_is_on_for_label_skewed_partitions(settings: dict[str, str], on: bool) -> None:
    cfg = TrainConfig(**settings)  # type: ignore[arg-type]
    assert averages_optimizer_state(cfg) is on
    assert make_policy(cfg).optimizer_state is on


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"sync": "bsp"}, "sync bsp averages no parameters"),
        ({"sync": "selsync", "aggregation": "grads"}, "with aggregation grads"),
        ({"sync": "local"}, "sync local averages no parameters"),
    ],
)
def test_on_is_refused_where_no_parameters_are_averaged(
    settings: dict[str, str], named: str
) -> None:
    with pytest.raises(ConfigError, match=named) as e:
        TrainConfig(**settings, average_optimizer_state="on")  # type: ignore[arg-type]
    assert e.value.key == "average_optimizer_state"
    assert "average_optimizer_state auto" in str(e.value)


def test_in_one_process_the_average_is_the_state_itself() -> None:
    # A group of one: the policy's steps leave SGD's momentum as plain SGD would.
    torch.manual_seed(0)
    a, b = nn.Linear(3, 2), nn.Linear(3, 2)
    b.load_state_dict(a.state_dict())
    opt_a = torch.optim.SGD(a.parameters(), lr=0.1, momentum=0.9)
    opt_b = torch.optim.SGD(b.parameters(), lr=0.1, momentum=0.9)
    policy = SelSync(threshold=0.0, optimizer_state=True)  # syncs every step
    for _ in range(4):
        x = torch.randn(5, 3)
        for model, opt in ((a, opt_a), (b, opt_b)):
            opt.zero_grad()
            model(x).square().sum().backward()
        policy.step(a, opt_a)
        opt_b.step()
    policy.settle()
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(p, q)
        mine, plain = opt_a.state[p]["momentum_buffer"], opt_b.state[q]["momentum_buffer"]
        torch.testing.assert_close(mine, plain)


def test_settle_without_an_average_in_flight_does_nothing() -> None:
    avg = StateAverage()
    assert not avg.in_flight
    avg.settle()
    t = torch.ones(3)
    avg.start([t], 0.5, None)  # a group of one: the weighted state, written back at settle
    assert avg.in_flight
    avg.settle()
    assert not avg.in_flight
    torch.testing.assert_close(t, torch.full((3,), 0.5))


def test_successive_averages_reuse_the_flat_copy_and_follow_the_tensors() -> None:
    # The flat copy is kept between averages (large ones in huge-page memory); each average
    # still writes back its own tensors' values, also when their number changes.
    avg = StateAverage()
    big = torch.arange(600_000, dtype=torch.float32)  # 2.4 MB: a transfer buffer
    small = torch.ones(4, dtype=torch.float64)
    avg.start([big, small], 0.5, None)
    avg.settle()
    torch.testing.assert_close(big, 0.5 * torch.arange(600_000, dtype=torch.float32))
    big.fill_(2.0)
    avg.start([big, small], 0.25, None)
    avg.settle()
    assert bool((big == 0.5).all()) and bool((small == 0.125).all())
    extra = torch.full((10,), 8.0)
    avg.start([big, extra], 1.0, None)
    avg.settle()
    assert bool((big == 0.5).all()) and bool((extra == 8.0).all())
