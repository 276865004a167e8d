"""bench_tta: its time-to-target rule, and a --quick run end to end on 2 ranks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_tta  # noqa: E402

from hethpc.train import TrainConfig  # noqa: E402


@pytest.mark.parametrize(
    ("curve", "target", "want"),
    [
        ([(1.0, 0.5), (2.0, 0.9)], 0.7, 1.5),
        ([(1.0, 0.8)], 0.4, 0.5),
        ([(1.0, 0.5), (2.0, 0.6)], 0.9, None),
        ([(1.0, 0.9), (2.0, 0.9)], 0.9, 1.0),
    ],
    ids=["between-points", "before-first", "never", "at-a-point"],
)
def test_time_to_target(curve: list, target: float, want: float | None) -> None:
    got = bench_tta.time_to(curve, target)
    assert got == (pytest.approx(want) if want is not None else None)


def test_every_method_of_a_scenario_has_its_settings() -> None:
    args = bench_tta.parse_args([])
    for name, scen in bench_tta.SCENARIOS.items():
        for m in bench_tta.METHODS:
            kw = bench_tta.settings(m, scen, args)
            assert kw["link"] == scen["link"] and kw["slowdown"] == scen["compute"], (name, m)
            TrainConfig(**kw)  # a valid run
    skew = bench_tta.settings("selsync_dynamic_inject", bench_tta.SCENARIOS["demo"], args)
    assert skew["inject_alpha"] > 0 and skew["batching"] == "dynamic"
    published = bench_tta.settings("selsync_published", bench_tta.SCENARIOS["demo"], args)
    assert published["max_local_steps"] == 0 and published["drift_correction"] == "off"
    assert set(bench_tta.DEFAULT_METHODS) <= set(bench_tta.METHODS)


@pytest.mark.skipif("OMPI_COMM_WORLD_SIZE" in os.environ, reason="launches mpirun itself")
def test_quick_run_prints_one_json_object(tmp_path: Path) -> None:
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_tta.py"), "--quick"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1", "HETHPC_MPIRUN_TIMEOUT": "300",
             "TMPDIR": str(scratch)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    left = sorted(p.name for p in scratch.iterdir() if not p.name.startswith("torchinductor_"))
    assert left == [], f"bench_tta left temporary files behind: {left}"
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    demo = result["scenarios"]["demo"]
    assert set(demo["methods"]) == {"bsp", "selsync"}
    for r in demo["methods"].values():
        assert 0.1 < r["test_acc"] <= 1.0 and r["train_s"] > 0
    assert demo["methods"]["bsp"]["sync_fraction"] == 1.0
