"""Plot one or more hethpc runs and print their summary table.

    .venv/bin/python jobs/report.py runs/demo
    .venv/bin/python jobs/report.py runs/bsp runs/selsync --out plots/compare

Reads <run>/metrics/rank<k>.jsonl and <run>/summary.json and writes PNGs: loss and accuracy
against steps and time, per-rank batch size and compute time against steps, and the sync
decisions over steps. Several runs are drawn side by side (one line or panel per run).
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
    for run in runs:
        with_loss = [recs for recs in run["steps"] if any(r.get("loss") is not None for r in recs)]
        r0 = with_loss[0] if with_loss else run["steps"][0]
        step, t, loss = _col(r0, "step"), _col(r0, "time"), _col(r0, "loss")
        k = min(10, max(1, len(loss) // 10))
        axes[0, 0].plot(step[k - 1 :], _smooth(loss, k), label=run["name"])
        axes[0, 1].plot(t[k - 1 :], _smooth(loss, k), label=run["name"])
        ep = run["epochs"]
        if ep:
            acc = 100 * _col(ep, "test_acc")
            axes[1, 0].plot(_col(ep, "step") + 1, acc, "o-", label=run["name"])
            line = axes[1, 1].plot(_col(ep, "time"), acc, "o-", label=run["name"])[0]
        final = run["summary"]
        if final.get("test_acc") is not None and final.get("time_s") is not None:
            # The averaged model's final score, after the last epoch's evaluation.
            axes[1, 1].plot([final["time_s"]], [100 * final["test_acc"]], "*", ms=12,
                            color=line.get_color() if ep else None,
                            label=f"{run['name']}: final (averaged)")  # fmt: skip
    for ax, (x, y) in zip(
        axes.flat,
        [("step", "training loss"), ("seconds", "training loss"),
         ("step", "test accuracy (%)"), ("seconds", "test accuracy (%)")],
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


def plot_per_rank(runs: list[dict[str, Any]], out: Path, key: str, label: str, name: str) -> Path:
    """One panel per run, one line per rank, of ``key`` against the step."""
    fig, axes = plt.subplots(1, len(runs), figsize=(5.5 * len(runs), 4), squeeze=False)
    for ax, run in zip(axes[0], runs, strict=True):
        for rank, recs in enumerate(run["steps"]):
            y = _col(recs, key)
            if key == "compute_s":
                y = 1000 * y
            ax.plot(_col(recs, "step"), y, label=f"rank {rank}", lw=1)
        ax.set_title(run["name"])
        ax.set_xlabel("step")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    path = out / name
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_sync(runs: list[dict[str, Any]], out: Path) -> Path:
    """SYNC/LOCAL per step (ticks) and the running fraction of steps synchronised."""
    fig, ax = plt.subplots(figsize=(11, 4))
    for i, run in enumerate(runs):
        r0 = run["steps"][0]
        step, synced = _col(r0, "step"), _col(r0, "synced")
        frac = np.cumsum(synced) / np.arange(1, len(synced) + 1)
        (line,) = ax.plot(step, frac, label=f"{run['name']}: fraction synchronised so far")
        sync_steps = step[synced > 0]
        ax.plot(sync_steps, np.full(len(sync_steps), -0.05 - 0.05 * i), "|", color=line.get_color(),
                ms=8, label=f"{run['name']}: SYNC steps")  # fmt: skip
    ax.set_ylim(-0.1 - 0.05 * len(runs), 1.05)
    ax.set_xlabel("step")
    ax.set_ylabel("fraction of steps synchronised")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "sync.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


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
    p = argparse.ArgumentParser(
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
    paths.append(plot_per_rank(runs, out, "batch", "batch size", "batch_sizes.png"))
    paths.append(plot_per_rank(runs, out, "compute_s", "compute per step (ms)", "compute.png"))
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
