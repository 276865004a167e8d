"""The end-of-run summary: what a user wants to know about a run, as a table."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from hethpc.batching.memory_cap import describe_caps

Row = tuple[str, str, Callable[[Any], str]]

# The scores, as the summary names them: ``test_<metric>`` and, with a validation split,
# ``val_<metric>``; a metric not named here gets a row of its own (see ``format_summary``).
SCORE_ROWS: tuple[Row, ...] = (
    ("test_bpb", "test bits per byte (averaged model)", lambda v: f"{v:.3f}"),
    ("test_acc", "test accuracy (averaged model)", lambda v: f"{100 * v:.2f} %"),
    ("test_mse", "test MSE (averaged model)", lambda v: f"{v:.4g}"),
    ("val_bpb", "validation bits per byte", lambda v: f"{v:.3f}"),
    ("val_acc", "validation accuracy", lambda v: f"{100 * v:.2f} %"),
    ("val_mse", "validation MSE", lambda v: f"{v:.4g}"),
)
ROWS: tuple[Row, ...] = (
    ("time_s", "training time", lambda v: f"{v:.1f} s"),
    ("eval_s", "of which evaluating", lambda v: f"{v:.1f} s"),
    ("steps", "steps", str),
    ("samples_per_s", "throughput", lambda v: f"{v:,.0f} samples/s"),
    ("sync_fraction", "steps synchronised", lambda v: f"{100 * v:.1f} %"),
    ("warmup_syncs", "syncs in the warm-up (selsync)", str),
    ("voted_syncs", "syncs voted for (selsync)", str),
    ("forced_syncs", "syncs forced by the bound (selsync)", str),
    ("skipped_steps", "steps skipped (non-finite)", str),
    ("max_clock_gap", "largest lead over the slowest (ssp)", lambda v: f"{v} steps"),
    ("final_batch_sizes", "final batch sizes per rank", lambda v: " / ".join(map(str, v))),
    ("max_rank_batch", "most samples per pass per rank", describe_caps),
    ("world_size", "ranks", str),
    ("pipeline_stages", "pipeline stages", str),
    ("replicas", "pipeline replicas", str),
    ("chunk_memory_mib", "memory per pipeline chunk (of its limit)",
     lambda v: " / ".join(f"{n:.0f}" + ("" if m is None else f" of {m:.0f}") + " MiB"
                          for n, m in v)),
)


def _other_scores(summaries: Sequence[dict[str, Any]]) -> list[Row]:
    """Rows for the scores of a user's own metric (``test_mae``), which SCORE_ROWS lacks."""
    known = {key for key, _, _ in SCORE_ROWS}
    keys = {
        k
        for s in summaries
        for k, v in s.items()
        if k.startswith(("test_", "val_")) and k not in known
        and isinstance(v, (int, float)) and not isinstance(v, bool)
    }  # fmt: skip
    rows: list[Row] = []
    for key in sorted(keys, key=lambda k: (k.startswith("val_"), k)):
        split, _, name = key.partition("_")
        label = f"validation {name}" if split == "val" else f"test {name} (averaged model)"
        rows.append((key, label, lambda v: f"{v:.4g}"))
    return rows


def _batch_sizes_label(summaries: Sequence[dict[str, Any]]) -> str:
    """A pipeline's batch controller splits the batch among replicas, not ranks."""
    pipelines = [s.get("pipeline_stages", 1) > 1 for s in summaries if "final_batch_sizes" in s]
    if pipelines and all(pipelines):
        return "final batch sizes per replica"
    if any(pipelines):
        return "final batch sizes per rank (pipelines: per replica)"
    return "final batch sizes per rank"


def format_summary(summaries: Sequence[dict[str, Any]], names: Sequence[str] | None = None) -> str:
    """A plain-text table: one row per figure, one column per run."""
    names = (
        list(names)
        if names is not None
        else [s.get("name", f"run {k}") for k, s in enumerate(summaries)]
    )
    rows = [["", *names]]
    for key, label, fmt in (*SCORE_ROWS, *_other_scores(summaries), *ROWS):
        if not any(key in s for s in summaries):
            continue
        if key == "final_batch_sizes":
            label = _batch_sizes_label(summaries)
        rows.append([label, *(fmt(s[key]) if s.get(key) is not None else "-" for s in summaries)])
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def time_to_target(
    curve: list[tuple[float, float]], target: float, *, lower_is_better: bool = False
) -> float | None:
    """When a score curve ``[(seconds, score), ...]`` first reaches ``target``.

    Linear between its points; None when it never does. An accuracy (higher is better) starts
    from ``(0, 0)``. With ``lower_is_better`` (an error such as MSE) the curve is at or below
    ``target`` to reach it, and starts at its first point: there is no score at 0 s to draw
    from, so a first evaluation already there counts at its own time.
    """
    sign = -1.0 if lower_is_better else 1.0
    goal = sign * target
    prev: tuple[float, float] | None = None if lower_is_better else (0.0, 0.0)
    for t, score in curve:
        a = sign * score
        if a >= goal:
            if prev is None or a == prev[1]:
                return t
            prev_t, prev_a = prev
            return prev_t + (t - prev_t) * (goal - prev_a) / (a - prev_a)
        prev = (t, a)
    return None
