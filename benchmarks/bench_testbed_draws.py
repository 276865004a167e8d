"""The same job on fresh testbeds of the same nodes: how much its speed depends on the testbed
it drew, for plain Horovod, hethpc's BSP and PyTorch DDP.

    flock /tmp/hethpc-bench.lock .venv/bin/python benchmarks/bench_testbed_draws.py [--quick]

Needs root on Linux (``hethpc.testbed``). Each draw brings up a fresh testbed of a testbed
scenario's nodes (``--scenarios``, from ``benchmarks/workloads/mnist1d.toml``; by default
``testbed_demo``: node0 at one core, node1 at half a core, both links 200 Mbit/s, 6 of 10
labels per rank; and ``testbed_iid_3x``: node1 at a third of a core, IID), runs one
epoch of each job on it in a random order (seeded per draw), and takes it down. The jobs are
that scenario's first tuning run in the evidence protocol (MNIST-1D, ``cnn1d_wide``, lr 0.1,
global batch 128, seed 100, the scenario's partition, 10 % held out and scored every 25 steps,
``wsd``): ``benchmarks/peer_horovod.py``, ``jobs/train.py --sync bsp`` and
``benchmarks/peer_ddp.py``. Draws alternate between the scenario's nodes (``capped``), the
same nodes with node0 uncapped (``node0_uncapped``: it may use both of the host's cores), and
the scenario's nodes each on a core of its own (``pinned``: node i on host CPU i, its quota
within it), to tell what the draw depends on. Needs a host CPU per node.

Printed per draw: each job's training time (evaluations excluded) and the share of each node's
100 ms periods in which its quota stopped it. Then per scenario, node set and job: the median
and range of the training times, and the draws slower than twice the job's fastest. The last
line is one JSON object with every run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _protocol import eval_every_steps, load_workload  # noqa: E402

from hethpc.testbed import Testbed  # noqa: E402
from hethpc.testbed.kernel import missing  # noqa: E402
from hethpc.testbed.spec import parse_flag  # noqa: E402

PY = str(ROOT / ".venv" / "bin" / "python")
MPIRUN = str(ROOT / "scripts" / "mpirun.sh")
WORKLOAD = ROOT / "benchmarks" / "workloads" / "mnist1d.toml"
NODE_SETS = ("capped", "node0_uncapped", "pinned")
JOBS = ("horovod", "hethpc_bsp", "ddp")
RUN_TIMEOUT_S = 300  # a job slower than this is recorded as such and the draw goes on


def scenario(
    work: dict[str, Any], name: str
) -> tuple[dict[str, list[dict[str, str]]], list[str]]:
    """A testbed scenario of the workload: its node sets (as given, node0 uncapped, each node
    pinned) and its partition's flags.

    Raises:
        SystemExit: no such scenario, or one without a testbed (naming the ones there are).
    """
    scenarios = work["scenarios"]
    beds = sorted(n for n, s in scenarios.items() if "testbed" in s and s["ranks"] == 2)
    if name not in beds:
        raise SystemExit(f"bench_testbed_draws: --scenarios: {name!r} is not a 2-rank testbed "
                         f"scenario of {WORKLOAD}; choose from {', '.join(beds)}")  # fmt: skip
    s = scenarios[name]
    capped = [parse_flag(n, where=f"{WORKLOAD} [scenarios.{name}]") for n in s["testbed"]]
    uncapped = [{**capped[0], "cpu": "none"}, *capped[1:]]
    pinned = [{**n, "cores": str(i)} for i, n in enumerate(capped)]
    partition = ["--partition", s["partition"]]
    if s["partition"] == "labels":
        partition += ["--labels-per-rank", str(s["labels_per_rank"])]
    return {"capped": capped, "node0_uncapped": uncapped, "pinned": pinned}, partition


def settings(work: dict[str, Any], epochs: int, samples: int | None,
             partition: list[str]) -> list[str]:  # fmt: skip
    """The flags every job takes alike: the workload's first tuning run (the grid's first
    learning rate and batch, the tuning seed), ``epochs`` long; ``samples`` None: the
    workload's."""
    base, proto = work["base"], work["protocol"]
    lr, batch = proto["lr"][0], proto["batch"][0]
    return [
        "--epochs", str(epochs), "--batch-size", str(batch), "--lr", str(lr),
        "--seed", str(proto["tune_seed"]), *partition,
        "--samples", str(base["samples"] if samples is None else samples),
        "--val-fraction", str(base["val_fraction"]),
        "--eval-every-steps", str(eval_every_steps(proto["eval_every_samples"], batch)),
        "--lr-schedule", base["lr_schedule"],
    ]  # fmt: skip


def job_argv(job: str, common: list[str], out: Path) -> list[str]:
    """The command line of ``job`` on 2 ranks; it leaves its summary at ``out``."""
    if job == "hethpc_bsp":
        script = [str(ROOT / "jobs" / "train.py"), "--model", "cnn1d_wide", "--sync", "bsp",
                  "--batching", "uniform", "--run-dir", str(out.parent / "run"), "--overwrite",
                  "--progress", "false", "--checkpoint-every", "0"]  # fmt: skip
    else:
        script = [str(ROOT / "benchmarks" / f"peer_{job}.py"), "--out", str(out)]
    return [MPIRUN, "-np", "2", PY, *script, *common]


def throttled_share(before: dict[str, int], after: dict[str, int]) -> float | None:
    """The share of a node's quota periods in which it was stopped; None when it has no quota."""
    periods = after["nr_periods"] - before["nr_periods"]
    if periods <= 0:
        return None
    return (after["nr_throttled"] - before["nr_throttled"]) / periods


def run_job(bed: Testbed, job: str, common: list[str], tmp: Path) -> dict[str, Any]:
    """One job on ``bed``: its training time and each node's throttled share."""
    out = tmp / f"{job}.json"
    summary = tmp / "run" / "summary.json" if job == "hethpc_bsp" else out
    summary.unlink(missing_ok=True)  # never an earlier draw's
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HETHPC_MPIRUN_TIMEOUT": str(RUN_TIMEOUT_S)}
    before = [bed.cpu_stat(i) for i in range(len(bed.nodes))]
    proc = bed.run(job_argv(job, common, out), capture_output=True, text=True, env=env, cwd=ROOT)
    after = [bed.cpu_stat(i) for i in range(len(bed.nodes))]
    shares = [throttled_share(b, a) for b, a in zip(before, after, strict=True)]
    if proc.returncode != 0 or not summary.is_file():
        tail = (proc.stdout + proc.stderr)[-300:].replace("\n", " | ")
        return {"job": job, "train_time_s": None, "throttled": shares,
                "failed": f"exit {proc.returncode}: {tail}"}  # fmt: skip
    got = json.loads(summary.read_text())
    return {"job": job, "train_time_s": got["train_time_s"], "throttled": shares}


def _share(x: float | None) -> str:
    return "uncapped" if x is None else f"{x:.0%}"


def summarize(draws: list[dict[str, Any]]) -> dict[str, Any]:
    """Per scenario, node set and job: the median and range of the training times, and the
    draws slower than twice the job's fastest there (a failed run counts as slower)."""
    out: dict[str, Any] = {}
    for d in draws:
        for r in d["runs"]:
            cell = out.setdefault(d["scenario"], {}).setdefault(d["nodes"], {})
            cell.setdefault(r["job"], []).append(r["train_time_s"])
    for nodes_sets in out.values():
        for nodes, jobs in nodes_sets.items():
            nodes_sets[nodes] = jobs = {j: jobs[j] for j in JOBS if j in jobs}
            for job, times in jobs.items():
                done = [t for t in times if t is not None]
                jobs[job] = {"draws": len(times), "finished": len(done)}
                if done:
                    jobs[job] |= {
                        "median_s": round(statistics.median(done), 2),
                        "min_s": round(min(done), 2),
                        "max_s": round(max(done), 2),
                        "slower_than_2x_fastest": sum(t > 2 * min(done) for t in done)
                        + len(times) - len(done),
                    }
    return out


def figures(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary flat, one figure per row of RESULTS.md: ``SCENARIO.NODES.JOB`` ->
    ``"median [min..max] s, k of n slower than twice the fastest"``."""
    flat: dict[str, Any] = {}
    for scen, node_sets in summary.items():
        for nodes, jobs in node_sets.items():
            for job, f in jobs.items():
                if not f["finished"]:
                    flat[f"{scen}.{nodes}.{job}"] = f"none of {f['draws']} finished"
                    continue
                flat[f"{scen}.{nodes}.{job}"] = (
                    f"{f['median_s']:.1f} [{f['min_s']:.1f}..{f['max_s']:.1f}] s, "
                    f"{f['slower_than_2x_fastest']} of {f['draws']} slower than twice the fastest"
                )
    return flat


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="one draw of the first scenario's nodes, 2,000 samples")  # fmt: skip
    p.add_argument("--scenarios", default="testbed_demo,testbed_iid_3x",
                   help="2-rank testbed scenarios of the MNIST-1D workload, comma-separated "
                   "(default testbed_demo,testbed_iid_3x)")  # fmt: skip
    p.add_argument("--draws", type=int, default=6,
                   help="fresh testbeds per scenario and node set (default 6)")  # fmt: skip
    p.add_argument("--epochs", type=int, default=1, help="epochs of each job (default 1)")
    p.add_argument("--seed", type=int, default=0, help="seed of the jobs' order in each draw")
    a = p.parse_args(argv)
    if a.draws < 1 or a.epochs < 1:
        p.error("--draws and --epochs must be at least 1")
    names = [n for n in a.scenarios.split(",") if n]
    if not names:
        p.error("--scenarios needs at least one scenario, e.g. testbed_demo")
    work = load_workload(WORKLOAD)
    scenarios = {n: scenario(work, n) for n in names}
    lack = missing()
    if (os.cpu_count() or 1) < 2:
        lack.append("a host CPU per node (2) for the pinned node set")
    if lack:
        raise SystemExit("bench_testbed_draws needs a testbed; this host lacks " + "; ".join(lack))
    draws_per_set = 1 if a.quick else a.draws
    samples = 2000 if a.quick else None
    if a.quick:
        order = [(names[0], "capped")]
    else:  # scenario by scenario; within one, the node sets alternate
        order = [(n, ns) for n in names for _ in range(draws_per_set) for ns in NODE_SETS]
    rng = random.Random(a.seed)
    draws: list[dict[str, Any]] = []
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="bench-draws-") as d:
        tmp = Path(d)
        for i, (name, nodes) in enumerate(order):
            node_sets, partition = scenarios[name]
            common = settings(work, a.epochs, samples, partition)
            jobs = list(JOBS)
            rng.shuffle(jobs)
            with Testbed(node_sets[nodes], name="bdraws") as bed:
                runs = [run_job(bed, job, common, tmp) for job in jobs]
            draws.append({"draw": i, "scenario": name, "nodes": nodes, "runs": runs})
            cells = []
            for r in sorted(runs, key=lambda r: JOBS.index(r["job"])):
                t = "failed" if r["train_time_s"] is None else f"{r['train_time_s']:5.1f} s"
                cells.append(f"{r['job']} {t} (throttled "
                             f"{'/'.join(_share(x) for x in r['throttled'])})")  # fmt: skip
            print(f"draw {i:2} {name} {nodes:14} " + "  ".join(cells), flush=True)
            for r in runs:
                if "failed" in r:
                    print(f"  {r['job']} failed: {r['failed']}", flush=True)
    summary = summarize(draws)
    flat = figures(summary)
    for key, value in flat.items():
        print(f"{key:40}: {value}")
    print(json.dumps({**flat, "quick": a.quick, "epochs": a.epochs,
                      "draws_per_set": draws_per_set, "wall_s": round(time.time() - t0, 1),
                      "nodes": {n: scenarios[n][0] for n in names}, "summary": summary,
                      "detail": draws}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
