"""Memory caps on one pass (max_rank_batch): the setting, the pieces, the measured cap, and a
capped run training the same parameters as an uncapped one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import hethpc
from hethpc.batching.memory_cap import (
    cap_from,
    caps_for,
    measure_cap,
    parse_max_rank_batch,
    pieces,
    saved_bytes,
)
from hethpc.train import ConfigError, TrainConfig


@pytest.mark.parametrize(
    ("text", "want"),
    [("none", None), ("auto", "auto"), ("256", (256,)), (" 512,128 ", (512, 128))],
)
def test_the_setting_reads_none_auto_one_cap_or_one_per_rank(text: str, want: object) -> None:
    assert parse_max_rank_batch(text) == want


@pytest.mark.parametrize("text", ["0", "-4", "big", "64,", "64,0"])
def test_a_bad_setting_is_refused_with_the_syntax(text: str) -> None:
    with pytest.raises(ConfigError, match=r"not none, auto, a number of samples >= 1 or one per"):
        TrainConfig(max_rank_batch=text)


def test_caps_are_one_per_rank_and_refused_pipelines_and_negative_limits() -> None:
    assert caps_for((64,), 3) == [64, 64, 64]
    assert caps_for((64, 32), 2) == [64, 32]
    with pytest.raises(ValueError, match="gives 3 caps for 2 ranks"):
        caps_for((1, 2, 3), 2)
    with pytest.raises(ConfigError, match="raise micro_batches .* or give max_rank_batch auto"):
        TrainConfig(max_rank_batch="64", pipeline_stages=2)
    with pytest.raises(ConfigError, match="add pipeline_balance time \\(now 'params'\\)"):
        TrainConfig(max_rank_batch="auto", pipeline_stages=2)
    TrainConfig(max_rank_batch="auto", pipeline_stages=2, pipeline_balance="time")
    with pytest.raises(ConfigError, match="memory_limit_gb must be 0"):
        TrainConfig(memory_limit_gb=-1.0)


def test_a_share_past_its_cap_is_computed_in_pieces_of_at_most_the_cap() -> None:
    assert pieces(100, None) == 1
    assert pieces(100, 100) == 1
    assert pieces(101, 100) == 2
    assert pieces(300, 64) == 5  # 60 rows each
    assert pieces(10, 64, accumulate=4) == 4  # accumulate is a floor


def test_the_cap_comes_from_two_measured_passes() -> None:
    # 1 MiB fixed, 0.5 MiB per sample, 100 MiB left: half of it for the pass.
    mib = 2**20
    assert cap_from((10, 6 * mib), (20, 11 * mib), 100 * mib) == 98
    assert cap_from((10, 5 * mib), (20, 5 * mib), 100 * mib) is None  # nothing grows
    with pytest.raises(ValueError, match="only 1 MiB are left"):
        cap_from((1, 2 * mib), (2, 4 * mib), mib)


def test_the_saved_bytes_grow_with_the_rows_and_the_model_is_left_as_it_was() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 3))
    x = torch.randn(64, 8)

    def run_pass(n: int) -> None:
        model(x[:n]).sum()

    small, large = saved_bytes(run_pass, 16), saved_bytes(run_pass, 32)
    assert large > small > 0
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    cap = measure_cap(
        model, lambda n: (x[:n], torch.zeros(n)), torch.device("cpu"), rows=32, limit_gb=1.0
    )
    assert cap is not None and cap > 1000  # 1 GB over ~100 bytes a sample
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k  # BatchNorm's running statistics untouched
    assert torch.equal(torch.get_rng_state(), rng)


def _blobs(n: int) -> tuple[np.ndarray, np.ndarray]:
    g = np.random.default_rng(0)
    y = g.integers(0, 3, n)
    return (g.normal(size=(n, 4)) + y[:, None]).astype(np.float32), y


def _fit(tmp_path: Path, name: str, **settings: object) -> tuple[list[torch.Tensor], dict]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 3))
    result = hethpc.fit(
        model, _blobs(256), batch_size=30, max_steps=3, run_dir=str(tmp_path / name),
        progress=False, eval_every=0, **settings,
    )  # fmt: skip
    return [p.detach().clone() for p in result.model.parameters()], result.summary


def test_a_capped_run_trains_the_parameters_of_an_uncapped_one(tmp_path: Path) -> None:
    whole, _ = _fit(tmp_path, "whole")
    capped, summary = _fit(tmp_path, "capped", max_rank_batch="8")  # 30 rows: 4 pieces
    for a, b in zip(whole, capped, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert summary["max_rank_batch"] == [8]
    steps = [json.loads(line) for line in (tmp_path / "capped" / "metrics" / "rank0.jsonl").open()]
    assert [r["pieces"] for r in steps if r["kind"] == "step"] == [4, 4, 4]
    from hethpc.batching.memory_cap import _resident_bytes

    limit = (_resident_bytes() + 2**29) / 2**30  # 512 MiB above what this process holds
    _, measured = _fit(tmp_path, "auto", max_rank_batch="auto", memory_limit_gb=limit)
    assert measured["max_rank_batch"][0] > 30


def test_auto_without_a_known_memory_limit_says_how_to_give_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hethpc.batching import memory_cap

    monkeypatch.setattr(memory_cap, "cgroup_limit", lambda: None)
    with pytest.raises(ConfigError, match=r"rank 0: max_rank_batch auto needs .* memory_limit_gb"):
        _fit(tmp_path, "auto", max_rank_batch="auto")


def test_the_cgroup_limit_is_the_least_from_the_process_own_cgroup_up(tmp_path: Path) -> None:
    from hethpc.batching.memory_cap import cgroup_limit

    # v1: a SLURM-like tree, the job limited, the step below it not, the root "unlimited"
    v1 = tmp_path / "v1"
    for rel, text in (("", "9223372036854771712"), ("slurm/job_7", "4294967296"),
                      ("slurm/job_7/step_0", "9223372036854771712")):  # fmt: skip
        (v1 / "memory" / rel).mkdir(parents=True, exist_ok=True)
        (v1 / "memory" / rel / "memory.limit_in_bytes").write_text(text + "\n")
    own = "5:cpu:/\n4:memory:/slurm/job_7/step_0\n0::/\n"
    assert cgroup_limit(own, v1) == 4 * 2**30
    assert cgroup_limit("4:memory:/\n", v1) is None  # the root's "no limit"
    # v2: one unified hierarchy, "max" for no limit
    v2 = tmp_path / "v2"
    (v2 / "a" / "b").mkdir(parents=True)
    (v2 / "cgroup.controllers").write_text("cpu memory\n")
    (v2 / "a" / "memory.max").write_text("1073741824\n")
    (v2 / "a" / "b" / "memory.max").write_text("max\n")
    assert cgroup_limit("0::/a/b\n", v2) == 2**30
    assert cgroup_limit("0::/\n", v2) is None and cgroup_limit("", v2) is None


MEMORY_V1 = Path("/sys/fs/cgroup/memory")


@pytest.mark.skipif(
    os.geteuid() != 0 or not (MEMORY_V1 / "cgroup.procs").exists(),
    reason="needs root and the cgroup v1 memory controller",
)
def test_a_process_in_a_limited_cgroup_reads_its_limit() -> None:
    # a real cgroup of 3 GiB; a child process moves itself into it and reads what auto reads
    group = MEMORY_V1 / f"hethpc-test-{os.getpid()}"
    group.mkdir()
    try:
        (group / "memory.limit_in_bytes").write_text(str(3 * 2**30))
        code = (
            "import os, sys; from pathlib import Path\n"
            f"Path({str(group)!r}, 'cgroup.procs').write_text(str(os.getpid()))\n"
            "from hethpc.batching.memory_cap import cgroup_limit, memory_left\n"
            "import torch; print(cgroup_limit(), memory_left(torch.device('cpu')))\n"
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             check=True, timeout=60).stdout.split()  # fmt: skip
        assert int(out[0]) == 3 * 2**30 and 0 < int(out[1]) < 3 * 2**30, out
    finally:
        group.rmdir()  # the child has exited: the group is empty
