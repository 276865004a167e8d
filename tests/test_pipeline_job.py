"""The training job and the pipeline's schedules: which it runs, and its refusal of zbv."""

from __future__ import annotations

import pytest

from hethpc.train.config import ConfigError, TrainConfig
from hethpc.train.engine import check_pipeline_config


def test_the_job_refuses_zbv_and_names_the_fix() -> None:
    cfg = TrainConfig(pipeline_stages=2, schedule="zbv", batch_size=64, micro_batches=4)
    with pytest.raises(ConfigError, match="--schedule zbv with --pipeline-stages 2") as e:
        check_pipeline_config(cfg, 2)
    assert e.value.key == "schedule"
    assert "use --schedule zb in jobs" in str(e.value)
    assert 'Pipeline(..., schedule="zbv")' in str(e.value)


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe", "zb"])
def test_the_job_takes_the_one_chunk_schedules(schedule: str) -> None:
    cfg = TrainConfig(pipeline_stages=2, schedule=schedule, batch_size=64, micro_batches=4)
    check_pipeline_config(cfg, 2)  # no error
