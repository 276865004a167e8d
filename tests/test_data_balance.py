"""Rebalancing unequal batches on partitioned data: the shares, the transfer plan, the settings."""

from __future__ import annotations

import numpy as np
import pytest

from hethpc.data.balance import proportional_shares, transfer_plan
from hethpc.train import TrainConfig
from hethpc.train.parts.capabilities import make_rebalancer
from hethpc.train.run.shares import gradient_weight
from hethpc.train.settings.config import ConfigError


def test_shares_follow_the_partition_sizes_and_sum_to_the_batch() -> None:
    assert proportional_shares(128, [8000, 8000]).tolist() == [64, 64]
    assert proportional_shares(128, [1, 2, 1]).tolist() == [32, 64, 32]
    assert proportional_shares(10, [1, 1, 1]).tolist() == [4, 3, 3]  # ties: the lower rank
    assert proportional_shares(7, [0, 5]).tolist() == [0, 7]
    with pytest.raises(ValueError, match="positive sum"):
        proportional_shares(4, [0, 0])


def test_plan_moves_each_surplus_to_a_deficit_in_rank_order() -> None:
    assert transfer_plan([64, 64], [93, 35]) == [(1, 0, 29)]
    assert transfer_plan([64, 64], [64, 64]) == []
    plan = transfer_plan([40, 40, 40], [70, 30, 20])
    assert plan == [(1, 0, 10), (2, 0, 20)]
    reads, sizes = np.array([30, 50, 20, 28]), np.array([10, 20, 60, 38])
    got = reads.copy()
    for src, dest, n in transfer_plan(reads, sizes):
        got[src] -= n
        got[dest] += n
    assert got.tolist() == sizes.tolist()
    with pytest.raises(ValueError, match="one length and one sum"):
        transfer_plan([64, 64], [64, 65])


def test_rebalanced_batches_are_weighted_by_batch_share() -> None:
    sizes, lengths = np.array([93, 35]), np.array([8000, 8000])
    assert gradient_weight("labels", rank=1, batch_sizes=sizes, partition_lengths=lengths) == 0.5
    w = gradient_weight("labels", rank=1, batch_sizes=sizes, partition_lengths=lengths,
                        rebalanced=True)  # fmt: skip
    assert w == pytest.approx(35 / 128)


@pytest.mark.parametrize(
    ("settings", "on"),
    [
        ({"batching": "dynamic", "partition": "labels", "sync": "bsp"}, True),
        ({"batching": "static", "partition": "dirichlet", "sync": "bsp"}, True),
        ({"batching": "uniform", "partition": "labels", "sync": "bsp"}, False),
        ({"batching": "dynamic", "partition": "iid", "sync": "bsp"}, False),
        ({"batching": "dynamic", "partition": "labels", "sync": "selsync"}, False),
        ({"batching": "dynamic", "partition": "labels", "sync": "selsync", "aggregation": "grads"},
         True),
        ({"batching": "dynamic", "partition": "labels", "sync": "selsync", "rebalance": "on"},
         True),
        ({"batching": "dynamic", "partition": "labels", "sync": "bsp", "rebalance": "off"}, False),
    ],
)
def test_auto_where_gradients_are_averaged_every_step(settings: dict[str, str], on: bool) -> None:
    cfg = TrainConfig(**settings)  # type: ignore[arg-type]
    lengths = None if cfg.partition == "iid" else np.array([10])
    assert (make_rebalancer(cfg, lengths) is not None) is on


def test_refused_with_pipelines_and_ssp() -> None:
    with pytest.raises(ConfigError, match="rebalance = 'on'.*pipeline"):
        TrainConfig(rebalance="on", pipeline_stages=2)
    with pytest.raises(ConfigError, match="sync ssp.*rebalancing"):
        TrainConfig(rebalance="on", sync="ssp")
