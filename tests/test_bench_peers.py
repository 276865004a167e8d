"""The benchmarks with peer rows end to end in their short forms: each prints its JSON line
with hethpc beside its peers (the figures themselves come from full runs, not from here).
bench_pipeline --quick runs in tests/test_device_check.py, bench_tta in tests/test_bench_tta.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hethpc.testbed.kernel import missing

ROOT = Path(__file__).resolve().parents[1]


def _last_json(args: list[str]) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_loader_and_open_benchmarks_print_their_peer_rows(tmp_path: Path) -> None:
    path = str(tmp_path / "ds")
    got = _last_json([
        "benchmarks/bench_loader.py", "--path", path, "--gigabytes", "0.004",
        "--batch-sizes", "64", "--read-mb", "1", "--rounds", "1", "--naive-seconds", "0.2",
        "--torch-seconds", "0.2",
    ])
    assert got["page_cache"] == "reread" and got["batch_size"] == 64
    for peer in ("memmap_shuffled", "memmap_contiguous", "torch_h5py_0w", "torch_h5py_2w"):
        assert got[f"{peer}_samples_per_s"] > 0
        assert got[f"loader_vs_{peer}"] > 0
    assert (tmp_path / "ds" / "x.f32").is_file()  # the flat copy memmap reads
    opened = _last_json(["benchmarks/bench_open.py", "--quick", "--path", path])
    assert opened["ranks"] == 2 and opened["shared_verify_s"] > 0 and opened["speedup"] > 0


def test_overhead_and_comm_benchmarks_print_their_peer_rows() -> None:
    got = _last_json(["benchmarks/bench_overhead.py", "--quick"])
    for model in ("cnn1d", "large"):
        for ratio in ("hethpc_vs_horovod", "hethpc_vs_ddp", "job_vs_horovod", "job_vs_ddp"):
            assert got[model][ratio] > 0, (model, ratio)
    assert set(got["large"]["allreduce_ms"]) >= {"hethpc", "mpi4py", "gloo", "horovod_flat"}
    assert got["large"]["allreduce_vs_fastest"] > 0
    comm_rows = _last_json(["benchmarks/bench_comm.py", "--quick"])
    assert comm_rows["ranks"] == 2
    assert comm_rows["mpi_1elem_allreduce_us"] > 0 and comm_rows["horovod_1elem_allreduce_us"] > 0


def test_wait_benchmark_times_hethpc_beside_a_blocking_allreduce_and_gloo() -> None:
    got = _last_json(["benchmarks/bench_wait.py", "--quick", "--reps", "5"])
    assert got["reps"] == 30  # --quick sets it
    for key in ("MPI_Allreduce", "hethpc_500us", "hethpc_50us", "gloo"):
        assert got["shm"][f"{key}_ms"] > 0 and got["shm"][f"{key}_cpu_ms"] >= 0, key
    assert len(got["per_rank"]["shm"]) == 2


def test_compression_benchmark_prints_steps_bytes_and_accuracy() -> None:
    got = _last_json(["benchmarks/bench_compression.py", "--quick", "--only", "emulated,accuracy",
                      "--link", "10gbit", "--rounds", "1", "--steps", "1"])  # fmt: skip
    # what each setting sent is counted by hethpc itself: fp16 halves it, PowerSGD far more
    assert got["emulated_hethpc_none_fewer_bytes"] == 1.0
    assert got["emulated_hethpc_fp16_fewer_bytes"] == 2.0
    assert got["emulated_hethpc_powersgd4_fewer_bytes"] > 4
    assert got["emulated_hethpc_powersgd4_step_ms"] > 0
    # overlapped, one PowerSGD round per bucket: the same bytes
    assert got["emulated_hethpc_overlap_powersgd4_fewer_bytes"] == (
        got["emulated_hethpc_powersgd4_fewer_bytes"]
    )
    assert len(got["detail"]["accuracy"]) == 10
    assert 0 < got["acc_cnn1d_diloco_int8"] <= 1
    assert got["acc_cnn1d_selsync_int8_fewer_bytes"] > 1
    # int8 sends a byte per value and a float per 1,024 (the first average too: its change
    # since the broadcast start), and the gaps are also taken seed by seed
    for m in ("selsync", "diloco"):
        assert 3.9 < got[f"acc_cnn1d_{m}_int8_codec_ratio"] < 4
        assert got[f"acc_cnn1d_{m}_int8_seeds_below_fp32"] in ("0 of 1", "1 of 1")


@pytest.mark.skipif(bool(missing()), reason="testbed needs " + "; ".join(missing()))
def test_testbed_draws_benchmark_times_horovod_hethpc_and_ddp_on_a_fresh_testbed() -> None:
    got = _last_json(["benchmarks/bench_testbed_draws.py", "--quick"])
    (draw,) = got["detail"]
    assert (draw["scenario"], draw["nodes"]) == ("testbed_demo", "capped")
    assert sorted(r["job"] for r in draw["runs"]) == ["ddp", "hethpc_bsp", "horovod"]
    for r in draw["runs"]:
        assert r["train_time_s"] > 0, r
        assert len(r["throttled"]) == 2 and all(0 <= x <= 1 for x in r["throttled"]), r
    for job in ("horovod", "hethpc_bsp", "ddp"):
        assert got["summary"]["testbed_demo"]["capped"][job]["finished"] == 1
        assert "of 1 slower than twice the fastest" in got[f"testbed_demo.capped.{job}"]
