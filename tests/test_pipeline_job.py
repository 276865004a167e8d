"""The training job and the pipeline's schedules: it takes every one, zbv's two chunks too."""

from __future__ import annotations

import pytest

from hethpc.train.config import ConfigError, TrainConfig
from hethpc.train.engine import check_pipeline_config, model_chunks


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
