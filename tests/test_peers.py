"""The peers (benchmarks/peer_horovod.py, peer_ddp.py) train end to end on 2 ranks: on shared
memory, and (root, a host that can) DDP across a 2-node testbed, over its shaped links.

Each run is one epoch of the demo's MNIST-1D (generated once for the module), enough to land
far above chance (10 %); the figures themselves come from full runs, not from here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hethpc import testbed  # the module: pytest would try to collect a class named Test*

ROOT = Path(__file__).resolve().parents[1]
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


@pytest.mark.parametrize("peer", ["horovod", "ddp"])
def test_peer_trains_on_two_ranks(peer: str, cache: Path, tmp_path: Path) -> None:
    if "OMPI_COMM_WORLD_SIZE" in os.environ:
        pytest.skip("launches mpirun itself; run it outside mpirun")
    out = tmp_path / "summary.json"
    done = subprocess.run(_command(peer, out), cwd=ROOT, env=_env(cache), capture_output=True,
                          text=True, timeout=90)  # fmt: skip
    summary = _check(done, out, peer)
    if peer == "ddp":
        assert summary["master_addr"] == "127.0.0.1"  # both ranks on this host


def test_ddp_peer_trains_across_testbed_nodes(cache: Path, tmp_path: Path) -> None:
    if "OMPI_COMM_WORLD_SIZE" in os.environ:
        pytest.skip("stands up a testbed; run it outside mpirun")
    if os.geteuid() != 0:
        pytest.skip("a testbed needs root")
    lack = testbed.missing()
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
