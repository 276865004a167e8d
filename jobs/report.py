"""Plot one or more hethpc runs and print their summary table.

    .venv/bin/python jobs/report.py runs/demo
    .venv/bin/python jobs/report.py runs/bsp runs/selsync --out plots/compare

Reads <run>/metrics/rank<k>.jsonl and <run>/summary.json and writes PNGs: loss and the test
accuracy of the averaged model against steps and time (with the final point), per-rank batch
sizes with the batch that measured speed calls for, per-rank compute time (rolling median, one
scale), and the cumulative fraction of steps synchronised with a rug of the SYNC steps.
Several runs are drawn side by side (one line or panel per run).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from hethpc._cli import ArgumentParser  # noqa: E402
from hethpc.train import format_summary, read_metrics, time_to_target  # noqa: E402


def load_run(run: Path) -> dict[str, Any]:
    """The records of every rank of ``run`` (``steps[k]``, ``epochs``) and its summary."""
    files = sorted((run / "metrics").glob("rank*.jsonl"), key=lambda p: int(p.stem[4:]))
    if not files:
        raise SystemExit(f"{run}: no metrics/rank*.jsonl; is it a run directory of jobs/train.py?")
    steps, epochs = [], []
    for f in files:
        recs = read_metrics(f)
        by_step = {r["step"]: r for r in recs if r["kind"] == "step"}  # a resume may repeat steps
        steps.append([by_step[s] for s in sorted(by_step)])
        epochs += [r for r in recs if r["kind"] == "epoch"]
    summary_path = run / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    return {"name": run.name, "steps": steps, "epochs": epochs, "summary": summary}


def _smooth(y: np.ndarray, k: int = 10) -> np.ndarray:
    if len(y) < k:
        return y
    return np.convolve(y, np.ones(k) / k, mode="valid")


def _col(recs: list[dict[str, Any]], key: str) -> np.ndarray:
    return np.array([np.nan if r.get(key) is None else float(r[key]) for r in recs])


def plot_curves(runs: list[dict[str, Any]], out: Path) -> list[Path]:
    """Loss (the first rank that computes it, smoothed) and test accuracy, against steps and time.

    With pipeline stages only the last stage computes the loss: its file is read.
    """
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    # Runs with a validation split (--val-fraction) score it during training, the test at the end.
    held = any(r.get("val_acc") is not None for run in runs for r in run["epochs"])
    split = "val" if held else "test"
    for run in runs:
        with_loss = [recs for recs in run["steps"] if any(r.get("loss") is not None for r in recs)]
        r0 = with_loss[0] if with_loss else run["steps"][0]
        step, t, loss = _col(r0, "step"), _col(r0, "time"), _col(r0, "loss")
        k = min(10, max(1, len(loss) // 10))
        axes[0, 0].plot(step[k - 1 :], _smooth(loss, k), label=run["name"])
        axes[0, 1].plot(t[k - 1 :], _smooth(loss, k), label=run["name"])
        ep = run["epochs"]
        if ep:
            acc = 100 * _col(ep, f"{split}_acc")
            axes[1, 0].plot(_col(ep, "step") + 1, acc, "o-", label=run["name"])
            line = axes[1, 1].plot(_col(ep, "time"), acc, "o-", label=run["name"])[0]
        final = run["summary"]
        if final.get(f"{split}_acc") is not None and final.get("time_s") is not None:
            # The averaged model's final score, after the last epoch's evaluation.
            axes[1, 1].plot([final["time_s"]], [100 * final[f"{split}_acc"]], "*", ms=12,
                            color=line.get_color() if ep else None,
                            label=f"{run['name']}: final (averaged)")  # fmt: skip
    for ax, (x, y) in zip(
        axes.flat,
        [("step", "training loss"), ("seconds", "training loss"),
         ("step", f"{split} accuracy (%)"), ("seconds", f"{split} accuracy (%)")],
        strict=True,
    ):  # fmt: skip
        ax.set_xlabel(x)
        ax.set_ylabel(y)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("loss and accuracy")
    fig.tight_layout()
    path = out / "curves.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


def _rolling_median(y: np.ndarray, k: int) -> np.ndarray:
    """The median of each window of ``k`` points ending there (shorter at the start)."""
    if k <= 1 or len(y) == 0:
        return y
    return np.array([np.nanmedian(y[max(0, i - k + 1) : i + 1]) for i in range(len(y))])


def _panels(runs: list[dict[str, Any]]) -> tuple[Any, Any]:
    fig, axes = plt.subplots(1, len(runs), figsize=(5.5 * len(runs), 4), squeeze=False,
                             sharey=True)  # fmt: skip
    return fig, axes[0]


def _save(fig: Any, out: Path, name: str) -> Path:
    fig.tight_layout()
    path = out / name
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def proportional_targets(runs_steps: list[list[dict[str, Any]]], k: int = 25) -> np.ndarray:
    """Per rank and step, the batch in proportion to the ranks' measured throughput (samples per
    second of compute, rolling medians over ``k`` steps), with the global batch of that step:
    what a perfect balance would give. Shape ``[ranks, steps]`` (the shortest rank's steps)."""
    n = min(len(recs) for recs in runs_steps)
    b = np.array([_col(recs[:n], "batch") for recs in runs_steps])
    c = np.array([_col(recs[:n], "compute_s") for recs in runs_steps])
    with np.errstate(divide="ignore", invalid="ignore"):
        speed = np.array([_rolling_median(row, k) for row in b / c])
        return b.sum(axis=0) * speed / speed.sum(axis=0)


def plot_batches(runs: list[dict[str, Any]], out: Path) -> Path:
    """One panel per run: each rank's batch against the step, its proportional target dashed;
    the y axis starts at 0 and is shared, so equal batches read as equal."""
    fig, axes = _panels(runs)
    for ax, run in zip(axes, runs, strict=True):
        # A pipeline's replicas share the global batch: one line per replica (its first stage).
        steps = [recs for recs in run["steps"] if not recs or recs[0].get("stage", 0) == 0]
        who = "replica" if len(steps) < len(run["steps"]) else "rank"
        target = proportional_targets(steps) if len(steps) > 1 else None
        sizes = [_col(recs, "batch") for recs in steps]
        equal = len(sizes) > 1 and all(np.array_equal(b, sizes[0]) for b in sizes[1:])
        if equal:  # one line, not N drawn on top of each other
            ax.plot(_col(steps[0], "step"), sizes[0], lw=1.6, color="black",
                    label=f"every {who} ({who}s 0-{len(sizes) - 1}, equal)")  # fmt: skip
        for k, recs in enumerate(steps):
            step = _col(recs, "step")
            # Drawn (invisibly when equal) for its colour, which the dashed target shares.
            (line,) = ax.plot(step, sizes[k], lw=1.2, alpha=0 if equal else 1,
                              label=None if equal else f"{who} {k}")  # fmt: skip
            if target is not None:
                ax.plot(step[: target.shape[1]], target[k], "--", lw=0.9,
                        color=line.get_color(), label=f"{who} {k}: by speed")  # fmt: skip
        ax.set_title(run["name"])
        ax.set_xlabel("step")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("batch size (samples)")
    fig.suptitle("batch sizes; dashed: as measured speed calls for", fontsize=10)
    return _save(fig, out, "batch_sizes.png")


def plot_compute(runs: list[dict[str, Any]], out: Path, k: int = 25) -> Path:
    """One panel per run: each rank's compute per step (rolling median over ``k`` steps, so a
    spike does not hide the balance), on one shared y scale from 0."""
    fig, axes = _panels(runs)
    top = 0.0
    for ax, run in zip(axes, runs, strict=True):
        for rank, recs in enumerate(run["steps"]):
            y = _rolling_median(1000 * _col(recs, "compute_s"), k)
            ax.plot(_col(recs, "step"), y, lw=1.2, label=f"rank {rank}")
            if np.isfinite(y).any():  # the scale follows the run, not its first warm-up steps
                top = max(top, float(np.nanpercentile(y, 99)))
        ax.set_title(run["name"])
        ax.set_xlabel("step")
        ax.set_ylim(0, 1.3 * top if top > 0 else None)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel(f"compute per step (ms, median of {k})")
    fig.suptitle("forward + backward per rank: balanced when the lines meet", fontsize=10)
    return _save(fig, out, "compute.png")


def plot_sync(runs: list[dict[str, Any]], out: Path) -> Path:
    """The cumulative fraction of steps synchronised, and below it a rug of the SYNC steps
    (one row per run)."""
    ratios = [4, 0.35 + 0.35 * len(runs)]
    fig, (ax, rug) = plt.subplots(2, 1, figsize=(11, 4.8), sharex=True,
                                  gridspec_kw={"height_ratios": ratios})  # fmt: skip
    for i, run in enumerate(runs):
        r0 = run["steps"][0]
        step, synced = _col(r0, "step"), _col(r0, "synced")
        frac = np.cumsum(synced) / np.arange(1, len(synced) + 1)
        (line,) = ax.plot(step, 100 * frac, label=run["name"])
        sync_steps = step[synced > 0]
        rug.plot(sync_steps, np.full(len(sync_steps), i), "|", color=line.get_color(), ms=9)
    ax.set_ylim(0, 105)
    ax.set_ylabel("steps synchronised so far (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    rug.set_yticks(range(len(runs)), [r["name"] for r in runs], fontsize=8)
    rug.set_ylim(-0.6, len(runs) - 0.4)
    rug.set_xlabel("step")
    rug.set_title("SYNC steps", fontsize=8, loc="left")
    return _save(fig, out, "sync.png")


def time_to_baseline(runs: list[dict[str, Any]]) -> str:
    """When each run reached the last run's (the baseline's) final accuracy minus 0.5 point."""
    base = runs[-1]["summary"].get("test_acc")
    if base is None:
        return "time to the baseline's accuracy: the last run has no test accuracy"
    target = base - 0.005
    times = []
    for run in runs:
        curve = [(float(r["time"]), float(r["test_acc"])) for r in run["epochs"]
                 if r.get("test_acc") is not None]  # fmt: skip
        final = run["summary"]
        if final.get("test_acc") is not None and final.get("time_s") is not None:
            curve.append((float(final["time_s"]), float(final["test_acc"])))
        times.append(time_to_target(curve, target))
    ref = times[-1]
    parts = []
    for run, t in zip(runs, times, strict=True):
        if t is None:
            parts.append(f"{run['name']} never")
        else:
            ratio = f" ({t / ref:.2f}x)" if ref and run is not runs[-1] else ""
            parts.append(f"{run['name']} {t:.1f} s{ratio}")
    return (
        f"time to {100 * target:.2f} % (the last run's final accuracy - 0.5 point): "
        + ", ".join(parts)
    )


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(
        prog="jobs/report.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "runs", nargs="+", type=Path, help="run directories (--run-dir of jobs/train.py)"
    )
    p.add_argument("--out", type=Path, help="where the PNGs go (default: <first run>/plots)")
    args = p.parse_args(argv)
    runs = [load_run(r) for r in args.runs]
    out = args.out or args.runs[0] / "plots"
    out.mkdir(parents=True, exist_ok=True)
    paths = plot_curves(runs, out)
    paths.append(plot_batches(runs, out))
    paths.append(plot_compute(runs, out))
    paths.append(plot_sync(runs, out))
    print(format_summary([r["summary"] for r in runs], names=[r["name"] for r in runs]))
    if len(runs) > 1:
        print()
        print(time_to_baseline(runs))
    print("\nplots:")
    for path in paths:
        print(f"  {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
