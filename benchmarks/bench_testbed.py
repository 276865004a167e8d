"""The testbed against the emulation: what the kernel enforces, dynamic batching
under a real CPU quota, and the demo's scenario run both ways.

    flock /tmp/hethpc-bench.lock .venv/bin/python benchmarks/bench_testbed.py [--quick]

Needs root on Linux (``hethpc.testbed``). Seven parts, each printed as a table:

1. **mechanisms**: a fixed loop under a quota of 1/2 and 1/3 of a core (its slowdown against
   the same loop on the uncapped head), and one 50 MB MPI message over a 200 Mbit/s link (its
   time and the bytes counted on the two veths).
2. **quota**: 2 ranks, IID MNIST-1D, BSP, global batch ``--batch`` (512: a step's compute then
   outweighs its fixed costs, docs/testbed.md), ``jobs/train.py``; rank 1 slowed to q = 1/2, 1/3,
   once by a real CPU quota on the testbed (node0 capped at 1 core, node1 at q cores, links
   unshaped), once by the emulation on shared memory (``--slowdown 1:1/q@0``); uniform and
   dynamic batches. The speed-up is the uniform run's training time over the dynamic run's,
   seed by seed; the ideal is ``(1 + q) / (2 q)`` (1.5x and 2x): the goal is 0.8 of it.
3. **demo**: the demo's scenario (``jobs/demo.toml``: rank 1 2x slower, 200 Mbit/s, 6 of 10
   labels per rank), BSP and SelSync with dynamic batching, once emulated (``--slowdown 1:2@0
   --link 200mbit:50us`` on shared memory) and once on the testbed (node1 at half a core, both
   links 200 Mbit/s, no emulation). Compared: the median step time, the final batch sizes, the
   training time and the time to ``TARGET`` test accuracy (fixed before the runs): within 15 %.
4. **peers**: on the demo's testbed, hethpc's demo job, its BSP baseline, a plain Horovod
   loop, PyTorch DDP and DDP with PowerSGD (``benchmarks/peer_*.py``: constant learning rate,
   not tuned: one seed's side-by-side run, not a tuned comparison), 6 epochs each.

5. **pipeline**: a 2-stage pipeline (model ``large``) with stage 1 on a node at half a core,
   cut by parameter count and by each rank's measured speed (``--pipeline-balance time``):
   the throughput of the second half of the steps, the speed cut over the parameter cut
   (goal: 1.3x, the median of the seeds).
6. **pxd**: P = 2 x D = 2 (4 ranks, model ``large``), replica 1's two nodes at a third of
   replica 0's CPU quota (0.2 of a core against 0.6): uniform batches against dynamic batching
   across the replicas (each replica's share follows its measured speed), the throughput of the
   second half of the steps (goal: 1.3x, the median of the seeds; the ideal is 2x).

7. **cap**: 2 nodes (1 core and a third of a core, links 200 Mbit/s), ``cnn1d``, global batch
   128 split 3 : 1 (``--batching static --weights 3,1``: the share the nodes' speeds call for,
   fixed so that two runs take the same batches), 50 steps, the same seed: rank 0 without a
   cap and capped at 32 rows (``--max-rank-batch 32,128``: a third of its 96-row share, which it
   then computes in 3 pieces of accumulated gradients). Goal: the same loss curve, step by step,
   within float tolerance (the largest relative difference of the 50 losses under 1e-4).

Runs of one part are interleaved in a random order (seeded) per seed; a uniform and a dynamic
run of the same setting run side by side (the host's speed drifts over minutes). The last line is
one JSON object with every run and the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hethpc.testbed import Testbed  # noqa: E402
from hethpc.testbed.checks import measure_cpu, measure_link  # noqa: E402
from hethpc.testbed.kernel import missing  # noqa: E402
from hethpc.train import time_to_target  # noqa: E402

PY = str(ROOT / ".venv" / "bin" / "python")
MPIRUN = str(ROOT / "scripts" / "mpirun.sh")
TRAIN = str(ROOT / "jobs" / "train.py")
TARGET = 0.94  # the demo scenario's accuracy target (its runs end near 96 %)


def _median(xs: list[float]) -> float:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else float("nan")


def _spread(xs: list[float]) -> str:
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return "-"
    return f"{statistics.median(xs):.3f} [{xs[0]:.3f}..{xs[-1]:.3f}]"


def train(args: list[str], *, bed: Testbed | None, run_dir: Path, ranks: int = 2) -> dict[str, Any]:
    """One ``jobs/train.py`` run on ``ranks`` ranks (on the testbed when ``bed``); its figures."""
    cmd = [
        MPIRUN,
        "-np",
        str(ranks),
        PY,
        TRAIN,
        *args,
        "--run-dir",
        str(run_dir),
        "--overwrite",
        "--progress",
        "false",
        "--checkpoint-every",
        "0",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HETHPC_MPIRUN_TIMEOUT": "600"}
    throttled = None
    if bed is None:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    else:  # how often the last node's quota stopped it: periods throttled / periods run
        before = bed.cpu_stat(len(bed.nodes) - 1)
        proc = bed.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
        after = bed.cpu_stat(len(bed.nodes) - 1)
        periods = after["nr_periods"] - before["nr_periods"]
        throttled = (after["nr_throttled"] - before["nr_throttled"]) / max(periods, 1)
    if proc.returncode != 0:
        raise SystemExit(
            f"run failed ({' '.join(args)}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
        )
    summary = json.loads((run_dir / "summary.json").read_text())
    recs = [json.loads(line) for line in (run_dir / "metrics" / "rank0.jsonl").open()]
    steps = [r for r in recs if r["kind"] == "step"]
    half = [r["time"] for r in steps[len(steps) // 2 :]]  # the second half: sizes settled
    curve = [(r["time"], r["test_acc"]) for r in recs if r["kind"] == "epoch" and "test_acc" in r]
    return {
        "time_s": summary["time_s"],
        "step_s": (half[-1] - half[0]) / (len(half) - 1) if len(half) > 1 else None,
        "test_acc": summary["test_acc"],
        "sizes": summary["final_batch_sizes"],
        "sync_fraction": summary["sync_fraction"],
        "tta_s": time_to_target(curve, TARGET),
        "throttled": throttled,
    }


def mechanisms() -> dict[str, Any]:
    out: dict[str, Any] = {}
    with Testbed([{"cpu": 0.5}, {"cpu": 1 / 3}], name="bmech") as bed:
        for node, q in ((0, 0.5), (1, 1 / 3)):
            c = measure_cpu(bed, node, seconds=2.0, python=PY)
            out[f"cpu_{q:.2f}"] = {"asked": 1 / q, "slowdown": c.slowdown, "stretch": c.stretch}
            print(
                f"  loop under {q:.2f} of a core: {c.slowdown:.2f}x the uncapped head "
                f"({c.stretch:.2f}x its own CPU time; asked {1 / q:.2f}x)",
                flush=True,
            )
    with Testbed([{"link": "1gbit"}, {"link": "200mbit"}], name="bmech") as bed:
        ln = measure_link(bed, 0, 1, nbytes=50_000_000, python=PY, mpirun=(MPIRUN,))
        out["link_200mbit_50MB"] = {
            "seconds": ln.seconds,
            "expected_s": ln.expected_s,
            "sent": ln.sent,
            "received": ln.received,
        }
        print(
            f"  50 MB over 200 Mbit/s: {ln.seconds:.2f} s (2.00 s at the rate; {ln.sent:,} B "
            f"left node0, {ln.received:,} B entered node1)",
            flush=True,
        )
    return out


def quota(seeds: list[int], epochs: int, batch: int, tmp: Path) -> dict[str, Any]:
    base = [
        "--model",
        "cnn1d_wide",
        "--epochs",
        str(epochs),
        "--sync",
        "bsp",
        "--partition",
        "iid",
        "--batch-size",
        str(batch),
        "--lr",
        str(0.05 * batch / 128),
    ]
    result: dict[str, Any] = {}
    for q, factor in ((0.5, "2"), (1 / 3, "3")):
        runs: dict[str, list[dict[str, Any]]] = {}
        ideal = (1 + q) / (2 * q)
        for seed in seeds:
            rng = random.Random(seed)
            envs = ["testbed", "emulated"]
            rng.shuffle(envs)
            for env in envs:  # a uniform and a dynamic run side by side, in a random order
                pair = ["uniform", "dynamic"]
                rng.shuffle(pair)
                for batching in pair:
                    args = [*base, "--seed", str(seed), "--batching", batching]
                    if env == "emulated":
                        r = train(
                            [*args, "--slowdown", f"1:{factor}@0"], bed=None, run_dir=tmp / "r"
                        )
                    else:
                        with Testbed([{"cpu": 1.0}, {"cpu": q}], name="bquota") as bed:
                            r = train(args, bed=bed, run_dir=tmp / "r")
                    r["seed"] = seed
                    runs.setdefault(f"{env}/{batching}", []).append(r)
                    print(
                        f"  q={q:.2f} seed {seed} {env:8} {batching:7} time {r['time_s']:.2f} s "
                        f"step {r['step_s'] * 1e3:.1f} ms sizes {r['sizes']}",
                        flush=True,
                    )
        figures: dict[str, Any] = {"ideal": ideal, "runs": runs}
        for env in ("testbed", "emulated"):
            ups = [
                u["time_s"] / d["time_s"]
                for u, d in zip(runs[f"{env}/uniform"], runs[f"{env}/dynamic"], strict=True)
            ]
            slow = [d["sizes"][1] / batch for d in runs[f"{env}/dynamic"]]
            figures[env] = {
                "speedups": ups,
                "speedup": _median(ups),
                "of_ideal": _median(ups) / ideal,
                "slow_share": _median(slow),
            }
        result[f"q{q:.2f}"] = figures
    return result


def demo(seeds: list[int], tmp: Path) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for sync in ("bsp", "selsync"):
        runs: dict[str, list[dict[str, Any]]] = {"emulated": [], "testbed": []}
        for seed in seeds:
            order = ["emulated", "testbed"]
            random.Random(100 + seed).shuffle(order)
            for env in order:
                args = [
                    "--config",
                    str(ROOT / "jobs" / "demo.toml"),
                    "--sync",
                    sync,
                    "--seed",
                    str(seed),
                ]
                if env == "emulated":
                    r = train(args, bed=None, run_dir=tmp / "d")
                else:
                    nodes = [{"cpu": 1.0, "link": "200mbit"}, {"cpu": 0.5, "link": "200mbit"}]
                    with Testbed(nodes, name="bdemo") as bed:
                        r = train(
                            [*args, "--slowdown", "", "--link", ""], bed=bed, run_dir=tmp / "d"
                        )
                r["seed"] = seed
                runs[env].append(r)
                tta = "-" if r["tta_s"] is None else f"{r['tta_s']:.1f} s"
                print(
                    f"  {sync:7} seed {seed} {env:8} time {r['time_s']:.1f} s step "
                    f"{r['step_s'] * 1e3:.1f} ms sizes {r['sizes']} acc {r['test_acc']:.4f} "
                    f"to {TARGET:.0%}: {tta}",
                    flush=True,
                )
        fig: dict[str, Any] = {"runs": runs}
        for key in ("step_s", "time_s", "tta_s"):
            e, t = (
                _median([r[key] for r in runs["emulated"]]),
                _median([r[key] for r in runs["testbed"]]),
            )
            fig[key] = {"emulated": e, "testbed": t, "ratio": t / e}
        fig["slow_share"] = {env: _median([r["sizes"][1] / 128 for r in runs[env]]) for env in runs}
        result[sync] = fig
    return result


PEER_TIMEOUT_S = 180
DEMO_NODES = [{"cpu": 1.0, "link": "200mbit"}, {"cpu": 0.5, "link": "200mbit"}]


def peer(script: str, extra: list[str], *, seed: int, bed: Testbed, out: Path) -> dict[str, Any]:
    """One run of a peer (``benchmarks/peer_*.py``) on the demo's data, 6 epochs, on ``bed``."""
    cmd = [
        MPIRUN,
        "-np",
        "2",
        PY,
        str(ROOT / "benchmarks" / script),
        "--epochs",
        "6",
        "--partition",
        "labels",
        "--labels-per-rank",
        "6",
        "--seed",
        str(seed),
        "--out",
        str(out),
        *extra,
    ]
    # a peer that hangs (Horovod did, once in six runs under the quota) is ended and recorded
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HETHPC_MPIRUN_TIMEOUT": str(PEER_TIMEOUT_S)}
    out.unlink(missing_ok=True)
    t0 = time.perf_counter()
    proc = bed.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if proc.returncode != 0 or not out.is_file():
        why = "timed out" if time.perf_counter() - t0 >= PEER_TIMEOUT_S - 1 else "failed"
        tail = (proc.stdout + proc.stderr)[-300:].replace("\n", " | ")
        print(f"  {script} {' '.join(extra)} {why} (exit {proc.returncode}): {tail}", flush=True)
        return {"time_s": None, "test_acc": None, "tta_s": None, "failed": f"{why}: {tail}"}
    got = json.loads(out.read_text())
    curve, t = [], 0.0
    for e in got["epochs"]:
        t += e["time_s"]
        curve.append((t, e["test_acc"]))
    return {
        "time_s": got["total_time_s"],
        "test_acc": got["final_test_acc"],
        "tta_s": time_to_target(curve, TARGET),
    }


def peers(seeds: list[int], tmp: Path) -> dict[str, Any]:
    """hethpc's demo job, its BSP baseline and the peers on the demo's testbed, unchanged."""
    demo_args = ["--config", str(ROOT / "jobs" / "demo.toml"), "--slowdown", "", "--link", ""]
    contenders = {
        "hethpc demo (SelSync, dynamic)": ("train", []),
        "hethpc BSP, uniform": ("train", ["--sync", "bsp", "--batching", "uniform"]),
        "Horovod DistributedOptimizer": ("peer_horovod.py", []),
        "PyTorch DDP (gloo)": ("peer_ddp.py", []),
        "PyTorch DDP + PowerSGD rank 2": ("peer_ddp.py", ["--powersgd", "2"]),
    }
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in contenders}
    for seed in seeds:
        order = list(contenders)
        random.Random(200 + seed).shuffle(order)
        for name in order:
            kind, extra = contenders[name]
            with Testbed(DEMO_NODES, name="bpeers") as bed:
                if kind == "train":
                    r = train([*demo_args, *extra, "--seed", str(seed)], bed=bed, run_dir=tmp / "p")
                else:
                    r = peer(kind, extra, seed=seed, bed=bed, out=tmp / "peer.json")
            r["seed"] = seed
            runs[name].append(r)
            if r["time_s"] is None:
                continue
            tta = "-" if r["tta_s"] is None else f"{r['tta_s']:.1f} s"
            print(
                f"  seed {seed} {name:31} time {r['time_s']:5.1f} s  acc "
                f"{r['test_acc']:.4f}  to {TARGET:.0%}: {tta}",
                flush=True,
            )
    return runs


def second_half_rate(run_dir: Path, *, rank: int, batch: int) -> float:
    """Samples per second over the second half of a run's steps, from ``rank``'s step records
    (every rank of a pipeline steps together)."""
    recs = [json.loads(line) for line in (run_dir / "metrics" / f"rank{rank}.jsonl").open()]
    times = [r["time"] for r in recs if r["kind"] == "step"]
    half = times[len(times) // 2 :]
    return batch * (len(half) - 1) / (half[-1] - half[0])


PIPE_NODES = [{"cpu": 1.0}, {"cpu": 0.5}]  # links unshaped: the slow stage, not the wire


def pipeline_cut(seeds: list[int], tmp: Path, steps: int) -> dict[str, Any]:
    """A 2-stage pipeline (``jobs/train.py --pipeline-stages 2``, model ``large``) with stage 1
    on a node at half a core: cut by parameter count against cut by each rank's measured
    speed (``--pipeline-balance time``), interleaved per seed; samples/s of the second half."""
    base = [
        "--model", "large", "--samples", "8000", "--epochs", "1", "--max-steps", str(steps),
        "--batch-size", "256", "--micro-batches", "8", "--optimizer", "adam", "--lr", "0.0003",
        "--pipeline-stages", "2", "--eval-every", "0",
    ]  # fmt: skip
    runs: dict[str, list[dict[str, Any]]] = {"params": [], "time": []}
    for seed in seeds:
        order = list(runs)
        random.Random(300 + seed).shuffle(order)
        for how in order:
            with Testbed(PIPE_NODES, name="bpipe") as bed:
                run_dir = tmp / f"pipe-{how}"
                train([*base, "--pipeline-balance", how, "--seed", str(seed)], bed=bed,
                      run_dir=run_dir)  # fmt: skip
            summary = json.loads((run_dir / "summary.json").read_text())
            per_s = second_half_rate(run_dir, rank=1, batch=256)
            r = {"seed": seed, "balance": summary["balance"], "samples_per_s": per_s}
            runs[how].append(r)
            print(f"  seed {seed} cut by {how:6}: balance {r['balance']}, {per_s:.0f} "
                  "samples/s", flush=True)  # fmt: skip
    ratios = [t["samples_per_s"] / p["samples_per_s"]
              for p, t in zip(runs["params"], runs["time"], strict=True)]  # fmt: skip
    return {"runs": runs, "speedups": ratios, "speedup": _median(ratios)}


# 2 x 2: replica 0 on nodes 0-1, replica 1 (world ranks 2-3) on nodes 2-3 at a third of their
# speed; links unshaped (the slow replica, not the wire). 1.6 of the host's 2 cores in all.
PXD_NODES = [{"cpu": 0.6}, {"cpu": 0.6}, {"cpu": 0.2}, {"cpu": 0.2}]
# Global batch: large enough that a step's compute outweighs the replicas' gradient average
# (17 MB per stage through TCP, which a node at 0.2 of a core also pays for in CPU time); at
# 256 both runs were bound by it (1.02x).
PXD_BATCH = 1024


def pxd(seeds: list[int], tmp: Path, steps: int) -> dict[str, Any]:
    """P = 2 x D = 2 (``--pipeline-stages 2`` on 4 ranks, model ``large``) with replica 1 on
    nodes at a third of replica 0's quota: uniform against dynamic batches across the replicas,
    interleaved per seed; samples/s of the second half of the steps."""
    base = [
        "--model", "large", "--samples", "8000", "--epochs", "100", "--max-steps", str(steps),
        "--batch-size", str(PXD_BATCH), "--micro-batches", "8", "--optimizer", "adam",
        "--lr", "0.0003", "--pipeline-stages", "2", "--eval-every", "0",
    ]  # fmt: skip
    runs: dict[str, list[dict[str, Any]]] = {"uniform": [], "dynamic": []}
    for seed in seeds:
        order = list(runs)
        random.Random(400 + seed).shuffle(order)
        for how in order:
            with Testbed(PXD_NODES, name="bpxd") as bed:
                run_dir = tmp / f"pxd-{how}"
                r = train([*base, "--batching", how, "--seed", str(seed)], bed=bed,
                          run_dir=run_dir, ranks=4)  # fmt: skip
            per_s = second_half_rate(run_dir, rank=0, batch=PXD_BATCH)
            out = {"seed": seed, "sizes": r["sizes"], "samples_per_s": per_s,
                   "throttled": r["throttled"]}  # fmt: skip
            runs[how].append(out)
            print(f"  seed {seed} {how:7} batches: sizes {r['sizes']}, {per_s:.0f} samples/s",
                  flush=True)  # fmt: skip
    ratios = [d["samples_per_s"] / u["samples_per_s"]
              for u, d in zip(runs["uniform"], runs["dynamic"], strict=True)]  # fmt: skip
    return {"runs": runs, "speedups": ratios, "speedup": _median(ratios)}


CAP_NODES = [{"cpu": 1.0, "link": "200mbit"}, {"cpu": 0.33, "link": "200mbit"}]


def cap(seeds: list[int], tmp: Path, steps: int) -> dict[str, Any]:
    """Rank 0 capped at a third of its share (accumulating its batch in pieces) against no cap,
    the same seed and batches, on the testbed: the losses of every step side by side."""
    base = [
        "--model", "cnn1d", "--samples", "8000", "--epochs", "10", "--max-steps", str(steps),
        "--batch-size", "128", "--batching", "static", "--weights", "3,1", "--eval-every", "0",
    ]  # fmt: skip
    runs = []
    for seed in seeds:
        losses: dict[str, list[float]] = {}
        pieces: dict[str, list[int]] = {}
        order = ["uncapped", "capped"]
        random.Random(500 + seed).shuffle(order)
        for how in order:
            extra = ["--max-rank-batch", "32,128"] if how == "capped" else []
            with Testbed(CAP_NODES, name="bcap") as bed:
                run_dir = tmp / f"cap-{how}"
                train([*base, *extra, "--seed", str(seed)], bed=bed, run_dir=run_dir)
            recs = [json.loads(line) for line in (run_dir / "metrics" / "rank0.jsonl").open()]
            steps_ = [r for r in recs if r["kind"] == "step"]
            losses[how] = [float(r["loss"]) for r in steps_]
            pieces[how] = [int(r.get("pieces", 1)) for r in steps_]
        diff = max(
            abs(a - b) / max(abs(a), 1e-12)
            for a, b in zip(losses["uncapped"], losses["capped"], strict=True)
        )
        runs.append({"seed": seed, "steps": len(losses["capped"]), "max_rel_diff": diff,
                     "pieces": max(pieces["capped"]), "losses": losses})  # fmt: skip
        print(f"  seed {seed}: {len(losses['capped'])} steps, rank 0 in up to "
              f"{max(pieces['capped'])} pieces; largest relative loss difference {diff:.2e}",
              flush=True)  # fmt: skip
    return {"runs": runs, "max_rel_diff": max(r["max_rel_diff"] for r in runs)}


def figures(out: dict[str, Any]) -> dict[str, Any]:
    """The headline figures of a result, flat (one row each in RESULTS.md)."""
    flat: dict[str, Any] = {}
    for key, f in out.get("quota", {}).items():
        name = {"q0.50": "half", "q0.33": "third"}.get(key, key)
        for env in ("testbed", "emulated"):
            flat[f"quota_{name}_{env}_speedup"] = round(f[env]["speedup"], 3)
            flat[f"quota_{name}_{env}_of_ideal"] = round(f[env]["of_ideal"], 3)
            flat[f"quota_{name}_{env}_slow_share"] = round(f[env]["slow_share"], 3)
    for sync, f in out.get("demo", {}).items():
        for key in ("step_s", "time_s", "tta_s"):
            flat[f"demo_{sync}_{key}_testbed_over_emulated"] = round(f[key]["ratio"], 3)
        flat[f"demo_{sync}_slow_share"] = f["slow_share"]
    if "pipeline" in out:
        flat["pipeline_time_cut_over_param_cut"] = round(out["pipeline"]["speedup"], 3)
    if "pxd" in out:
        flat["pxd_dynamic_over_uniform"] = round(out["pxd"]["speedup"], 3)
    if "cap" in out:
        flat["cap_loss_max_rel_diff"] = float(f"{out['cap']['max_rel_diff']:.3g}")
    for name, rs in out.get("peers", {}).items():
        rs = [r for r in rs if r["time_s"] is not None]
        flat[f"peers: {name}"] = {
            "runs": len(rs),
            "time_s": round(_median([r["time_s"] for r in rs]), 2),
            "test_acc": round(_median([r["test_acc"] for r in rs]), 4),
            f"to_{TARGET:.0%}_s": round(_median([r["tta_s"] for r in rs]), 2),
        }
    return flat


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="one seed, fewer epochs")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--epochs", type=int, default=6, help="epochs of the quota runs")
    p.add_argument("--batch", type=int, default=512, help="global batch of the quota runs")
    p.add_argument("--only", default="mechanisms,quota,demo,peers,pipeline,pxd,cap")
    a = p.parse_args(argv)
    lack = missing()
    if lack:
        raise SystemExit("bench_testbed needs a testbed; this host lacks " + "; ".join(lack))
    seeds = list(range(1 if a.quick else a.seeds))
    parts = a.only.split(",")
    out: dict[str, Any] = {"quick": a.quick, "seeds": seeds, "target": TARGET}
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="bench-testbed-") as d:
        tmp = Path(d)
        if "mechanisms" in parts:
            print("mechanisms", flush=True)
            out["mechanisms"] = mechanisms()
        if "quota" in parts:
            print("dynamic batching under a CPU quota (testbed) and the emulation", flush=True)
            out["quota"] = quota(seeds, 2 if a.quick else a.epochs, a.batch, tmp)
            for key, f in out["quota"].items():
                for env in ("testbed", "emulated"):
                    g = f[env]
                    print(
                        f"{key} {env:8}: speed-up {_spread(g['speedups'])} = "
                        f"{g['of_ideal']:.2f} of the ideal {f['ideal']:.2f}x; slow rank's "
                        f"share {g['slow_share']:.2f}"
                    )
        if "demo" in parts:
            print("the demo scenario, emulated and on the testbed", flush=True)
            out["demo"] = demo(seeds, tmp)
            for sync, f in out["demo"].items():
                for key in ("step_s", "time_s", "tta_s"):
                    g = f[key]
                    print(
                        f"{sync:7} {key:6}: emulated {g['emulated']:.3f}  testbed "
                        f"{g['testbed']:.3f}  testbed/emulated {g['ratio']:.2f}"
                    )
                print(f"{sync:7} slow rank's share: {f['slow_share']}")
        if "peers" in parts:
            print("hethpc and the peers on the demo's testbed, 6 epochs", flush=True)
            out["peers"] = peers(seeds, tmp)
            for name, rs in out["peers"].items():
                rs = [r for r in rs if r["time_s"] is not None]
                print(
                    f"{name:31}: time {_spread([r['time_s'] for r in rs])}  test acc "
                    f"{_spread([r['test_acc'] for r in rs])}  to {TARGET:.0%} "
                    f"{_spread([r['tta_s'] for r in rs])}"
                )
        if "pipeline" in parts:
            print("a 2-stage pipeline, stage 1 at half a core: cut by speed vs by parameters",
                  flush=True)  # fmt: skip
            out["pipeline"] = pipeline_cut(seeds, tmp, 30 if a.quick else 120)
            print(f"time cut / parameter cut, samples/s: {_spread(out['pipeline']['speedups'])}")
        if "pxd" in parts:
            print("P = 2 x D = 2, replica 1 at a third of the speed: dynamic vs uniform batches",
                  flush=True)  # fmt: skip
            out["pxd"] = pxd(seeds, tmp, 30 if a.quick else 80)
            print(f"dynamic / uniform, samples/s: {_spread(out['pxd']['speedups'])}")
        if "cap" in parts:
            print("rank 0 capped at a third of its share (accumulating) vs uncapped, 50 steps",
                  flush=True)  # fmt: skip
            out["cap"] = cap(seeds, tmp, 20 if a.quick else 50)
            print(f"largest relative loss difference: {out['cap']['max_rel_diff']:.2e}")
    out["wall_s"] = time.time() - t0
    print(json.dumps({**figures(out), "detail": out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
