"""Run every benchmark and write benchmarks/RESULTS.md: each figure beside its goal.

    .venv/bin/python benchmarks/run_all.py            # every benchmarks/bench_*.py, default runs
    .venv/bin/python benchmarks/run_all.py --quick    # their --quick smoke runs
    .venv/bin/python benchmarks/run_all.py --only bench_loader   # rerun some, keep the rest
    .venv/bin/python benchmarks/run_all.py --render   # RESULTS.md again from RESULTS.json

Each benchmark runs under ``flock /tmp/hethpc-bench.lock`` (never two at once on a shared
machine); its last stdout line is one JSON object. The goals below are the targets each
benchmark checks; a benchmark or key without a goal is listed with its value alone. Every
benchmark's last result is kept in benchmarks/RESULTS.json (with when it ran and whether quick),
so ``--only`` reruns some and RESULTS.md still lists all, each with its own date.
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


def _ge(v: object, bound: float) -> bool:
    return isinstance(v, (int, float)) and v >= bound


def _le(v: object, bound: float) -> bool:
    return isinstance(v, (int, float)) and v <= bound


# benchmark -> key -> (goal text, test on the value or None)
GOALS: dict[str, dict[str, tuple[str, object]]] = {
    "bench_overhead": {
        **{
            f"{model}.{key}": (f"<= 0.95 ({what}, {model})", lambda v: _le(v, 0.95))
            for model in ("cnn1d", "large")
            for key, what in (
                ("hethpc_vs_horovod", "hethpc BSP / plain Horovod"),
                ("hethpc_vs_ddp", "hethpc BSP / DDP gloo"),
                ("job_vs_horovod", "jobs/train.py BSP / plain Horovod"),
                ("job_vs_ddp", "jobs/train.py BSP / DDP gloo"),
            )
        },
        "large.allreduce_vs_fastest": (">= 0.9 (of the fastest transport)", lambda v: _ge(v, 0.9)),
    },
    "bench_loader": {
        "loader_vs_raw": (">= 0.7 (raw contiguous h5py reads)", lambda v: v >= 0.7),
        "loader_vs_naive": (">= 10 (per-sample Dataset + DataLoader)", lambda v: v >= 10),
        "loader_vs_memmap_shuffled": (
            ">= 0.9 (numpy memmap, the same shuffled order)",
            lambda v: _ge(v, 0.9),
        ),
    },
    "bench_dynbatch": {
        "speedup": (">= 1.8 (uniform / dynamic epoch time, 3x slowdown)", lambda v: v >= 1.8),
        "dynamic_over_ideal": ("<= 1.10 (within 10 % of ideal)", lambda v: v <= 1.10),
        "adjustments_to_balance": ("<= 3", lambda v: v is not None and v <= 3),
        "intervals_to_rebalance": ("<= 2", lambda v: v is not None and v <= 2),
        "steady_adjustments": ("0", lambda v: v == 0),
        "accuracy_gap_points": ("within 1 point of uniform", lambda v: abs(v) <= 1.0),
    },
    "bench_selsync": {
        "speedup": (">= 1.5 (BSP / SelSync epoch time)", lambda v: v >= 1.5),
    },
    "bench_pipeline": {
        "speedup": (">= 1.6 (2-stage pipeline / one rank; ideal 1.78)", lambda v: v >= 1.6),
        "peak_1f1b_flat_in_m": ("true", lambda v: v is True),
        "speedup_best": (">= 1.75 (hethpc's best schedule / one rank)", lambda v: _ge(v, 1.75)),
        "hethpc_best_over_torch_best": (
            ">= 1.1 (torch.distributed.pipelining's best schedule)",
            lambda v: _ge(v, 1.1),
        ),
    },
    "bench_tta": {
        "goals.demo_time_ratio": (
            "<= 0.6 (hethpc to BSP-0.5 pt / BSP time)",
            lambda v: v is not None and v <= 0.6,
        ),
        "goals.demo_acc_gap_points": (
            "<= 0.5 (BSP - hethpc)",
            lambda v: v is not None and v <= 0.5,
        ),
        "goals.iid_3x_slowlink_selsync_dynamic_speedup": (">= 2.5", lambda v: _ge(v, 2.5)),
        "goals.iid_3x_shm_dynamic_speedup": (">= 1.8", lambda v: _ge(v, 1.8)),
        "goals.skew_selsync_acc_gap_points": (
            "<= 1 (BSP - SelSync)",
            lambda v: v is not None and v <= 1,
        ),
        "goals.skew_selsync_sync_fraction": ("<= 0.3", lambda v: v is not None and v <= 0.3),
    },
    "bench_faults": {
        "worst_to_exit_s": ("<= 60 (any failed rank ends the job)", lambda v: v <= 60),
        "sigstop_to_exit_s": ("<= 60 (default watchdog)", lambda v: v <= 60),
        "stall_to_exit_s": ("<= 60 (default watchdog)", lambda v: v <= 60),
    },
}

# The paced 2-rank run (compute paced, the host's noise hidden) is held to the same goals.
GOALS["bench_testbed"] = {
    **{
        f"quota_{q}_testbed_of_ideal": (
            f">= 0.8 of the ideal (dynamic over uniform batches, a real quota of a {q} of a core)",
            lambda v: _ge(v, 0.8),
        )
        for q in ("half", "third")
    },
    **{
        f"demo_{sync}_{key}_testbed_over_emulated": (
            "within 15 % (0.85..1.15; the emulation against the kernel-enforced testbed)",
            lambda v: _ge(v, 0.85) and _le(v, 1.15),
        )
        for sync in ("bsp", "selsync")
        for key in ("step_s", "time_s", "tta_s")
    },
    "pipeline_time_cut_over_param_cut": (
        ">= 1.3x (a 2-stage pipeline, stage 1 at half a core: cut by speed over by parameters)",
        lambda v: _ge(v, 1.3),
    ),
    "pxd_dynamic_over_uniform": (
        ">= 1.3x (P = 2 x D = 2, one replica at a third of the speed: dynamic over uniform)",
        lambda v: _ge(v, 1.3),
    ),
    "cap_loss_max_rel_diff": (
        "<= 1e-4 (a rank capped at a third of its share, accumulating: the loss of every step "
        "as uncapped)",
        lambda v: _le(v, 1e-4),
    ),
}
# The evidence protocol (docs/evaluation.md): medians over 5 seeds against BSP tuned alike.
GOALS["bench_evidence"] = {
    **{
        f"demo_{m}_over_bsp_every_seed": (
            "<= 0.6 (median time to target / the tuned BSP's; every seed reaching it)",
            lambda v: _le(v, 0.6),
        )
        for m in ("bsp_dynamic", "fedavg_dynamic", "selsync_dynamic")
    },
    **{
        f"iid_3x_slowlink_{m}_over_bsp": (
            "<= 0.5 (at least 2x sooner; median of the seeds reaching it)",
            lambda v: _le(v, 0.5),
        )
        for m in ("bsp_dynamic", "fedavg_dynamic", "selsync_dynamic")
    },
    **{
        f"testbed_iid_3x_{m}_over_bsp": (
            "<= 0.5 (at least 2x sooner on the testbed; median of the seeds reaching it)",
            lambda v: _le(v, 0.5),
        )
        for m in ("bsp_dynamic", "fedavg_dynamic", "selsync_dynamic")
    },
    **{
        f"testbed_iid_3x_{m}_over_horovod": (
            "<= 0.67 (at least 1.5x sooner than tuned plain Horovod on the same nodes)",
            lambda v: _le(v, 0.67),
        )
        for m in ("bsp", "bsp_dynamic", "fedavg_dynamic", "selsync_dynamic")
    },
}
GOALS["bench_compression"] = {
    "emulated_hethpc_powersgd4_fewer_bytes": (
        ">= 4 (fp32 BSP's bytes per step / PowerSGD rank 4's, 200 Mbit/s emulated)",
        lambda v: _ge(v, 4),
    ),
    "emulated_hethpc_powersgd4_step_vs_fp32": (
        "<= 0.6 (PowerSGD rank 4's step / fp32 BSP's, 200 Mbit/s emulated)",
        lambda v: _le(v, 0.6),
    ),
    "testbed_hethpc_powersgd4_over_ddp_powersgd4": (
        "<= 0.9 (hethpc's PowerSGD step / DDP's powerSGD_hook step, testbed)",
        lambda v: _le(v, 0.9),
    ),
    "testbed_hethpc_fp16_over_horovod_fp16": (
        "<= 0.9 (hethpc's fp16 step / Horovod's Compression.fp16 step, testbed)",
        lambda v: _le(v, 0.9),
    ),
    "acc_large_bsp_powersgd4_points_below_fp32": (
        "<= 0.5 (points of test accuracy below fp32 BSP, large, 2 epochs)",
        lambda v: _le(v, 0.5),
    ),
    "acc_large6_bsp_powersgd4_points_below_fp32": (
        "<= 0.5 (points of test accuracy below fp32 BSP, large, 6 epochs)",
        lambda v: _le(v, 0.5),
    ),
    **{
        f"acc_cnn1d_{m}_int8_points_below_fp32": (
            f"<= 0.3 (points of test accuracy below fp32 {m})",
            lambda v: _le(v, 0.3),
        )
        for m in ("selsync", "diloco")
    },
    **{  # per average: a run's total also counts how many averages it took (SelSync's votes)
        f"acc_cnn1d_{m}_int8_codec_ratio": (
            f">= 4 ({m}'s bytes per average, fp32 / int8)",
            lambda v: _ge(v, 4),
        )
        for m in ("selsync", "diloco")
    },
}
GOALS["bench_dynbatch"].update(
    {f"paced.{k}": (f"{goal}, paced", test) for k, (goal, test) in GOALS["bench_dynbatch"].items()}
)

# Default runs of these also write their tables and plots, which RESULTS.md then includes.
EXTRA_ARGS = {
    "bench_tta": ["--plots", str(HERE / "plots"), "--tables", str(HERE / "TTA.md")],
    "bench_evidence": ["--tables", str(HERE / "EVIDENCE.md")],
}
INCLUDED = {"bench_tta": HERE / "TTA.md", "bench_evidence": HERE / "EVIDENCE.md"}
# Benchmarks whose default run takes longer than --timeout's default: their own bound (s).
TIMEOUTS = {"bench_evidence": 21600.0}  # its 8 scenarios take about 5 hours on 2 cores
# Side-by-side comparisons run by hand (A/B of two commits, probes of the host), with dates.
NOTES = HERE / "NOTES.md"

# Keys whose values are long lists of per-step or per-decision detail: kept out of the table.
_LONG = 120


def run_one(path: Path, *, quick: bool, timeout: float) -> tuple[dict | None, float, str]:
    """Run one benchmark; returns (its JSON line or None, seconds, tail of its output)."""
    cmd = ["flock", "/tmp/hethpc-bench.lock", sys.executable, str(path)]
    cmd += ["--quick"] if quick else EXTRA_ARGS.get(path.stem, [])
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
    return last_json(out), took, tail


def last_json(text: str) -> dict | None:
    """The last line of ``text`` that is a JSON object (a benchmark's result), or None."""
    for line in reversed(text.strip().splitlines()):
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            return value
    return None


def _rows(data: dict) -> list[tuple[str, object]]:
    """The figures of a result: a long nested result (another world size, a paced run) gives
    its own figures as ``outer.inner``."""
    rows: list[tuple[str, object]] = []
    for key, value in data.items():
        if isinstance(value, dict) and len(json.dumps(value)) > _LONG:
            rows += [(f"{key}.{k}", v) for k, v in value.items()]
        else:
            rows.append((key, value))
    return rows


def render(results: dict[str, tuple[dict | None, float, str]], runs: dict[str, str]) -> str:
    """RESULTS.md: one table row per figure; ``runs`` says when and how each benchmark ran."""
    lines = [
        "# Benchmark results",
        "",
        "`make bench` (benchmarks/run_all.py). Goals: the targets each benchmark checks; quick "
        "runs are smoke runs whose figures say less about the goals than the default ones. Runs:",
        "",
        *[f"- {name}: {runs[name]}" for name in results],
        "",
        "| benchmark | figure | value | goal | met |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, (data, took, _tail) in results.items():
        if data is None:
            lines.append(f"| {name} | (no JSON line: failed after {took:.0f} s) | | | no |")
            continue
        goals = GOALS.get(name, {})
        for key, value in _rows(data):
            if len(json.dumps(value)) > _LONG:
                continue
            goal, test = goals.get(key, ("", None))
            met = "" if test is None else ("yes" if test(value) else "no")  # type: ignore[operator]
            lines.append(f"| {name} | {key} | {json.dumps(value)} | {goal} | {met} |")
    for name, path in INCLUDED.items():
        if name in results and path.is_file():  # its tables and plots, under its own heading
            body = path.read_text().split("\n", 1)[1]  # without its title
            lines += ["", f"## {name}: `{path.name}`", "", body.strip()]
    if NOTES.is_file():
        body = NOTES.read_text().split("\n", 1)[1]
        lines += ["", f"## Side by side: `{NOTES.name}`", "", body.strip()]
    lines += ["", "## Last JSON line of each benchmark", ""]
    for name, (data, _took, _tail) in results.items():
        if data is not None:
            lines += [f"`{name}`:", "", "```json", json.dumps(data), "```", ""]
    failed = [n for n, (d, _, _) in results.items() if d is None]
    for name in failed:
        lines += ["", f"## {name} failed", "", "```", results[name][2].strip(), "```"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="each benchmark's short --quick run")
    p.add_argument("--timeout", type=float, default=1200, help="seconds per benchmark")
    p.add_argument(
        "--only", nargs="*", default=None, help="benchmarks to run, e.g. bench_loader or loader"
    )
    p.add_argument("--out", type=Path, default=HERE / "RESULTS.md", help="results file")
    p.add_argument(
        "--ingest", action="append", default=[], metavar="NAME=LOG[@SECONDS]",
        help="record the last JSON line of LOG (a saved run of benchmark NAME, e.g. "
        "bench_tta=/tmp/tta.log@1900) as its result, without running anything; SECONDS: how "
        "long it ran (default: the result's own 'seconds')",
    )  # fmt: skip
    p.add_argument(
        "--render",
        action="store_true",
        help="only write RESULTS.md again from RESULTS.json and NOTES.md (no runs)",
    )
    args = p.parse_args(argv)
    if args.only is not None and not args.only:
        p.error("--only needs benchmark names, e.g. --only bench_loader bench_pipeline")
    paths = sorted(HERE.glob("bench_*.py"))
    if args.render:
        paths = []
    elif args.only:
        names = {n.removesuffix(".py") for n in args.only}
        names |= {f"bench_{n}" for n in names}
        unknown = [
            n
            for n in args.only
            if not {n.removesuffix(".py"), f"bench_{n.removesuffix('.py')}"}
            & {q.stem for q in paths}
        ]
        if unknown:
            p.error(
                f"--only: no benchmark named {', '.join(unknown)}; choose from "
                f"{', '.join(q.stem for q in paths)}"
            )
        paths = [q for q in paths if q.stem in names]
    store = args.out.with_suffix(".json")
    kept = json.loads(store.read_text()) if store.is_file() else {}
    ok = True
    if args.ingest:
        paths = []
        for item in args.ingest:
            name, _, rest = item.partition("=")
            log, _, took_s = rest.partition("@")
            data = last_json(Path(log).read_text()) if Path(log).is_file() else None
            if not name.startswith("bench_") or data is None:
                p.error(f"--ingest {item}: need NAME=LOG with a bench_* name and a log whose "
                        "last JSON line is the result")  # fmt: skip
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(Path(log).stat().st_mtime))
            seconds = round(float(took_s or data.get("seconds", 0)))
            kept[name] = {"data": data, "seconds": seconds, "tail": "", "when": when,
                          "quick": bool(data.get("quick", False))}  # fmt: skip
    for path in paths:
        print(f"== {path.name}", flush=True)
        timeout = args.timeout if args.quick else max(args.timeout, TIMEOUTS.get(path.stem, 0.0))
        data, took, tail = run_one(path, quick=args.quick, timeout=timeout)
        ok = ok and data is not None
        kept[path.stem] = {
            "data": data, "seconds": round(took), "tail": tail if data is None else "",
            "when": time.strftime("%Y-%m-%d %H:%M"), "quick": args.quick,
        }  # fmt: skip
        print(f"   {'ok' if data else 'FAILED'} in {took:.0f} s: {json.dumps(data)}", flush=True)
    store.write_text(json.dumps(kept, indent=1, sort_keys=True) + "\n")
    names = sorted(kept)
    results = {n: (kept[n]["data"], float(kept[n]["seconds"]), kept[n]["tail"]) for n in names}
    runs = {
        n: f"{kept[n]['when']}, {'--quick' if kept[n]['quick'] else 'default run'}, "
        f"{kept[n]['seconds']} s"
        for n in names
    }
    args.out.write_text(render(results, runs))
    print(f"wrote {args.out} ({len(names)} benchmarks; {store.name} keeps their last results)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
