"""Plot one or more hethpc runs and print their summary table.

    .venv/bin/python jobs/report.py runs/demo
    .venv/bin/python jobs/report.py runs/bsp runs/selsync --out plots/compare

Reads <run>/metrics/rank<k>.jsonl and <run>/summary.json and writes PNGs: one rank's training
loss and the run's score of the averaged model (test or validation accuracy, MSE, ...) against
steps and time (with the final point), per-rank batch sizes with the batch that measured speed
calls for, per-rank compute time (rolling median, one scale; a pipeline stage's busy part of
the step), and the cumulative fraction of steps synchronised with a rug of the SYNC steps.
Several runs are drawn side by side (one line or panel per run), by default into a folder of
their own, <first run>/plots/vs-<other runs>; the paths written are printed.
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

from hethpc.cli.parser import ArgumentParser, command_name  # noqa: E402
from hethpc.train import format_summary, read_metrics, time_to_target  # noqa: E402


def load_run(run: Path) -> dict[str, Any]:
    """The records of every rank of ``run`` (``steps[k]``, ``epochs``) and its summary."""
    files = sorted((run / "metrics").glob("rank*.jsonl"), key=lambda p: int(p.stem[4:]))
    if not files:
        raise SystemExit(f"{run}: no metrics/rank*.jsonl; is it a run directory of jobs/train.py?")
    steps, epochs, resumes = [], [], []
    for k, f in enumerate(files):
        recs = read_metrics(f)
        if k == 0:  # rank 0 records where each resumed process took over
            resumes = [r for r in recs if r["kind"] == "resume"]
        by_step = {r["step"]: r for r in recs if r["kind"] == "step"}  # a resume may repeat steps
        steps.append([by_step[s] for s in sorted(by_step)])
        epochs += [r for r in recs if r["kind"] == "epoch"]
    summary_path = run / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    return {"name": run.resolve().name, "steps": steps, "epochs": epochs, "summary": summary,
            "resumes": resumes}  # fmt: skip


def _smooth(y: np.ndarray, k: int = 10) -> np.ndarray:
    if len(y) < k:
        return y
    return np.convolve(y, np.ones(k) / k, mode="valid")


def _col(recs: list[dict[str, Any]], key: str) -> np.ndarray:
    return np.array([np.nan if r.get(key) is None else float(r[key]) for r in recs])


# Scores where lower is better; of the rest, only accuracy is known to be higher-is-better.
ERRORS = ("mse", "mae", "rmse")
# Bits per byte (token windows): lower is better; the target is the baseline's plus this.
BPB_MARGIN = 0.05


def metric_of(run: dict[str, Any]) -> str | None:
    """The score a run's evaluations carry: ``val_<metric>`` with a validation split, else
    ``test_<metric>`` (``test_acc``, ``test_mse``, ...); from its summary when it has no
    evaluation records; None when it has neither."""
    for records in (run["epochs"], [run["summary"]]):
        keys = [
            k
            for r in records
            for k, v in r.items()
            if k.startswith(("val_", "test_"))
            and isinstance(v, (int, float)) and not isinstance(v, bool)
        ]  # fmt: skip
        if keys:
            return next((k for k in keys if k.startswith("val_")), keys[0])
    return None


def metric_label(key: str) -> str:
    """``test accuracy (%)``, ``validation MSE``, ``validation bits per byte``, ``test top
    5``: the axis label of a score."""
    split, _, name = key.partition("_")
    split = {"val": "validation"}.get(split, split)
    if name == "acc":
        return f"{split} accuracy (%)"
    if name == "bpb":
        return f"{split} bits per byte"
    return f"{split} {name.upper() if name in ERRORS else name.replace('_', ' ')}"


def _scale(key: str) -> float:
    return 100.0 if key.endswith("_acc") else 1.0


def _loss_rank(run: dict[str, Any]) -> int:
    """The first rank whose records carry the loss (a pipeline's last stage; else rank 0)."""
    return next(
        (k for k, recs in enumerate(run["steps"]) if any(r.get("loss") is not None for r in recs)),
        0,
    )


def curves_figure(runs: list[dict[str, Any]]) -> Any:
    """Loss and the runs' score (accuracy, MSE, ...), against steps and time.

    The loss is one rank's own: the mean over its local batch, as that rank logged it (rank 0,
    or a pipeline's last stage, the only one that computes it), smoothed over up to 10 steps;
    not the loss over the global batch. The score is each run's own (:func:`metric_of`).
    """
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    labels: list[str] = []
    for run in runs:
        rank = _loss_rank(run)
        r0 = run["steps"][rank]
        step, t, loss = _col(r0, "step"), _col(r0, "time"), _col(r0, "loss")
        k = min(10, max(1, len(loss) // 10))
        who = f"{run['name']}: rank {rank}, mean of {k}"
        line = axes[0, 0].plot(step[k - 1 :], _smooth(loss, k), label=who)[0]
        axes[0, 1].plot(t[k - 1 :], _smooth(loss, k), label=who)
        for j, r in enumerate(run.get("resumes", [])):  # where a resumed process took over
            mark = {"color": line.get_color(), "ls": ":", "lw": 1.2}
            said = f"{run['name']}: resumed" if not j else None
            axes[0, 0].axvline(r["step"], **mark, label=said)
            axes[0, 1].axvline(r["time"], **mark)
        key = metric_of(run)
        if key is None:
            continue
        if metric_label(key) not in labels:
            labels.append(metric_label(key))
        scale = _scale(key)
        ep = [r for r in run["epochs"] if r.get(key) is not None]
        line = None
        if ep:
            score = scale * _col(ep, key)
            axes[1, 0].plot(_col(ep, "step") + 1, score, "o-", label=run["name"])
            (line,) = axes[1, 1].plot(_col(ep, "time"), score, "o-", label=run["name"])
        final = run["summary"]
        if final.get(key) is not None and final.get("time_s") is not None:
            # The averaged model's final score, after the last epoch's evaluation.
            axes[1, 1].plot([final["time_s"]], [scale * final[key]], "*", ms=12,
                            color=line.get_color() if line is not None else None,
                            label=f"{run['name']}: final (averaged)")  # fmt: skip
    score_label = " / ".join(labels) if labels else "score (none recorded)"
    for ax, (x, y) in zip(
        axes.flat,
        [("step", "training loss (one rank)"), ("seconds", "training loss (one rank)"),
         ("step", score_label), ("seconds", score_label)],
        strict=True,
    ):  # fmt: skip
        ax.set_xlabel(x)
        ax.set_ylabel(y)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    if not labels:
        for ax in axes[1]:
            ax.text(0.5, 0.5, "no evaluations recorded", ha="center", va="center",
                    transform=ax.transAxes)  # fmt: skip
    axes[0, 0].set_title("training loss: one rank's local batches, moving mean", fontsize=9)
    axes[1, 0].set_title(f"{score_label}, averaged model, at each evaluation", fontsize=9)
    fig.suptitle(f"loss and {score_label}")
    return fig


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


def _top(y: np.ndarray, q: float = 100) -> float:
    """The ``q``-th percentile of ``y``'s finite values; 0 without any."""
    return float(np.nanpercentile(y, q)) if np.isfinite(y).any() else 0.0


def _is_pipeline(run: dict[str, Any]) -> bool:
    return any(recs and recs[0].get("stage") is not None for recs in run["steps"])


def _replica_steps(run: dict[str, Any]) -> list[list[dict[str, Any]]]:
    """One rank's records per replica: every rank's, or a pipeline's first stages'."""
    return [recs for recs in run["steps"] if not recs or recs[0].get("stage") in (None, 0)]


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


def batches_figure(runs: list[dict[str, Any]]) -> Any:
    """One panel per run: each rank's batch against the step, its proportional target dashed;
    one y scale from 0 for every panel, so equal batches read as equal."""
    fig, axes = _panels(runs)
    top, dashed = 0.0, False
    for ax, run in zip(axes, runs, strict=True):
        # A pipeline's replicas share the global batch: one line per replica (its first stage).
        steps = _replica_steps(run)
        who = "replica" if _is_pipeline(run) else "rank"
        target = proportional_targets(steps) if len(steps) > 1 else None
        sizes = [_col(recs, "batch") for recs in steps]
        top = max([top, *(_top(b) for b in sizes)])
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
        if target is not None:
            dashed = True
            top = max(top, _top(target, 99))  # a speed estimate's spike does not set the scale
        ax.set_title(run["name"])
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    # Shared: one scale from 0, set once all panels are drawn (a limit set on the first panel
    # would fix the scale of all at the first run's batches).
    axes[0].set_ylim(0, 1.1 * top if top > 0 else None)
    axes[0].set_ylabel("batch size (samples)")
    title = "batch sizes" + ("; dashed: as measured speed calls for" if dashed else "")
    fig.suptitle(title, fontsize=10)
    return fig


def compute_figure(runs: list[dict[str, Any]], k: int = 25) -> Any:
    """One panel per run: each rank's compute per step (rolling median over ``k`` steps, so a
    spike does not hide the balance), on one shared y scale from 0.

    A pipeline stage logs the whole step as its compute: drawn instead is the part of the step
    it was busy, ``compute_s * (1 - idle)``, with its mean idle share in the legend.
    """
    fig, axes = _panels(runs)
    top, pipelines = 0.0, False
    for ax, run in zip(axes, runs, strict=True):
        pipeline = _is_pipeline(run)
        pipelines |= pipeline
        for rank, recs in enumerate(run["steps"]):
            ms = 1000 * _col(recs, "compute_s")
            label = f"rank {rank}"
            if pipeline and recs:
                idle = _col(recs, "idle")
                ms = ms * (1 - idle)
                share = f"{100 * np.nanmean(idle):.0f} %" if np.isfinite(idle).any() else "?"
                label += f": stage {recs[0]['stage']}, replica {recs[0].get('replica', 0)}, " \
                         f"idle {share}"  # fmt: skip
            y = _rolling_median(ms, k)
            ax.plot(_col(recs, "step"), y, lw=1.2, label=label)
            top = max(top, _top(y, 99))  # the scale follows the run, not its warm-up steps
        ax.set_title(f"{run['name']}: busy per stage" if pipeline else run["name"])
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylim(0, 1.3 * top if top > 0 else None)  # shared: one scale for all panels
    axes[0].set_ylabel(f"compute per step (ms, median of {k})")
    title = "forward + backward per rank: balanced when the lines meet"
    if pipelines:
        title += "\npipeline stages: the step's time times the stage's busy share (1 - idle)"
    fig.suptitle(title, fontsize=10)
    return fig


def sync_figure(runs: list[dict[str, Any]]) -> Any:
    """The cumulative fraction of steps synchronised, and below it a rug of the SYNC steps
    (one row per run). A run of one replica has nothing to synchronise and says so."""
    ratios = [4, 0.35 + 0.35 * len(runs)]
    fig, (ax, rug) = plt.subplots(2, 1, figsize=(11, 4.8), sharex=True,
                                  gridspec_kw={"height_ratios": ratios})  # fmt: skip
    alone = []
    for i, run in enumerate(runs):
        if len(_replica_steps(run)) < 2:
            alone.append(run["name"])
            ax.plot([], [], " ", label=f"{run['name']}: one replica, nothing to synchronise")
            continue
        r0 = run["steps"][0]
        step, synced = _col(r0, "step"), _col(r0, "synced")
        frac = np.cumsum(synced) / np.arange(1, len(synced) + 1)
        (line,) = ax.plot(step, 100 * frac, label=run["name"])
        sync_steps = step[synced > 0]
        rug.plot(sync_steps, np.full(len(sync_steps), i), "|", color=line.get_color(), ms=9)
    if len(alone) == len(runs):
        say = "one replica" + (" in every run" if len(runs) > 1 else "")
        ax.text(0.5, 0.5, f"{say}: nothing to synchronise", ha="center", va="center",
                transform=ax.transAxes)  # fmt: skip
        ax.set_xlim(0, max(len(recs) for run in runs for recs in run["steps"]) or None)
    ax.set_ylim(0, 105)
    ax.set_ylabel("steps synchronised so far (%)")
    ax.set_title("share of steps on which the replicas synchronised", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    rug.set_yticks(range(len(runs)), [r["name"] for r in runs], fontsize=8)
    rug.set_ylim(-0.6, len(runs) - 0.4)
    rug.set_xlabel("step")
    rug.set_title("SYNC steps", fontsize=8, loc="left")
    return fig


FIGURES = {
    "curves.png": curves_figure,
    "batch_sizes.png": batches_figure,
    "compute.png": compute_figure,
    "sync.png": sync_figure,
}


def time_to_baseline(runs: list[dict[str, Any]]) -> str:
    """When each run reached the last run's (the baseline's) final score: its accuracy minus
    0.5 point, its bits per byte plus 0.05, or an error's (MSE, MAE) plus 5 %. The score is
    the baseline's :func:`metric_of`; a metric of unknown direction is not compared."""
    key = metric_of(runs[-1])
    base = runs[-1]["summary"].get(key) if key else None
    if key is None or base is None:
        return "time to the baseline's score: the last run has no final score"
    name = key.partition("_")[2]
    label = metric_label(key).removesuffix(" (%)")
    if name == "acc":
        lower, target = False, base - 0.005
        goal = f"{100 * target:.2f} % (the last run's final {label} - 0.5 point)"
    elif name == "bpb":
        lower, target = True, base + BPB_MARGIN
        goal = f"{label} {target:.3f} (the last run's final {label} + {BPB_MARGIN})"
    elif name in ERRORS:
        lower, target = True, base * 1.05
        goal = f"{label} {target:.4g} (the last run's final {label} + 5 %)"
    else:
        return (
            f"time to the baseline's score: not computed for {key}: jobs/report.py knows "
            f"accuracy (higher is better), bpb and {', '.join(ERRORS)} (lower is better)"
        )
    times: list[float | None] = []
    for run in runs:
        curve = [(float(r["time"]), float(r[key])) for r in run["epochs"]
                 if r.get(key) is not None]  # fmt: skip
        final = run["summary"]
        if final.get(key) is not None and final.get("time_s") is not None:
            curve.append((float(final["time_s"]), float(final[key])))
        times.append(time_to_target(curve, target, lower_is_better=lower) if curve else None)
    ref = times[-1]
    parts = []
    for run, t in zip(runs, times, strict=True):
        if t is None:
            has = any(r.get(key) is not None for r in [*run["epochs"], run["summary"]])
            parts.append(f"{run['name']} {'never' if has else f'has no {key}'}")
        else:
            ratio = f" ({t / ref:.2f}x)" if ref and run is not runs[-1] else ""
            parts.append(f"{run['name']} {t:.1f} s{ratio}")
    return f"time to {goal}: " + ", ".join(parts)


def default_out(runs: list[Path]) -> Path:
    """``<first run>/plots``; with several runs a folder of its own in it, named for the
    comparison (``plots/vs-<other runs>``), which leaves the first run's own plots alone."""
    out = runs[0] / "plots"
    if len(runs) > 1:
        out = out / ("vs-" + "-".join(r.resolve().name for r in runs[1:]))
    return out


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(
        prog=command_name(argv, "jobs/report.py"),
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "runs", nargs="+", type=Path, help="run directories (--run-dir of jobs/train.py)"
    )
    p.add_argument(
        "--out", type=Path,
        help="where the PNGs go (default: <first run>/plots; with several runs "
        "<first run>/plots/vs-<other runs>)",
    )  # fmt: skip
    args = p.parse_args(argv)
    runs = [load_run(r) for r in args.runs]
    out = args.out or default_out(args.runs)
    out.mkdir(parents=True, exist_ok=True)
    paths = [_save(draw(runs), out, name) for name, draw in FIGURES.items()]
    print(format_summary([r["summary"] for r in runs], names=[r["name"] for r in runs]))
    if len(runs) > 1:
        print()
        print(time_to_baseline(runs))
    print(f"\nplots written to {out}/:")
    for path in paths:
        print(f"  {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
