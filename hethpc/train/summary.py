"""The end-of-run summary: what a user wants to know about a run, as a table."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

ROWS = (
    ("test_acc", "test accuracy (averaged model)", lambda v: f"{100 * v:.2f} %"),
    ("val_acc", "validation accuracy", lambda v: f"{100 * v:.2f} %"),
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
    ("world_size", "ranks", str),
)


def format_summary(summaries: Sequence[dict[str, Any]], names: Sequence[str] | None = None) -> str:
    """A plain-text table: one row per figure, one column per run."""
    names = (
        list(names)
        if names is not None
        else [s.get("name", f"run {k}") for k, s in enumerate(summaries)]
    )
    rows = [["", *names]]
    for key, label, fmt in ROWS:
        if not any(key in s for s in summaries):
            continue
        rows.append([label, *(fmt(s[key]) if s.get(key) is not None else "-" for s in summaries)])
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def time_to_target(curve: list[tuple[float, float]], target: float) -> float | None:
    """When an accuracy curve ``[(seconds, accuracy), ...]`` first reaches ``target``.

    Linear between its points (from ``(0, 0)``); None when it never does.
    """
    prev_t, prev_a = 0.0, 0.0
    for t, a in curve:
        if a >= target:
            if a == prev_a:
                return t
            return prev_t + (t - prev_t) * (target - prev_a) / (a - prev_a)
        prev_t, prev_a = t, a
    return None
