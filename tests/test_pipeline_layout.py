"""The P x D rank layout and the activation meter, without MPI."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hethpc.pipeline import PipelineError
from hethpc.pipeline.groups import Layout, pipeline_layout
from hethpc.pipeline.memory import ActivationMeter


@pytest.mark.parametrize(
    ("stages", "world", "rank", "want"),
    [
        pytest.param(2, 2, 1, Layout(2, 1, 1, 0), id="P2-rank1"),
        pytest.param(2, 4, 3, Layout(2, 2, 1, 1), id="P2xD2-rank3"),
        pytest.param(3, 6, 2, Layout(3, 2, 2, 0), id="P3xD2-rank2"),
        pytest.param(1, 3, 2, Layout(1, 3, 0, 2), id="pure-data-parallel"),
    ],
)
def test_pipeline_layout(stages: int, world: int, rank: int, want: Layout) -> None:
    assert pipeline_layout(stages, world, rank) == want


def test_groups_tile_the_world() -> None:
    layout = pipeline_layout(2, 6, 0)
    pipelines = [layout.pipeline_ranks(d) for d in range(3)]
    replicas = [layout.replica_ranks(s) for s in range(2)]
    assert pipelines == [(0, 1), (2, 3), (4, 5)]
    assert replicas == [(0, 2, 4), (1, 3, 5)]
    for r in range(6):
        mine = pipeline_layout(2, 6, r)
        assert pipelines[mine.replica][mine.stage] == r
        assert replicas[mine.stage][mine.replica] == r


@pytest.mark.parametrize(
    ("stages", "world"),
    [pytest.param(3, 4, id="not-a-divisor"), pytest.param(0, 4, id="zero")],
)
def test_pipeline_layout_errors(stages: int, world: int) -> None:
    # Named as the API's keyword (build_pipeline(stages=...)): there is no --stages flag.
    match = f"^stages = {stages} must be at least 1 and divide the world size"
    with pytest.raises(PipelineError, match=match):
        pipeline_layout(stages, world, 0)


def test_activation_meter_counts_saved_activations_not_parameters() -> None:
    layer = nn.Linear(100, 100)
    x = torch.randn(8, 100, requires_grad=True)
    with ActivationMeter() as meter:
        y = layer(x)  # saves x (8 x 100 floats); the weight is a parameter
        assert meter.live_bytes == 8 * 100 * 4
        z = layer(y)
        assert meter.live_bytes == 2 * 8 * 100 * 4
        z.sum().backward()
        del y, z
    assert meter.live_bytes == 0
    assert meter.peak_bytes == 2 * 8 * 100 * 4
    meter.reset()
    assert meter.peak_bytes == 0
