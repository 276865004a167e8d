"""Real faults on a testbed: what a user gets when a link goes down, a node
dies, or a link slows down while ``jobs/train.py`` runs across nodes.

    flock /tmp/hethpc-bench.lock .venv/bin/python benchmarks/bench_testbed_faults.py

Needs root on Linux (``hethpc.testbed``). One testbed of three nodes (0.6 of a core and a
1 Gbit/s link each); every fault is injected from this process while the job runs, once the
ranks' heartbeats show it training:

a. **link down**: node 1's cable pulled in a 3-rank BSP job, for ``--down-s`` (20) seconds
   (``link_down``) or until the job ends, at most 75 s (``link_out``); both again with Open
   MPI's launcher checking its daemons by TCP keepalive every few seconds set explicitly
   (``_ka``, ``KEEPALIVE``; Open MPI's own default waits 300 s, and ``scripts/mpirun.sh`` now
   sets the same as ``KEEPALIVE``, so both pairs run alike): whether the job survives (TCP
   retransmits) or ends,
   how long after the pull, its exit code, whether its output names rank 1, node 1's hostname
   or its address, and what is left on the nodes while node 1 is still cut off.
b. **kill**: every process on node 1 SIGKILLed (a crashed node) in a 3-rank job: seconds to the
   end of the job, exit code, the message.
c. **resume**: after the first link case that ended the job, and after (b), ``--resume`` on
   the two surviving nodes (``mpirun -np 2 --hostfile`` of nodes 0 and 2): the step it resumed
   from, whether it finished, the final test accuracy.
d. **slow link**: 2 ranks (nodes 0 and 1 at 0.9 of a core), node 1's link changed from 1 Gbit/s
   to 50 Mbit/s for ``--slow-s`` (10) seconds and back, with ``--sync bsp --batching dynamic``
   and ``--sync selsync --batching dynamic``: rank 0's step time, sync time and batch sizes
   before, during and after, and how many steps the step time took to settle (its 3-step
   rolling median within 25 % of the phase's median) after each change.

Prints a table per part; the last stdout line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hethpc.testbed import Testbed, kernel  # noqa: E402
from hethpc.testbed.kernel import missing  # noqa: E402

PY = str(ROOT / ".venv" / "bin" / "python")
MPIRUN = str(ROOT / "scripts" / "mpirun.sh")
TRAIN = str(ROOT / "jobs" / "train.py")
LINK = "1gbit"
NODE = {"cpu": 0.6, "link": LINK}
# the fault jobs: 3 epochs of 125 steps (16,000 training samples, global batch 128)
FAULT_ARGS = ["--model", "cnn1d_wide", "--epochs", "3", "--sync", "bsp", "--checkpoint-every",
              "50"]  # fmt: skip
HARD_LIMIT_S = 240  # mpirun --timeout: no case may hang the benchmark
MCA: dict[str, str] = {}  # --mca: Open MPI settings for every job
# (a) Open MPI's launcher checks its daemons over TCP keepalive after 300 s of silence by
# default; these settings make it declare a cut-off node's daemon lost 25-30 s after the
# cut, which outlasts a 20 s outage and comes before the watchdog's 30 s.
KEEPALIVE = {"OMPI_MCA_oob_tcp_keepalive_time": "5", "OMPI_MCA_oob_tcp_keepalive_intvl": "5",
             "OMPI_MCA_oob_tcp_keepalive_probes": "5"}  # fmt: skip
OUT_LIMIT_S = 75  # (a2) the cable goes back after this long if the job has not ended


class Job:
    """One ``jobs/train.py`` run launched from the testbed's head, output to a file."""

    def __init__(
        self,
        bed: Testbed,
        run_dir: Path,
        args: Sequence[str],
        *,
        np: int,
        hostfile: Path,
        mca: dict[str, str] | None = None,
    ) -> None:
        self.bed, self.run_dir, self.np = bed, run_dir, np
        n = 0
        while (log := run_dir.parent / f"{run_dir.name}-{n}.log").exists():
            n += 1
        self.log = log
        cmd = [MPIRUN, "-np", str(np), "--hostfile", str(hostfile), PY, TRAIN, *args,
               "--run-dir", str(run_dir), "--progress", "false"]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": "1", "HETHPC_MPIRUN_TIMEOUT": str(HARD_LIMIT_S),
               **MCA, **(mca or {})}  # fmt: skip
        with self.log.open("w") as out:
            self.proc = bed.popen(None, cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                                  env=env)  # fmt: skip
        self.t_start = time.time()

    def beat(self, rank: int) -> dict[str, Any] | None:
        """Rank ``rank``'s heartbeat, with ``wall``: when it last made progress (epoch s)."""
        path = self.run_dir / "heartbeat" / f"rank{rank}.json"
        try:
            d: dict[str, Any] = json.loads(path.read_text())
            d["wall"] = path.stat().st_mtime - float(d["idle_s"])
        except (OSError, ValueError, KeyError):
            return None
        return d

    def wait_step(self, step: int, timeout: float = 90.0) -> dict[str, Any]:
        """Wait until every rank's heartbeat is past ``step``; rank 0's heartbeat."""
        deadline = time.time() + timeout
        while True:
            beats = [self.beat(r) for r in range(self.np)]
            if all(b is not None and b["step"] >= step for b in beats):
                assert beats[0] is not None
                return beats[0]
            if self.proc.poll() is not None:
                raise RuntimeError(f"the job ended before step {step}:\n{self.output()[-3000:]}")
            if time.time() > deadline:
                raise RuntimeError(
                    f"no step {step} after {timeout:.0f} s:\n{self.output()[-3000:]}"
                )
            time.sleep(0.05)

    def wait(self, timeout: float) -> int | None:
        """The exit code, or None if the job still runs after ``timeout`` seconds."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self) -> None:
        """End the job (mpirun ends its ranks) and whatever is left on its nodes."""
        if self.proc.poll() is None:
            self.proc.terminate()
            if self.wait(15) is None:
                self.proc.kill()
                self.proc.wait()
        for node in range(len(self.bed.nodes)):
            self.bed.kill(node)

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def steps(self, rank: int = 0) -> list[dict[str, Any]]:
        path = self.run_dir / "metrics" / f"rank{rank}.jsonl"
        if not path.exists():
            return []
        recs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return [r for r in recs if r.get("kind") == "step"]


def hostfile(bed: Testbed, nodes: Sequence[int], where: Path) -> Path:
    """A hostfile of some of the testbed's nodes (one slot each): the job's rank k on nodes[k]."""
    where.write_text("".join(f"{bed.address(n)} slots=1\n" for n in nodes))
    return where


def left_on(bed: Testbed) -> int:
    """Processes still on the testbed's nodes."""
    return sum(len(kernel.cgroup_pids(bed.cgroup(n))) for n in range(len(bed.nodes)))


def naming(out: str, bed: Testbed, node: int, rank: int) -> dict[str, Any]:
    """Whether the job's output names the lost rank, its node's hostname or its address."""
    rank_re = re.compile(rf"\brank {rank}\b")
    host, addr = bed.hostname(node), bed.address(node)
    lines = [
        ln.strip() for ln in out.splitlines()
        if rank_re.search(ln) or host in ln or re.search(rf"{re.escape(addr)}\b", ln)
    ]  # fmt: skip
    return {
        "names_rank": bool(rank_re.search(out)),
        "names_hostname": host in out,
        "names_address": bool(re.search(rf"{re.escape(addr)}\b", out)),
        "lines": [ln[:240] for ln in lines[:4]],
    }


# --- a and b: a fault that may end the job ------------------------------------------------------
def link_down(
    bed: Testbed, tmp: Path, name: str, *, at: int, down_s: float | None, mca: dict[str, str]
) -> dict[str, Any]:
    """Node 1's cable out for ``down_s`` seconds (None: until the job ends, at most
    ``OUT_LIMIT_S``), with these Open MPI settings."""
    run_dir = tmp / name
    job = Job(bed, run_dir, FAULT_ARGS, np=3, hostfile=hostfile(bed, [0, 1, 2], tmp / "h3"),
              mca=mca)  # fmt: skip
    try:
        b0 = job.wait_step(at)
        t0 = time.time()
        bed.set_link_up(1, False)
        code = job.wait(down_s if down_s is not None else OUT_LIMIT_S)
        ended_while_down = code is not None
        left_while_down = None
        if ended_while_down:  # what is left on the nodes, node 1 still cut off
            time.sleep(3)
            left_while_down = [len(kernel.cgroup_pids(bed.cgroup(n))) for n in range(3)]
        bed.set_link_up(1, True)
        t_up = time.time()
        stalled = job.beat(0)
        resumed_s = None
        if code is None:  # still running: did it move on once the cable was back?
            deadline = t_up + 90
            while code is None and time.time() < deadline:
                beat = job.beat(0)
                if (
                    resumed_s is None
                    and beat is not None
                    and stalled is not None
                    and beat["wall"] > t_up
                    and beat["step"] > stalled["step"]
                ):
                    resumed_s = beat["wall"] - t_up
                code = job.wait(0.1)
        t_end = time.time()
        out = job.output()
        summary = run_dir / "summary.json"
        rec = {
            "down_s": down_s,
            "outcome": "hung" if code is None else "completed" if code == 0 else "ended",
            "exit_code": code,
            "end_s": round(t_end - t0, 1) if code is not None else None,
            "ended_while_down": ended_while_down,
            "left_on_nodes_3s_after": left_while_down,
            "link_back_s": round(t_up - t0, 1),
            "progress_after_up_s": None if resumed_s is None else round(resumed_s, 1),
            "step_at_fault": b0["step"],
            "watchdog_fired": "hethpc watchdog" in out,
            "test_acc": json.loads(summary.read_text())["test_acc"] if summary.exists() else None,
            **naming(out, bed, 1, 1),
        }
        steps = job.steps(0) if code == 0 else []  # a killed rank's last records are lost
        gaps = [b["time"] - a["time"] for a, b in zip(steps, steps[1:], strict=False)]
        rec["longest_step_s"] = round(max(gaps), 1) if gaps else None
        rec["tail"] = out.strip().splitlines()[-6:]
        return rec
    finally:
        bed.set_link_up(1, True)
        job.stop()


def kill_node(bed: Testbed, tmp: Path, *, at: int) -> dict[str, Any]:
    run_dir = tmp / "kill"
    job = Job(bed, run_dir, FAULT_ARGS, np=3, hostfile=hostfile(bed, [0, 1, 2], tmp / "h3"))
    try:
        b0 = job.wait_step(at)
        t0 = time.time()
        bed.kill(1)
        code = job.wait(120)
        t_end = time.time()
        left_at_end = left_on(bed)
        out = job.output()
        time.sleep(3)  # the watchdog monitors notice their rank is gone within a second
        rec = {
            "outcome": "hung" if code is None else "completed" if code == 0 else "ended",
            "exit_code": code,
            "end_s": round(t_end - t0, 1) if code is not None else None,
            "step_at_fault": b0["step"],
            "watchdog_fired": "hethpc watchdog" in out,
            "left_at_end": left_at_end,
            "left_on_nodes_3s_after": [len(kernel.cgroup_pids(bed.cgroup(n))) for n in range(3)],
            "left_pids": [
                (p, Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ")[:120].decode())
                for n in range(3)
                for p in kernel.cgroup_pids(bed.cgroup(n))
                if Path(f"/proc/{p}").exists()
            ],
            **naming(out, bed, 1, 1),
            "tail": out.strip().splitlines()[-6:],
        }
        return rec
    finally:
        job.stop()


def resume(bed: Testbed, tmp: Path, name: str) -> dict[str, Any]:
    """``--resume`` of the run ``name`` on nodes 0 and 2 (node 1 is the lost one)."""
    run_dir = tmp / name
    t0 = time.time()
    job = Job(bed, run_dir, [*FAULT_ARGS, "--resume"], np=2,
              hostfile=hostfile(bed, [0, 2], tmp / "h02"))  # fmt: skip
    try:
        code = job.wait(150)
        took = time.time() - t0
        out = job.output()
        m = re.findall(r"hethpc: resumed from step (\d+)(.*)", out)
        summary = {}
        if (run_dir / "summary.json").exists():
            summary = json.loads((run_dir / "summary.json").read_text())
        return {
            "exit_code": code,
            "took_s": round(took, 1),
            "resumed_from": int(m[-1][0]) if m else None,
            "how": m[-1][1].strip() if m else None,
            "finished": code == 0 and bool(summary),
            "steps": summary.get("steps"),
            "world_size": summary.get("world_size"),
            "test_acc": summary.get("test_acc"),
            "tail": [] if code == 0 else out.strip().splitlines()[-8:],
        }
    finally:
        job.stop()


# --- d: a slow link, absorbed? ------------------------------------------------------------------
def _settle(times: list[float], target: float, window: int = 3, tol: float = 0.25) -> int | None:
    """Steps until the rolling median of ``window`` step times is within ``tol`` of ``target``."""
    for i in range(len(times) - window + 1):
        if abs(statistics.median(times[i : i + window]) - target) <= tol * target:
            return i + window
    return None


def slow_link(
    bed: Testbed, tmp: Path, sync: str, *, at: int, slow_s: float, rate: str
) -> dict[str, Any]:
    run_dir = tmp / f"slow-{sync}"
    args = ["--model", "cnn1d_wide", "--epochs", "40", "--sync", sync, "--batching", "dynamic",
            "--checkpoint-every", "0"]  # fmt: skip
    job = Job(bed, run_dir, args, np=2, hostfile=hostfile(bed, [0, 1], tmp / "h01"))
    try:
        beat = job.wait_step(at)
        # rank 0's step records count from its first step; align them with this clock
        t_slow = time.time()
        bed.set_link(1, rate)
        time.sleep(slow_s)
        bed.set_link(1, LINK)
        t_back = time.time()
        time.sleep(slow_s)
        job.stop()  # the metrics are on disk up to the last epoch end (125 steps, a few s)
    finally:
        bed.set_link(1, LINK)
        job.stop()
    steps = job.steps(0)
    by_step = {r["step"]: r for r in steps}
    anchor = by_step.get(beat["step"] - 1)
    if anchor is None or len(steps) < 20:
        return {"error": f"too few step records ({len(steps)})"}
    offset = beat["wall"] - anchor["time"]  # wall clock = record time + offset
    rows: dict[str, list[dict[str, Any]]] = {"before": [], "during": [], "after": []}
    prev = None
    for r in steps:
        wall = r["time"] + offset
        if prev is not None and r["step"] == prev["step"] + 1:
            r = {**r, "step_s": r["time"] - prev["time"]}
            phase = "before" if wall < t_slow else "during" if wall < t_back else "after"
            rows[phase].append(r)
        prev = r
    out: dict[str, Any] = {"sync": sync, "rate": rate, "slow_s": slow_s}
    for phase, rs in rows.items():
        if not rs:
            out[phase] = None
            continue
        tail = rs[len(rs) // 2 :]  # the settled half
        synced = [r["step_s"] for r in rs if r["synced"]]
        out[phase] = {
            "steps": len(rs),
            "step_ms": round(1000 * statistics.median(r["step_s"] for r in tail), 1),
            "mean_step_ms": round(1000 * statistics.fmean(r["step_s"] for r in rs), 1),
            "synced_step_ms": round(1000 * statistics.median(synced), 1) if synced else None,
            "sync_ms": round(1000 * statistics.median(r["sync_s"] for r in tail), 1),
            "compute_ms": round(1000 * statistics.median(r["compute_s"] for r in tail), 1),
            "synced": round(sum(bool(r["synced"]) for r in rs) / len(rs), 2),
            "batch_sizes_first": rs[0].get("batch_sizes"),
            "batch_sizes_last": rs[-1].get("batch_sizes"),
        }
    for phase in ("during", "after"):
        if out[phase] and rows[phase]:
            times = [r["step_s"] for r in rows[phase]]
            out[phase]["settle_steps"] = _settle(times, out[phase]["step_ms"] / 1000)
    if out["during"] and out["before"]:
        out["slowdown"] = round(out["during"]["step_ms"] / out["before"]["step_ms"], 2)
    if out["after"] and out["before"]:
        out["after_vs_before"] = round(out["after"]["step_ms"] / out["before"]["step_ms"], 2)
    return out


# --- output -------------------------------------------------------------------------------------
def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, list):
        return "/".join(map(str, v))
    return str(v)


def print_faults(rows: dict[str, dict[str, Any]]) -> None:
    cols = (("outcome", "outcome", 9), ("exit_code", "exit", 5), ("link_back_s", "back s", 6),
            ("end_s", "end s", 6),
            ("progress_after_up_s", "moving s", 8), ("longest_step_s", "longest s", 9),
            ("watchdog_fired", "watchdog", 8), ("names_rank", "rank?", 5),
            ("names_hostname", "host?", 5), ("names_address", "addr?", 5))  # fmt: skip
    print(f"{'fault':10s} " + " ".join(f"{label:>{w}s}" for _, label, w in cols))
    for name, r in rows.items():
        print(f"{name:10s} " + " ".join(f"{_fmt(r.get(k)):>{w}s}" for k, _, w in cols))
        for ln in r.get("lines", [])[:3]:
            print(f"{'':10s}   | {ln[:150]}")
    print(
        "back s, end s: from the fault to the cable's return, to mpirun's exit; moving s: "
        "from the cable's return to rank 0's next step (from heartbeats: within a second); "
        "rank?/host?/addr?: whether the output names rank 1, node 1's hostname, its address",
        flush=True,
    )
    print(flush=True)


def print_resumes(rows: dict[str, dict[str, Any]]) -> None:
    keys = ("exit_code", "resumed_from", "steps", "world_size", "test_acc", "took_s")
    print(f"{'resume':14s} " + " ".join(f"{k:>12s}" for k in keys) + "  how")
    for name, r in rows.items():
        print(f"{name:14s} " + " ".join(f"{_fmt(r.get(k)):>12s}" for k in keys)
              + f"  {r.get('how') or ''}")  # fmt: skip
    print(flush=True)


def print_slow(rows: list[dict[str, Any]]) -> None:
    print(
        f"{'sync':8s} {'phase':7s} {'steps':>6s} {'median':>7s} {'mean':>7s} {'synced':>7s} "
        f"{'sync st':>7s} {'sync':>6s} {'comp':>6s} {'settle':>6s}  batch sizes first -> last"
    )
    for r in rows:
        for phase in ("before", "during", "after"):
            p = r.get(phase)
            if not p:
                print(f"{r['sync']:8s} {phase:7s} -")
                continue
            print(
                f"{r['sync']:8s} {phase:7s} {p['steps']:6d} {p['step_ms']:7.1f} "
                f"{p['mean_step_ms']:7.1f} {p['synced']:7.2f} {_fmt(p['synced_step_ms']):>7s} "
                f"{p['sync_ms']:6.1f} {p['compute_ms']:6.1f} {_fmt(p.get('settle_steps')):>6s}  "
                f"{_fmt(p['batch_sizes_first'])} -> {_fmt(p['batch_sizes_last'])}"
            )
    print(
        "ms per step (rank 0): median of the phase's second half, mean of the whole phase, "
        "median of its synchronised steps (sync st); sync, comp: medians of sync_s and "
        "compute_s; settle: steps until the 3-step rolling median is within 25 % of the "
        "phase's median",
        flush=True,
    )
    print(flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--down-s", type=float, default=20.0, help="seconds the cable stays out")
    ap.add_argument("--slow-s", type=float, default=10.0, help="seconds the link stays slow")
    ap.add_argument("--slow-rate", default="50mbit", help="node 1's rate while slow")
    ap.add_argument(
        "--mca", action="append", default=[], metavar="KEY=VALUE",
        help="an Open MPI setting for every job (OMPI_MCA_KEY), e.g. oob_tcp_keepalive_time=5",
    )  # fmt: skip
    ap.add_argument("--keep", metavar="DIR", help="keep the runs and their logs in DIR (new)")
    ap.add_argument("--only", default="a,b,c,d", help="the parts to run (a,b,c,d)")
    args = ap.parse_args(argv)
    lack = missing()
    if lack:
        print("bench_testbed_faults needs a testbed host; this one lacks " + "; ".join(lack),
              file=sys.stderr)  # fmt: skip
        return 2
    parts = set(args.only.split(","))
    for kv in args.mca:
        key, _, value = kv.partition("=")
        MCA[f"OMPI_MCA_{key}"] = value
    result: dict[str, Any] = {"keepalive": KEEPALIVE}
    t_all = time.time()
    if args.keep:
        Path(args.keep).mkdir(parents=True, exist_ok=False)
    where = (
        contextlib.nullcontext(args.keep)
        if args.keep
        else tempfile.TemporaryDirectory(prefix="hethpc-faults-")
    )
    with (
        where as tmp_s,
        Testbed([NODE] * 3, name="bfault") as bed,
    ):
        tmp = Path(tmp_s)
        faults: dict[str, dict[str, Any]] = {}
        resumes: dict[str, dict[str, Any]] = {}
        if "a" in parts:
            for name, down_s, mca in (
                ("link_down", args.down_s, {}),
                ("link_out", None, {}),
                ("link_down_ka", args.down_s, KEEPALIVE),
                ("link_out_ka", None, KEEPALIVE),
            ):
                print(
                    f"a. {name}: node 1's link down "
                    + (f"for {down_s:g} s" if down_s is not None else "until the job ends")
                    + (" (Open MPI keepalive settings)" if mca else "")
                    + " (3 ranks, BSP) ...",
                    flush=True,
                )
                faults[name] = link_down(bed, tmp, name, at=60, down_s=down_s, mca=mca)
                if "c" in parts and faults[name]["outcome"] == "ended" and not resumes:
                    resumes[f"after_{name}"] = resume(bed, tmp, name)
        if "b" in parts:
            print("b. node 1's processes killed (3 ranks, BSP) ...", flush=True)
            faults["kill"] = kill_node(bed, tmp, at=120)
            if "c" in parts:
                print("c. --resume on nodes 0 and 2 ...", flush=True)
                resumes["after_kill"] = resume(bed, tmp, "kill")
        if faults:
            print_faults(faults)
        if resumes:
            print_resumes(resumes)
        result["faults"], result["resumes"] = faults, resumes
        if "d" in parts:
            print(f"d. node 1's link 1gbit -> {args.slow_rate} for {args.slow_s:g} s and back "
                  "(2 ranks, dynamic batching) ...", flush=True)  # fmt: skip
            bed.set_cpu(0, 0.9)
            bed.set_cpu(1, 0.9)
            slow = [
                slow_link(bed, tmp, sync, at=150, slow_s=args.slow_s, rate=args.slow_rate)
                for sync in ("bsp", "selsync")
            ]
            print_slow(slow)
            result["slow_link"] = slow
    result["mca"] = args.mca
    result["total_s"] = round(time.time() - t_all, 1)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
