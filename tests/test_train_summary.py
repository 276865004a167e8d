"""The summary table's rows, and the time a score curve takes to reach a target."""

from __future__ import annotations

import pytest

from hethpc.train import format_summary, time_to_target


def _rows(text: str) -> dict[str, str]:
    """Label -> the first run's cell: the columns are two or more spaces apart."""
    rows = {}
    for line in text.splitlines()[2:]:
        label, _, rest = line.partition("  ")
        rows[label.strip()] = rest.strip().split("  ")[0]
    return rows


def test_a_regression_run_shows_its_test_and_validation_mse() -> None:
    rows = _rows(format_summary([{"test_mse": 0.0123456, "val_mse": 0.02, "steps": 80}]))
    assert rows["test MSE (averaged model)"] == "0.01235"
    assert rows["validation MSE"] == "0.02"
    assert not any("accuracy" in label for label in rows), rows


def test_a_metric_of_the_users_own_gets_a_row() -> None:
    rows = _rows(format_summary([{"test_mae": 0.5, "val_mae": 0.25, "steps": 1}]))
    assert rows["test mae (averaged model)"] == "0.5" and rows["validation mae"] == "0.25"


@pytest.mark.parametrize(
    ("summaries", "label"),
    [
        ([{"final_batch_sizes": [64, 64], "world_size": 2}], "final batch sizes per rank"),
        ([{"final_batch_sizes": [128], "world_size": 2, "pipeline_stages": 2, "replicas": 1}],
         "final batch sizes per replica"),
        ([{"final_batch_sizes": [64, 64], "world_size": 2},
          {"final_batch_sizes": [128], "world_size": 2, "pipeline_stages": 2, "replicas": 1}],
         "final batch sizes per rank (pipelines: per replica)"),
    ],
    ids=["data-parallel", "pipeline", "both"],
)  # fmt: skip
def test_batch_sizes_are_labelled_per_replica_for_a_pipeline(summaries: list, label: str) -> None:
    assert label in _rows(format_summary(summaries))


def test_a_pipeline_run_shows_its_stages_and_replicas() -> None:
    summary = {"final_batch_sizes": [60, 68], "world_size": 6, "pipeline_stages": 3, "replicas": 2}
    rows = _rows(format_summary([summary]))
    assert rows["ranks"] == "6" and rows["pipeline stages"] == "3"
    assert rows["pipeline replicas"] == "2" and rows["final batch sizes per replica"] == "60 / 68"


@pytest.mark.parametrize(
    ("curve", "target", "want"),
    [
        ([(1.0, 1.0), (2.0, 0.1)], 0.55, 1.5),
        ([(1.0, 0.1)], 0.5, 1.0),
        ([(1.0, 1.0), (2.0, 0.6)], 0.5, None),
        ([(1.0, 0.5), (2.0, 0.5)], 0.5, 1.0),
    ],
    ids=["between-points", "at-the-first", "never", "at-a-point"],
)
def test_time_to_a_lower_is_better_target(curve: list, target: float, want: float | None) -> None:
    got = time_to_target(curve, target, lower_is_better=True)
    assert got == (pytest.approx(want) if want is not None else None)


def test_time_to_a_higher_is_better_target_starts_from_0_at_0_s() -> None:
    assert time_to_target([(1.0, 0.8)], 0.4) == pytest.approx(0.5)
