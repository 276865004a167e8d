"""A node that dies mid-run on a testbed ends the training job soon, naming the node, leaves
nothing behind, and ``--resume`` continues on the nodes that remain (the
figures: benchmarks/bench_testbed_faults.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from hethpc import testbed
from hethpc.testbed import kernel
from hethpc.testbed.bed import PREFIX
from hethpc.testbed.kernel import missing

ROOT = Path(__file__).resolve().parents[1]
LACKS = missing()
pytestmark = [
    pytest.mark.skipif(bool(LACKS), reason="testbed needs " + "; ".join(LACKS)),
    pytest.mark.skipif(
        "OMPI_COMM_WORLD_SIZE" in os.environ, reason="launches mpirun itself; run it outside"
    ),
]
NODE = {"cpu": 0.5, "link": "1gbit"}
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HETHPC_MPIRUN_TIMEOUT": "110"}


def _job(bed: testbed.Testbed, nodes: list[int], run_dir: Path, *args: str) -> list[str]:
    """``jobs/train.py`` on one rank per node of ``nodes`` (rank k on ``nodes[k]``)."""
    hosts = run_dir.parent / f"hosts-{'-'.join(map(str, nodes))}"
    hosts.write_text("".join(f"{bed.address(n)} slots=1\n" for n in nodes))
    return [
        str(ROOT / "scripts" / "mpirun.sh"), "-np", str(len(nodes)), "--hostfile", str(hosts),
        str(ROOT / ".venv" / "bin" / "python"), str(ROOT / "jobs" / "train.py"),
        "--model", "mlp", "--samples", "4000", "--progress", "false", "--run-dir", str(run_dir),
        *args,
    ]  # fmt: skip


def _step(run_dir: Path, rank: int) -> int:
    try:
        return int(json.loads((run_dir / "heartbeat" / f"rank{rank}.json").read_text())["step"])
    except (OSError, ValueError, KeyError):
        return -1


def _kill_at(bed: testbed.Testbed, job: subprocess.Popen[str], run_dir: Path, log: Path,
             *, node: int, ranks: int, step: int) -> tuple[int, float, str]:  # fmt: skip
    """Kill ``node`` once every rank is past ``step``: the job's exit code, seconds to it and
    output."""
    deadline = time.monotonic() + 60
    while min(_step(run_dir, r) for r in range(ranks)) < step:
        assert job.poll() is None, log.read_text()
        assert time.monotonic() < deadline, f"the job never reached step {step}"
        time.sleep(0.05)
    t0 = time.monotonic()
    bed.kill(node)
    code = job.wait(timeout=90)
    return code, time.monotonic() - t0, log.read_text()


def _left(bed: testbed.Testbed) -> list[int]:
    """Processes on the nodes, after the watchdog monitors (in their own sessions) had the
    second they take to notice that their rank is gone."""
    deadline = time.monotonic() + 5
    while left := [p for n in range(len(bed.nodes)) for p in kernel.cgroup_pids(bed.cgroup(n))]:
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)
    return left


def _namespaces(name: str) -> list[str]:
    return [ns for ns in kernel.namespaces() if ns.startswith(f"{PREFIX}{name}-")]


@pytest.mark.timeout(120)
def test_a_killed_node_ends_the_job_naming_it_and_nothing_is_left(tmp_path: Path) -> None:
    run_dir, log = tmp_path / "run", tmp_path / "job.log"
    with testbed.Testbed([NODE] * 2, name="tkill") as bed, log.open("w") as out:
        cmd = _job(bed, [0, 1], run_dir, "--epochs", "200")
        job = bed.popen(None, cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=ENV)
        code, took, text = _kill_at(bed, job, run_dir, log, node=1, ranks=2, step=20)
        assert took < 60, f"the job took {took:.0f} s to end:\n{text}"
        assert code != 0, text
        # Open MPI names the lost node as the hostfile does (the testbed's: by address)
        assert f"on node {bed.address(1)}" in text, text
        assert _left(bed) == [], "processes of the run left on the nodes"
    assert _namespaces("tkill") == []
    # the killed node's Open MPI daemon left its session directory; the testbed's teardown took it
    assert list(Path(tempfile.gettempdir()).glob("ompi.tkill-node*")) == []


@pytest.mark.timeout(120)
def test_resume_on_the_remaining_nodes_continues_from_the_checkpoint(tmp_path: Path) -> None:
    run_dir, log = tmp_path / "run", tmp_path / "job.log"
    args = ("--epochs", "40", "--checkpoint-every", "50")  # 25 steps per epoch
    with testbed.Testbed([NODE] * 3, name="tresume") as bed:
        with log.open("w") as out:
            cmd = _job(bed, [0, 1, 2], run_dir, *args)
            job = bed.popen(None, cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=ENV)
            code, took, text = _kill_at(bed, job, run_dir, log, node=1, ranks=3, step=110)
        assert code != 0 and took < 60, text
        assert _left(bed) == []
        again = bed.run(_job(bed, [0, 2], run_dir, *args, "--resume"), capture_output=True,
                        text=True, cwd=ROOT, env=ENV, timeout=100)  # fmt: skip
        text = again.stdout + again.stderr
        assert again.returncode == 0, text
        m = re.search(r"resumed from step (\d+) \(saved on 3 ranks, re-split over 2\)", text)
        assert m is not None and int(m.group(1)) >= 100, text
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["world_size"] == 2 and summary["steps"] == 1000, summary
        assert summary["test_acc"] > 0.5, summary
    assert _namespaces("tresume") == []
