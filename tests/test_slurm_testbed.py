"""SLURM on a testbed: ``slurm/train_cpu.sbatch`` across two nodes of unequal CPU and links.

A 2-node testbed (``hethpc.testbed``: network namespaces, tc-shaped links, cgroup CPU quotas)
with a SLURM cluster on it (``tests/slurm_cluster.py``: slurmctld on the head, one slurmd per
node); the job is submitted as a user would, and must run one rank per node, under the nodes'
hostnames and CPU caps, talking over the shaped links. Needs root, the testbed's kernel parts
and SLURM (installed from Debian's packages when missing); skipped otherwise.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

import pytest

from hethpc import testbed
from hethpc.testbed import kernel
from hethpc.testbed.bed import CGROUP_ROOT, PREFIX
from hethpc.testbed.kernel import missing

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from slurm_cluster import SlurmCluster, Unavailable  # noqa: E402

NAME = "slurmtb"
NODES = [{"cpu": 1.0, "link": "1gbit"}, {"cpu": 0.5, "link": "200mbit"}]
TRAIN = ["--samples", "1000", "--batch-size", "32", "--epochs", "1", "--model", "mlp",
         "--watchdog-s", "60"]  # fmt: skip


def _pids_with(text: str) -> list[int]:
    """Processes whose command line mentions ``text``."""
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                if text.encode() in (d / "cmdline").read_bytes():
                    found.append(int(d.name))
            except OSError:
                pass
    return found


def _on_testbed(bed: testbed.Testbed) -> list[int]:
    """Processes on the testbed: in its nodes' cgroups or any of its namespaces."""
    pids = [p for i in range(len(bed.nodes)) for p in kernel.cgroup_pids(bed.cgroup(i))]
    for ns in kernel.namespaces():
        if ns.startswith(f"{PREFIX}{NAME}-"):
            pids += kernel.namespace_pids(ns)
    return sorted(set(pids))


def test_train_cpu_runs_one_rank_per_testbed_node(tmp_path: Path) -> None:
    if "OMPI_COMM_WORLD_SIZE" in os.environ:
        pytest.skip("stands up a testbed and a SLURM cluster; run it outside mpirun")
    lack = missing()
    if lack:
        pytest.skip("no testbed on this host: it lacks " + "; ".join(lack))
    with testbed.Testbed(NODES, name=NAME) as bed:
        try:
            cluster = SlurmCluster.start(testbed=bed)
        except Unavailable as e:
            pytest.skip(f"no SLURM cluster on this host: {e}")
        root, job = cluster.root, ""
        try:
            link0, cpu0 = bed.counters(1), bed.cpu_stat(1)
            log = root / "train_cpu-%j.out"
            job = cluster.sbatch(
                [f"--output={log}", "--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=1",
                 "slurm/train_cpu.sbatch", *TRAIN, "--cache-dir", str(tmp_path / "cache")],
                cwd=ROOT,
            )  # fmt: skip
            log = Path(str(log).replace("%j", job))
            state = cluster.wait(job, timeout=75)
            link1, cpu1 = bed.counters(1), bed.cpu_stat(1)
            text = log.read_text() if log.exists() else "(no job log)"
            assert state == "COMPLETED", text + cluster.logs()
            assert re.search(r"^hethpc: 2 rank\(s\), data-parallel", text, re.M), text
            assert re.search(r"^ranks\s+2$", text, re.M), text
            info = cluster.run(["scontrol", "show", "job", "-o", job]).stdout
            assert f" NodeList={NAME}-node[0-1] " in info, info
            # Each rank on its own node, as its task saw the hostname (the cluster's TaskProlog).
            hosts = dict(re.findall(r"^hethpc-testbed: task (\d+) on (\S+)$", text, re.M))
            assert hosts == {"0": bed.hostname(0), "1": bed.hostname(1)}, text
            run_dir = ROOT / "runs" / f"slurm-{cluster.name}-{job}"
            assert json.loads((run_dir / "summary.json").read_text())["world_size"] == 2
            # The ranks talked over node1's 200 Mbit/s link and ran under its 0.5-CPU quota.
            moved = sum(link1) - sum(link0)
            assert moved > 100_000, f"only {moved} bytes crossed node1's link"
            assert cpu1["nr_throttled"] > cpu0["nr_throttled"], (cpu0, cpu1)
        finally:
            cluster.stop()
            if job:
                shutil.rmtree(ROOT / "runs" / f"slurm-{cluster.name}-{job}", ignore_errors=True)
        # stop() ended everything it started, before the testbed's own tear-down would.
        deadline = time.monotonic() + 10
        while _on_testbed(bed) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _on_testbed(bed) == [], "processes left on the testbed after the cluster stopped"
    assert not [ns for ns in kernel.namespaces() if ns.startswith(f"{PREFIX}{NAME}-")]
    assert not (CGROUP_ROOT / NAME).exists()
    assert _pids_with(str(root)) == []
    assert [m for m in Path("/proc/mounts").read_text().splitlines() if str(root) in m] == []
    assert not root.exists()
