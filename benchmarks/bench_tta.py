"""Time to accuracy on an emulated heterogeneous cluster: every method, side by side.

    flock /tmp/hethpc-bench.lock .venv/bin/python benchmarks/bench_tta.py [--quick]
    .venv/bin/python benchmarks/bench_tta.py --only demo,iid_3x_slowlink

Started as a plain process it relaunches itself under ``scripts/mpirun.sh -np 2``. Each named
scenario fixes the compute (equal ranks, or rank 1 emulated 2x or 3x slower: ``--slowdown``),
the link (shared memory, or an emulated slow link: ``--link``) and the data (IID, or label skew
with 6 of 10 MNIST-1D digits per rank). In each, every method trains the same model
(``cnn1d_wide``) from the same seed for the same epoch budget and learning-rate schedule
(``wsd``: constant 0.05, then down to 0 over the last 20 % of the steps, so a run's final
accuracy no longer moves by a point with its last steps' noise), in ``hethpc.train.train``:

- ``bsp``: uniform batches, gradients averaged every step (the baseline);
- ``dynamic``: dynamic batching, BSP;
- ``selsync``: SelSync, uniform batches;
- ``selsync_dynamic``: SelSync with dynamic batching;
- on skewed data only: ``selsync_published``, SelSync as published (the votes alone decide, no
  drift correction, each replica keeps its own momentum: ``max_local_steps=0``,
  ``drift_correction=off``, ``average_optimizer_state=off``; hethpc's defaults there bound the
  local steps to 3 in a row, correct the drift and average the momentum with the parameters),
  ``selsync_dynamic_own_momentum``, ``selsync_dynamic`` with each replica keeping its own
  momentum (hethpc's rule before 2026-12-04), and ``selsync_dynamic_inject``,
  ``selsync_dynamic`` with data injection (alpha 0.5, beta 0.25);
- ``fedavg``: parameter averaging every 10 steps; ``local``: no synchronisation until the end;
- ``diloco``: parameter averaging every 25 steps with the outer Nesterov step (DiLoCo: outer lr
  0.7; momentum 0.5, hethpc's default for such short rounds);
- ``selsync_outer``: SelSync with the same outer step after each of its parameter averages;
  ``selsync_dynamic_outer``: ``selsync_dynamic`` with it (the demo's settings);
- ``diloco_speed``: ``diloco`` with dynamic batching and local steps sized by measured speed
  (``--inner-steps speed``: a faster rank takes more local steps between averages);
- ``ssp_s2``, ``ssp_s8``: stale-synchronous parallel with staleness 2 and 8 (their rows add
  ``max_clock_gap``, the largest lead a rank had over the slowest).

The test accuracy of the averaged model is taken at every epoch end (the replicas are averaged
into a copy first), against the run's wall time. Per run: the final accuracy, the wall time,
the time to reach BSP's final accuracy minus 0.5 point (null: never), the speedup over BSP to
that target, the fraction of steps synchronised and the bytes each rank sent. The slow link,
200 Mbit/s with 50 us latency, makes a BSP step of this model on this host spend about as long
in the gradient allreduce (423 KB) as in compute: the regime of ResNet-101 on 5 Gb/s links.
One markdown table per scenario, one plot per scenario (``--plots DIR``), and the last line is
one JSON object ``{"scenarios": {NAME: {"compute", "link", "data", "methods": {METHOD: {...}}}}}``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _launch import relaunch, under_mpi
from _scratch import scratch

from hethpc import comm
from hethpc.train import TrainConfig, read_metrics, time_to_target, train

SLOW_LINK = "200mbit:50us"
SCENARIOS: dict[str, dict[str, str]] = {
    "demo": {"compute": "1:2@0", "link": SLOW_LINK, "data": "skew"},
    "iid_3x_slowlink": {"compute": "1:3@0", "link": SLOW_LINK, "data": "iid"},
    "iid_3x_shm": {"compute": "1:3@0", "link": "", "data": "iid"},
    "skew_slowlink": {"compute": "", "link": SLOW_LINK, "data": "skew"},
}
METHODS = (
    "bsp", "dynamic", "selsync", "selsync_dynamic", "fedavg", "local", "diloco", "selsync_outer",
    "diloco_speed", "ssp_s2", "ssp_s8", "selsync_dynamic_outer", "selsync_published",
    "selsync_dynamic_inject", "selsync_dynamic_own_momentum",
)  # fmt: skip
# The default run (about 30 minutes): the rest by --methods (SSP alone takes 12 minutes).
DEFAULT_METHODS = (
    "bsp", "dynamic", "selsync", "selsync_dynamic", "fedavg", "local", "diloco", "diloco_speed",
    "selsync_published", "selsync_dynamic_inject", "selsync_dynamic_own_momentum",
)  # fmt: skip
SKEW_ONLY = ("selsync_published", "selsync_dynamic_inject", "selsync_dynamic_own_momentum")
DILOCO_PERIOD = 25


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--quick", action="store_true", help="one scenario, two methods, 1 epoch")
    p.add_argument("--only", default="", help="comma-separated scenarios (default: all)")
    p.add_argument("--methods", default=",".join(DEFAULT_METHODS),
                   help=f"comma-separated, from {', '.join(METHODS)} (skew-only methods are "
                   "skipped on IID data)")  # fmt: skip
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--samples", type=int, default=20_000, help="MNIST-1D samples (80 %% train)")
    p.add_argument("--plots", default="", help="write one PNG per scenario into this directory")
    p.add_argument("--tables", default="", help="also write the markdown tables to this file")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a TrainConfig setting in every run (experiments), e.g. "
                   "max_local_steps=4")  # fmt: skip
    args = p.parse_args(argv)
    if args.quick:
        args.only, args.methods, args.epochs, args.samples = "demo", "bsp,selsync", 1, 4000
    return args


def settings(method: str, scenario: dict[str, str], args: argparse.Namespace) -> dict[str, Any]:
    """The TrainConfig fields of one method in one scenario."""
    kw: dict[str, Any] = {
        "model": "cnn1d_wide", "samples": args.samples, "epochs": args.epochs,
        "batch_size": 128, "lr": 0.05, "lr_schedule": "wsd", "seed": 0, "progress": False,
        "eval_every": 1,
        "slowdown": scenario["compute"], "link": scenario["link"],
        "watchdog_s": 120.0,
    }  # fmt: skip
    if scenario["data"] == "skew":
        kw.update(partition="labels", labels_per_rank=6)
    dynamic = method.startswith(("dynamic", "selsync_dynamic", "diloco_speed"))
    kw["batching"] = "dynamic" if dynamic else "uniform"
    kw["sync"] = {
        "bsp": "bsp", "dynamic": "bsp", "fedavg": "fedavg", "local": "local",
        "diloco": "fedavg", "diloco_speed": "fedavg",
    }.get(method, "selsync" if method.startswith("selsync") else "ssp")  # fmt: skip
    if method in ("diloco", "selsync_outer", "diloco_speed", "selsync_dynamic_outer"):
        kw["outer_optimizer"] = "nesterov"
    if method in ("diloco", "diloco_speed"):
        kw["fedavg_period"] = DILOCO_PERIOD
    if method == "diloco_speed":
        kw["inner_steps"] = "speed"
    if method.startswith("ssp_s"):
        kw["staleness"] = int(method.removeprefix("ssp_s"))
    if method == "selsync_dynamic_inject":
        kw.update(inject_alpha=0.5, inject_beta=0.25)
    if method == "selsync_published":
        kw.update(max_local_steps=0, drift_correction="off", average_optimizer_state="off")
    if method == "selsync_dynamic_own_momentum":
        kw.update(average_optimizer_state="off")
    for item in args.set:
        key, _, value = item.partition("=")
        kw[key] = json.loads(value) if value[:1].isdigit() or value in ("true", "false") else value
    return kw


def run_one(
    method: str,
    scenario: dict[str, str],
    args: argparse.Namespace,
    new_dir: Callable[[str], str],
) -> dict[str, Any]:
    """Train one method in ``new_dir(method)``; its figures and accuracy curve (rank 0's view,
    equal on every rank)."""
    run_dir = Path(new_dir(method))
    cfg = TrainConfig(**settings(method, scenario, args), run_dir=str(run_dir))
    comm.barrier()
    t0 = time.perf_counter()
    result = train(cfg, log=lambda _m: None)
    wall = time.perf_counter() - t0
    curve: list[tuple[float, float]] = []
    if comm.rank() == 0:
        recs = read_metrics(run_dir / "metrics" / "rank0.jsonl")
        curve = [(r["time"], r["test_acc"]) for r in recs if r["kind"] == "epoch"]
    curve = comm.broadcast_object(curve)
    s = result.summary
    return {
        "test_acc": s["test_acc"],
        "wall_s": wall,
        "train_s": s["time_s"],
        "sync_fraction": s["sync_fraction"],
        "bytes_per_rank": s.get("bytes"),
        "final_batch_sizes": s["final_batch_sizes"],
        "curve": curve,
        **({"max_clock_gap": s["max_clock_gap"]} if "max_clock_gap" in s else {}),
    }


time_to = time_to_target


def table(name: str, scen: dict[str, Any]) -> str:
    rows = [
        f"### {name} (compute {scen['compute'] or 'equal'}, link "
        f"{scen['link'] or 'shared memory'}, data {scen['data']})",
        "",
        "| method | test acc | train s | to BSP - 0.5 (s) | speedup | synced | MB/rank | sizes |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m, r in scen["methods"].items():
        t, x = r["time_to_target_s"], r["speedup"]
        reach = "never" if t is None else f"{t:.1f}"
        speedup = "-" if x is None else f"{x:.2f}x"
        if "max_clock_gap" in r:
            m = f"{m} (gap {r['max_clock_gap']})"
        rows.append(
            f"| {m} | {100 * r['test_acc']:.2f} % | {r['train_s']:.1f} | {reach} | {speedup} | "
            f"{100 * r['sync_fraction']:.0f} % | "
            f"{(r['bytes_per_rank'] or 0) / 1e6:.0f} | {r['final_batch_sizes']} |"
        )
    return "\n".join(rows)


def plot(name: str, scen: dict[str, Any], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    # One colour per method (the default cycle repeats after ten); the baseline in black.
    palette = [c for i, c in enumerate(plt.get_cmap("tab20").colors) if i % 2 == 0]
    palette += [c for i, c in enumerate(plt.get_cmap("tab20").colors) if i % 2 == 1]
    others = iter(palette)
    for m, r in scen["methods"].items():
        ts, accs = zip(*r["curve"], strict=True) if r["curve"] else ((), ())
        style = {"color": "black", "lw": 2.0} if m == "bsp" else {"color": next(others)}
        ax.plot(ts, [100 * a for a in accs], marker="o", ms=3, label=m, **style)
    ax.axhline(100 * scen["target"], color="grey", lw=0.8, ls="--", label="BSP final - 0.5")
    ax.set_xlabel("training time (s)")
    ax.set_ylabel("test accuracy of the averaged model (%)")
    ax.set_title(f"{name}: compute {scen['compute'] or 'equal'}, link "
                 f"{scen['link'] or 'shared memory'}, data {scen['data']}")  # fmt: skip
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"tta-{name}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def goal_figures(out: dict[str, Any]) -> dict[str, float | None]:
    """The figures the goals are judged by (None where a scenario or method did not run)."""

    def get(name: str, method: str, key: str) -> Any:
        return out.get(name, {}).get("methods", {}).get(method, {}).get(key)

    g: dict[str, float | None] = {}
    t, bsp_s = get("demo", "selsync_dynamic", "time_to_target_s"), get("demo", "bsp", "train_s")
    g["demo_time_ratio"] = t / bsp_s if t is not None and bsp_s else None
    a, b = get("demo", "selsync_dynamic", "test_acc"), get("demo", "bsp", "test_acc")
    g["demo_acc_gap_points"] = 100 * (b - a) if a is not None and b is not None else None
    g["iid_3x_slowlink_selsync_dynamic_speedup"] = get(
        "iid_3x_slowlink", "selsync_dynamic", "speedup"
    )
    g["iid_3x_shm_dynamic_speedup"] = get("iid_3x_shm", "dynamic", "speedup")
    a, b = get("skew_slowlink", "selsync", "test_acc"), get("skew_slowlink", "bsp", "test_acc")
    g["skew_selsync_acc_gap_points"] = 100 * (b - a) if a is not None and b is not None else None
    g["skew_selsync_sync_fraction"] = get("skew_slowlink", "selsync", "sync_fraction")
    for name in ("iid_3x_shm", "iid_3x_slowlink"):  # DiLoCo: accuracy, budget, speed-sized steps
        a, b = get(name, "diloco", "test_acc"), get(name, "bsp", "test_acc")
        g[f"{name}_diloco_acc_gap_points"] = 100 * (b - a) if a is not None and b else None
        g[f"{name}_diloco_sync_fraction"] = get(name, "diloco", "sync_fraction")
        fixed, speed = (get(name, m, "time_to_target_s") for m in ("diloco", "diloco_speed"))
        g[f"{name}_diloco_speed_vs_diloco"] = fixed / speed if fixed and speed else None
    gaps = [r.get("max_clock_gap") for sc in out.values() for m, r in sc["methods"].items()
            if m.startswith("ssp_s") and int(m[5:]) < (r.get("max_clock_gap") or 0)]  # fmt: skip
    g["ssp_bound_violations"] = len(gaps)
    return g


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    names = [n for n in (args.only.split(",") if args.only else SCENARIOS) if n]
    unknown = sorted(set(names) - set(SCENARIOS))
    if unknown:
        raise SystemExit(f"unknown scenario(s) {unknown}; choose from {sorted(SCENARIOS)}")
    methods = [m for m in args.methods.split(",") if m]
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        raise SystemExit(f"unknown method(s) {unknown}; choose from {', '.join(METHODS)}")
    if not under_mpi():  # bounded at about 90 s per run (a run takes 30-120 s on 2 cores)
        runs = len(names) * len(methods)
        return relaunch(__file__, 2, timeout_s=max(1200, 90 * runs + 300))
    started = time.perf_counter()
    comm.abort_on_exception()
    comm.init()
    out: dict[str, Any] = {}
    with scratch("hethpc-tta-") as new_dir:
        for name in names:
            scen: dict[str, Any] = {**SCENARIOS[name], "methods": {}}
            for m in methods:
                if m in SKEW_ONLY and SCENARIOS[name]["data"] != "skew":
                    continue
                scen["methods"][m] = run_one(m, SCENARIOS[name], args, new_dir)
                if comm.rank() == 0:
                    r = scen["methods"][m]
                    print(
                        f"{name:16s} {m:16s} acc {100 * r['test_acc']:.2f} %  "
                        f"train {r['train_s']:.1f} s  synced {r['sync_fraction']:.0%}",
                        flush=True,
                    )
            base = scen["methods"].get("bsp")
            scen["target"] = base["test_acc"] - 0.005 if base else None
            for r in scen["methods"].values():
                t = time_to(r["curve"], scen["target"]) if scen["target"] is not None else None
                bt = time_to(base["curve"], scen["target"]) if base else None
                r["time_to_target_s"] = t
                r["speedup"] = bt / t if t and bt else None
            out[name] = scen
    if comm.rank() == 0:
        text = []
        for name, scen in out.items():
            text.append(table(name, scen))
            if args.plots:
                path = plot(name, scen, Path(args.plots))
                shown = path.relative_to(Path(args.tables).parent) if args.tables else path
                text.append(f"\n![{name}]({shown})")
        print("\n\n".join(text))
        if args.tables:
            Path(args.tables).write_text(
                "# Time to accuracy (benchmarks/bench_tta.py)\n\n"
                f"{time.strftime('%Y-%m-%d')}, 2 ranks on this host, {args.epochs} epochs of "
                f"MNIST-1D ({args.samples} samples), cnn1d_wide; slow link {SLOW_LINK} (emulated)."
                "\n\n" + "\n\n".join(text) + "\n"
            )
        for scen in out.values():
            for r in scen["methods"].values():
                r.pop("curve")
        took = round(time.perf_counter() - started)
        summary = {"goals": goal_figures(out), "scenarios": out, "epochs": args.epochs,
                   "quick": args.quick, "seconds": took}  # fmt: skip
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
