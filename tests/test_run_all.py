"""benchmarks/run_all.py's results table: nested results get their own rows and goals."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import run_all  # noqa: E402


def test_long_nested_results_become_rows_short_ones_stay_inline() -> None:
    paced = {"speedup": 1.9, "notes": "x" * 200}
    data = {"speedup": 1.5, "parts": {"a": 0.1}, "paced": paced}
    rows = dict(run_all._rows(data))
    assert rows["speedup"] == 1.5 and rows["parts"] == {"a": 0.1}
    assert rows["paced.speedup"] == 1.9 and "paced" not in rows


def test_the_paced_dynamic_batching_run_is_held_to_the_same_goals() -> None:
    data = {"speedup": 1.5, "paced": {"speedup": 1.9, "steady_adjustments": 2, "pad": "x" * 200}}
    table = run_all.render({"bench_dynbatch": (data, 1.0, "")}, {"bench_dynbatch": "now"})
    rows = [line for line in table.splitlines() if line.startswith("| bench")]
    lines = {line.split(" | ")[1]: line for line in rows}
    assert lines["speedup"].endswith("| no |")
    assert lines["paced.speedup"].endswith("| yes |") and "paced" in lines["paced.speedup"]
    assert lines["paced.steady_adjustments"].endswith("| no |")


def test_a_saved_run_is_ingested_with_its_goals_and_tables(tmp_path: Path) -> None:
    log = tmp_path / "tta.log"
    goals = {"demo_time_ratio": 0.55, "demo_acc_gap_points": 0.3, "skew_selsync_acc_gap_points":
             -0.15, "skew_selsync_sync_fraction": 0.23}  # long: one row per goal  # fmt: skip
    log.write_text(f"launching\n{json.dumps({'goals': goals, 'quick': False})}\ntrailer\n")
    out = tmp_path / "RESULTS.md"
    assert run_all.main(["--ingest", f"bench_tta={log}@1900", "--out", str(out)]) == 0
    text = out.read_text()
    assert "bench_tta: " in text and "default run, 1900 s" in text
    assert "| bench_tta | goals.demo_time_ratio | 0.55 | <= 0.6" in text and "| yes |" in text
    assert "## bench_tta: `TTA.md`" in text  # its tables and plots follow
    assert (tmp_path / "RESULTS.json").is_file()
    bad = tmp_path / "empty.log"
    bad.write_text("no result\n")
    with pytest.raises(SystemExit):
        run_all.main(["--ingest", f"bench_tta={bad}", "--out", str(out)])


def test_render_rewrites_the_table_from_the_kept_results_and_only_needs_names(
    tmp_path: Path,
) -> None:
    log = tmp_path / "tta.log"
    goals = {"demo_time_ratio": 0.7, "demo_acc_gap_points": 0.3, "skew_selsync_acc_gap_points":
             -0.15, "skew_selsync_sync_fraction": 0.23}  # long: one row per goal  # fmt: skip
    log.write_text(json.dumps({"goals": goals, "quick": False}) + "\n")
    out = tmp_path / "RESULTS.md"
    assert run_all.main(["--ingest", f"bench_tta={log}@10", "--out", str(out)]) == 0
    out.write_text("stale\n")
    assert run_all.main(["--render", "--out", str(out)]) == 0  # runs nothing
    text = out.read_text()
    assert "| bench_tta | goals.demo_time_ratio | 0.7 | <= 0.6" in text and "| no |" in text
    with pytest.raises(SystemExit):  # not "every benchmark", which would take an hour
        run_all.main(["--only", "--out", str(out)])
