"""The peers (benchmarks/peer_horovod.py, peer_ddp.py) train end to end on 2 ranks: on shared
memory, and (root, a host that can) DDP across a 2-node testbed, over its shaped links; they
hold out hethpc's validation split and evaluate on the evidence protocol's schedule.

Each run is one epoch of the demo's MNIST-1D (generated once for the module), enough to land
far above chance (10 %); the figures themselves come from full runs, not from here."""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import hethpc.train.run.loop
from hethpc import testbed  # the module: pytest would try to collect a class named Test*
from hethpc.data.holdout import holdout
from hethpc.testbed.kernel import missing
from hethpc.train import TrainConfig, train
from hethpc.train.parts.optim import wsd_factor

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import _peer_args  # noqa: E402
import _peer_data  # noqa: E402
from _peer_eval import Evaluations  # noqa: E402

SAMPLES = 20_000  # the demo's: 16,000 training samples, 125 steps of the global batch of 128
ARGS = ["--epochs", "1", "--samples", str(SAMPLES), "--batch-size", "128", "--lr", "0.05"]
EPOCH_FIELDS = {"epoch", "time_s", "test_acc", "train_loss"}
SUMMARY_FIELDS = {"peer", "world_size", "epochs", "total_time_s", "samples_per_s", "settings"}
# cnn1d_wide's parameters (105,738 float32): one allreduce of its gradients moves about this
# much over each of two ranks' links.
GRADIENT_BYTES = 105_738 * 4


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")  # the data is generated once for the module


def _env(cache: Path) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "HETHPC_CACHE": str(cache),
            "HETHPC_MPIRUN_TIMEOUT": "60"}  # fmt: skip


def _command(peer: str, out: Path, *extra: str) -> list[str]:
    script = str(ROOT / "benchmarks" / f"peer_{peer}.py")
    return [str(ROOT / "scripts" / "mpirun.sh"), "-np", "2", sys.executable, script, *ARGS,
            "--out", str(out), *extra]  # fmt: skip


def _check(done: subprocess.CompletedProcess[str], out: Path, peer: str) -> dict:
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads(out.read_text())
    assert summary == json.loads(done.stdout.strip().splitlines()[-1])  # rank 0's last line
    assert SUMMARY_FIELDS <= set(summary) and summary["peer"] == peer
    assert summary["world_size"] == 2 and summary["settings"]["samples"] == SAMPLES
    assert [set(e) for e in summary["epochs"]] == [EPOCH_FIELDS]
    assert summary["epochs"][0]["test_acc"] > 0.3, summary["epochs"]
    assert summary["samples_per_s"] > 0 and summary["total_time_s"] > 0
    return summary


@pytest.mark.parametrize(
    ("peer", "extra"),
    [("horovod", []), ("ddp", []), ("horovod", ["--fp16-allreduce"]),
     ("ddp", ["--fp16-compress"]), ("ddp", ["--powersgd", "2"])],
    ids=["horovod", "ddp", "horovod-fp16", "ddp-fp16", "ddp-powersgd"],
)  # fmt: skip
def test_peer_trains_on_two_ranks(peer: str, extra: list[str], cache: Path, tmp_path: Path) -> None:
    # plain and with the compression each offers (the evidence protocol's peer methods)
    if "OMPI_COMM_WORLD_SIZE" in os.environ:
        pytest.skip("launches mpirun itself; run it outside mpirun")
    out = tmp_path / "summary.json"
    done = subprocess.run(_command(peer, out, *extra), cwd=ROOT, env=_env(cache),
                          capture_output=True, text=True, timeout=90)  # fmt: skip
    summary = _check(done, out, peer)
    if peer == "ddp":
        assert summary["master_addr"] == "127.0.0.1"  # both ranks on this host


def test_ddp_peer_trains_across_testbed_nodes(cache: Path, tmp_path: Path) -> None:
    if "OMPI_COMM_WORLD_SIZE" in os.environ:
        pytest.skip("stands up a testbed; run it outside mpirun")
    if os.geteuid() != 0:
        pytest.skip("a testbed needs root")
    lack = missing()
    if lack:
        pytest.skip("no testbed on this host: it lacks " + "; ".join(lack))
    out = tmp_path / "summary.json"
    nodes = [{"cpu": 1.0, "link": "1gbit"}, {"cpu": 1.0, "link": "1gbit"}]
    with testbed.Testbed(nodes, name="peerst") as bed:
        before = bed.counters(1)
        done = bed.run(_command("ddp", out), cwd=ROOT, env=_env(cache), capture_output=True,
                       text=True, timeout=90)  # fmt: skip
        moved = sum(bed.counters(1)) - sum(before)
        summary = _check(done, out, "ddp")
        assert summary["testbed"] == "peerst"
        # Rank 0's address on the node's link, found by the peer itself, and gloo on that link.
        assert summary["master_addr"] == bed.address(0)
        assert summary["gloo_socket_ifname"] == "eth0"
        steps = summary["steps_per_epoch"]
        assert moved > steps * GRADIENT_BYTES, f"only {moved} bytes crossed node1's link"


def test_peer_holds_out_the_validation_split_hethpc_holds_out(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HETHPC_CACHE", str(cache))
    held: list = []

    def spy(*args, **kw):  # the split a real hethpc run evaluates on
        held.append(holdout(*args, **kw))
        return held[-1]

    monkeypatch.setattr(hethpc.train.run.loop, "holdout", spy)
    cfg = TrainConfig(model="mlp", samples=2000, epochs=1, max_steps=1, val_fraction=0.2,
                      data_seed=7, run_dir=str(tmp_path / "run"), progress=False)  # fmt: skip
    train(cfg, log=lambda _m: None)
    (kept, val), = held
    args = argparse.Namespace(samples=2000, data_seed=7, val_fraction=0.2)
    data = _peer_data.load_data(args, 0, lambda: None)
    assert data.val is not None and data.kept is not None
    np.testing.assert_array_equal(data.kept, kept)
    np.testing.assert_array_equal(data.val.tensors[0].numpy(), val.x)
    np.testing.assert_array_equal(data.val.tensors[1].numpy(), val.y)
    assert len(val) == 320  # 0.2 of the 1,600 training samples


@pytest.mark.parametrize("partition", ["iid", "labels"])
def test_peer_trains_on_the_kept_samples_only(cache: Path, partition: str,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HETHPC_CACHE", str(cache))
    args = argparse.Namespace(samples=2000, data_seed=7, val_fraction=0.2, seed=0,
                              partition=partition, labels_per_rank=6)  # fmt: skip
    data = _peer_data.load_data(args, 0, lambda: None)
    assert data.kept is not None
    seen = set()
    for rank in range(2):
        dataset, sampler = _peer_data.train_split(args, data, rank, 2)
        for x, _ in DataLoader(dataset, batch_size=64, sampler=sampler):
            seen |= {row.tobytes() for row in x.numpy()}
    kept = {row.tobytes() for row in data.train.tensors[0].numpy()[data.kept]}
    assert seen <= kept and len(seen) > 0.9 * len(kept)


class _Zero(torch.nn.Module):
    """Always class 0: its accuracy is the share of label 0."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(len(x), 10)
        out[:, 0] = 1.0
        return out


def _split(labels: list[int]) -> TensorDataset:
    return TensorDataset(torch.zeros(len(labels), 3), torch.tensor(labels))


def test_evaluations_score_every_k_steps_then_the_finals() -> None:
    val, test = _split([0, 1, 0, 0]), _split([0, 1, 2, 3, 4])
    ev = Evaluations(_Zero(), every=3, test=test, val=val, rank=0, size=1,
                     metric_sum=lambda v: v)  # fmt: skip
    ev.start()
    assert not any(ev.after_step(step, 0.5) for step in range(1, 8))
    assert [p["step"] for p in ev.curve] == [3, 6] and ev.curve[0]["val_acc"] == 0.75
    assert ev.scores_at(6) == {"val_acc": 0.75} and ev.scores_at(7) == {}
    out = ev.finish(7)
    assert out["final_val_acc"] == 0.75 and out["final_test_acc"] == 0.2
    assert out["diverged"] is None and out["curve"][-1]["train_time"] <= out["train_time_s"]


def test_evaluations_score_a_ranks_share_without_padding() -> None:
    ev = Evaluations(_Zero(), every=1, test=_split([0, 1, 0, 0, 0]), val=None, rank=1, size=2,
                     metric_sum=lambda v: v)  # fmt: skip
    assert ev.accuracy(ev.splits["test_acc"]) == 0.5  # samples 1 and 3 of 5


def test_a_non_finite_loss_ends_the_run_at_the_next_evaluation() -> None:
    ev = Evaluations(_Zero(), every=3, test=_split([0, 1]), val=_split([0]), rank=0, size=1,
                     metric_sum=lambda v: v)  # fmt: skip
    ev.start()
    stops = [ev.after_step(step, math.nan if step == 4 else 0.5) for step in range(1, 7)]
    assert stops == [False] * 5 + [True]
    assert ev.diverged == "non-finite training loss on 1 rank(s) by step 6"
    out = ev.finish(6)
    assert [p["step"] for p in out["curve"]] == [3]
    assert out["final_val_acc"] is None and out["final_test_acc"] is None


@pytest.mark.parametrize("total", [1, 7, 125, 750])
def test_the_peers_wsd_schedule_is_hethpcs(total: int) -> None:
    for step in range(total + 2):
        assert _peer_args.lr_factor("wsd", step, total) == pytest.approx(wsd_factor(step, total))
        assert _peer_args.lr_factor("constant", step, total) == 1.0
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    schedule = _peer_args.lr_schedule(opt, "wsd", total)
    for _ in range(total):
        opt.step()
        schedule.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.2 * wsd_factor(total, total))
