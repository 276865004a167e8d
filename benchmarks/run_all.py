"""Run every benchmark and write benchmarks/RESULTS.md: each figure beside its goal.

    .venv/bin/python benchmarks/run_all.py            # every benchmarks/bench_*.py with --quick
    .venv/bin/python benchmarks/run_all.py --full     # their default (longer) runs

Each benchmark runs under ``flock /tmp/hethpc-bench.lock`` (never two at once on a shared
machine); its last stdout line is one JSON object. The goals below come from the issues; a
benchmark or key without a goal is listed with its value alone.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = ROOT / "benchmarks"

# benchmark -> key -> (goal text, test on the value or None)
GOALS: dict[str, dict[str, tuple[str, object]]] = {
    "bench_overhead": {
        "epoch_time_ratio": ("<= 1.05 (hethpc / Horovod epoch time)", lambda v: v <= 1.05),
        "acc_gap_points": ("within 0.5 points of Horovod", lambda v: abs(v) <= 0.5),
    },
}


def run_one(path: Path, *, quick: bool, timeout: float) -> tuple[dict | None, float, str]:
    """Run one benchmark; returns (its JSON line or None, seconds, tail of its output)."""
    cmd = ["flock", "/tmp/hethpc-bench.lock", sys.executable, str(path)]
    if quick:
        cmd.append("--quick")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # scripts/mpirun.sh sets the MPI settings
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                              env=env)  # fmt: skip
        out = proc.stdout
        tail = (proc.stdout + proc.stderr)[-2000:]
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        tail = f"timed out after {timeout:.0f} s\n" + out[-2000:]
    took = time.perf_counter() - t0
    for line in reversed(out.strip().splitlines()):
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            return value, took, tail
        break
    return None, took, tail


def render(results: dict[str, tuple[dict | None, float, str]], quick: bool) -> str:
    """RESULTS.md: one table row per figure."""
    lines = [
        "# Benchmark results",
        "",
        f"`make bench` ({'quick runs: --quick' if quick else 'full runs'}), "
        f"{time.strftime('%Y-%m-%d %H:%M')}. Goals from the issues; quick runs are smoke runs "
        "whose figures say less about the goals than full ones (`benchmarks/run_all.py --full`).",
        "",
        "| benchmark | figure | value | goal | met |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, (data, took, _tail) in results.items():
        if data is None:
            lines.append(f"| {name} | (no JSON line: failed after {took:.0f} s) | | | no |")
            continue
        goals = GOALS.get(name, {})
        for key, value in data.items():
            goal, test = goals.get(key, ("", None))
            met = "" if test is None else ("yes" if test(value) else "no")  # type: ignore[operator]
            lines.append(f"| {name} | {key} | {json.dumps(value)} | {goal} | {met} |")
    failed = [n for n, (d, _, _) in results.items() if d is None]
    for name in failed:
        lines += ["", f"## {name} failed", "", "```", results[name][2].strip(), "```"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--full", action="store_true", help="default runs instead of --quick")
    p.add_argument("--timeout", type=float, default=1200, help="seconds per benchmark")
    p.add_argument("--only", nargs="*", default=None, help="benchmark names to run")
    p.add_argument("--out", type=Path, default=HERE / "RESULTS.md", help="results file")
    args = p.parse_args(argv)
    paths = sorted(HERE.glob("bench_*.py"))
    if args.only:
        paths = [q for q in paths if q.stem in args.only]
    results = {}
    for path in paths:
        print(f"== {path.name}", flush=True)
        data, took, tail = run_one(path, quick=not args.full, timeout=args.timeout)
        results[path.stem] = (data, took, tail)
        print(f"   {'ok' if data else 'FAILED'} in {took:.0f} s: {json.dumps(data)}", flush=True)
    args.out.write_text(render(results, quick=not args.full))
    print(f"wrote {args.out}")
    return 0 if all(d is not None for d, _, _ in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
