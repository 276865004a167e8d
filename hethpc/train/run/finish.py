"""Finishing a run: its summary, the same on every rank, written to ``summary.json``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hethpc import comm
from hethpc.comm import LinkStats, ReduceOp
from hethpc.train.parts.assembly import RunParts
from hethpc.train.parts.capabilities import policy_summary
from hethpc.train.report.tally import Tally
from hethpc.train.settings.config import TrainConfig


def summarize(
    cfg: TrainConfig,
    run: RunParts,
    tally: Tally,
    *,
    key: str,
    score: float | None,
    elapsed: float,
    emulated: LinkStats,
    run_dir: Path,
    val_score: float | None = None,
    also: dict[str, float] | None = None,
) -> dict[str, Any]:
    """The run's summary (a collective: the losses come from the rank that computes them).

    ``also``: scores of the metric's companions, by key (``test_acc`` beside ``test_bpb``).
    Rank 0 writes it to ``run_dir / "summary.json"``.
    """
    rank, size, total = comm.rank(), comm.size(), run.total
    done = total - tally.start
    # The policy counts only this process's steps (and BSP counts skipped steps as synced):
    # the job's own counts, carried through checkpoints, win.
    policy_figures = {
        k: v
        for k, v in policy_summary(run.policy).items()
        if k not in ("steps", "synced_steps", "sync_fraction")
    }
    # First and final (mean of the last 10) loss, from the rank that reports them.
    first_loss, last_losses = tally.first_loss, tally.last_losses
    reports = rank == run.engine.loss_rank and first_loss is not None and last_losses
    first_last = np.array(
        [float(first_loss), float(torch.stack(list(last_losses)).mean())]  # type: ignore[arg-type]
        if reports
        else [0.0, 0.0]
    )
    first_last = comm.allreduce_array(first_last, ReduceOp.SUM)
    synced, elapsed0 = tally.synced, tally.elapsed0
    summary = {
        **policy_figures,
        key: score,
        **({"val" + key.removeprefix("test"): val_score} if val_score is not None else {}),
        **(also or {}),
        "time_s": elapsed,
        "eval_s": tally.eval_s,
        "train_time_s": elapsed - tally.eval_s,
        "steps": total,
        "synced_steps": synced,
        "samples_per_s": done * cfg.batch_size / max(elapsed - elapsed0, 1e-9) if done else None,
        "sync_fraction": synced / total if total else None,
        "skipped_steps": tally.skipped,
        "first_loss": float(first_last[0]) if done else None,
        "final_loss": float(first_last[1]) if done else None,
        "final_batch_sizes": [int(s) for s in np.asarray(run.controller.batch_sizes)],
        **({"max_rank_batch": run.caps} if any(c is not None for c in run.caps or ()) else {}),
        "world_size": size,
        "transport": comm.transport(),
        **(
            {"link": cfg.link, "comm_real_s": emulated.real_s,
             "comm_emulated_wait_s": emulated.waited_s}
            if cfg.link
            else {}
        ),  # fmt: skip
        **run.engine.summary_fields(),
        "config": cfg.shared(),
    }
    if rank == 0:
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    return summary
