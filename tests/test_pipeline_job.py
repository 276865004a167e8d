"""The training job and the pipeline's schedules: it takes every one, zbv's two chunks too."""

from __future__ import annotations

import pytest
from torch import nn

from hethpc.train.parts.pipeline_stage import (
    check_pipeline_config,
    check_stage_parameters,
    model_chunks,
)
from hethpc.train.settings.config import ConfigError, TrainConfig


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe", "zb", "zbv"])
def test_the_job_takes_every_schedule(schedule: str) -> None:
    cfg = TrainConfig(pipeline_stages=2, schedule=schedule, batch_size=64, micro_batches=4)
    check_pipeline_config(cfg, 2)  # no error


def test_zbv_cuts_two_chunks_per_stage_and_names_the_fix_when_layers_are_short() -> None:
    assert model_chunks(TrainConfig(schedule="zbv"), 26, 2) == 4
    assert model_chunks(TrainConfig(schedule="zb"), 3, 3) == 3
    cfg = TrainConfig(model="mine.py:make", schedule="zbv")
    with pytest.raises(ConfigError, match="has 3 layers; use --schedule zb") as e:
        model_chunks(cfg, 3, 2)
    assert e.value.key == "schedule" and "at least 4 layers" in str(e.value)


@pytest.mark.parametrize(
    ("layers", "schedule", "balance", "match"),
    [
        ((nn.Flatten(), nn.Linear(4, 2)), "1f1b", (1, 1),
         r"stage\(s\) \[0\] would hold no trainable parameters .* has 1 layer\(s\) with "
         r"parameters among its 2 layers \(#1 Linear\); use --pipeline-stages 1 \(no pipeline\), "
         "or a model with at least 2 layers that hold parameters"),
        ((nn.Linear(4, 4), nn.ReLU(), nn.ReLU(), nn.Linear(4, 2)), "zbv", (1, 1, 1, 1),
         r"stage\(s\) \[1\] would hold .* use --schedule 1f1b"),
    ],
    ids=["flatten-linear-on-2", "zbv-middle-chunks-empty"],
)
def test_a_stage_without_parameters_is_refused_naming_the_layers(
    layers: tuple[nn.Module, ...], schedule: str, balance: tuple[int, ...], match: str
) -> None:
    cfg = TrainConfig(model="mine.py:make", schedule=schedule)
    with pytest.raises(ConfigError, match=match) as e:
        check_stage_parameters(cfg, nn.Sequential(*layers), balance, 2)
    assert e.value.key == "pipeline_stages"


def test_every_stage_with_parameters_passes() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    check_stage_parameters(TrainConfig(), model, (2, 1), 2)  # no error
