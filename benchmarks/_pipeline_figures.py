"""bench_pipeline's figures from every rank's timings (plain numbers, no communication)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from hethpc.pipeline.profile import LayerProfile
from hethpc.pipeline.schedule import bubble_fraction

med = statistics.median


@dataclass
class Timings:
    """Every rank's timings combined: per round, then their medians and bounds."""

    single_r: list[float]  # per round: one rank's step (the mean rank's)
    step_r: dict[str, list[float]]  # per round and schedule: the slowest rank's step
    ratio_r: dict[str, list[float]]  # per round and schedule: single over pipeline
    single_s: float
    alone_s: float
    step_s: dict[str, float]
    best: str  # hethpc's best schedule, by its speedup
    torch_best: str | None
    over_torch: float | None
    stages: dict[str, list[dict[str, float]]]  # per schedule, per stage: its breakdown
    idle: dict[str, float]
    bound_ms: float  # the best 2-stage step the measured stage speeds allow
    single_mb_ms: float
    share: list[float]  # per stage in zb: its compute over the whole model's, per micro-batch
    peers: list[str]  # the torch.distributed.pipelining rows timed


def timings(
    all_ranks: list[dict[str, Any]], *, rounds: int, m: int, pipes: list[str], peers: list[str]
) -> Timings:
    """Combine the ranks' per-round medians (``single``, ``alone``, one list per schedule and
    ``stage_<schedule>`` breakdowns)."""
    # Per round: one rank's time is the mean rank's; the pipeline goes at its slowest rank's
    # pace. The machine's speed drifts by 10-30 % within seconds, so the speedup is the median
    # of the rounds' own ratios (single and pipeline measured seconds apart), not a ratio of
    # medians taken minutes apart.
    timed = [*pipes, *peers]
    each = range(rounds)
    single_r = [statistics.mean(d["single"][r] for d in all_ranks) for r in each]
    step_r = {s: [max(d[s][r] for d in all_ranks) for r in each] for s in timed}
    ratio_r = {s: [a / b for a, b in zip(single_r, v, strict=True)] for s, v in step_r.items()}
    single_s = med(single_r)
    # The best schedule of each side by its speedup (as above, the median of the rounds' own
    # ratios); then their ratio per round.
    best = max([s for s in ("1f1b", "gpipe", "zb", "zbv") if s in ratio_r],
               key=lambda s: med(ratio_r[s]))  # fmt: skip
    torch_best = max(peers, key=lambda s: med(ratio_r[s])) if peers else None
    over_torch = (
        med([t / h for h, t in zip(step_r[best], step_r[torch_best], strict=True)])
        if torch_best is not None else None
    )
    stages = {s: [d[f"stage_{s}"] for d in all_ranks] for s in pipes}
    # The best 2-stage step the measured stage speeds allow: the slower stage busy all along,
    # plus the other stage's first forward and last backward (P=2).
    (f0, b0), (f1, b1) = ((b["f_ms"], b["b_ms"]) for b in stages["1f1b"])
    # No schedule beats one rank by more than the whole model's time over the slowest stage's
    # (per micro-batch, as the stages computed in zb, the best table here).
    single_mb_ms = single_s / m * 1e3
    return Timings(
        single_r=single_r,
        step_r=step_r,
        ratio_r=ratio_r,
        single_s=single_s,
        alone_s=med([t for d in all_ranks for t in d["alone"]]),
        step_s={s: med(v) for s, v in step_r.items()},
        best=best,
        torch_best=torch_best,
        over_torch=over_torch,
        stages=stages,
        idle={s: statistics.mean(b["idle"] for b in stages[s]) for s in pipes},
        bound_ms=max(f0 + m * (f1 + b1) + b0, m * (f0 + b0) + f1 + b1),
        single_mb_ms=single_mb_ms,
        share=[(b["f_ms"] + b["b_ms"]) / single_mb_ms for b in stages["zb"]],
        peers=list(peers),
    )


def result(
    t: Timings,
    *,
    batch: int,
    m: int,
    balance_by: str,
    balance: list[int],
    profile: LayerProfile,
    predicted: list[float],
    run: dict[str, Any],
    memory: dict[str, list[float]],
    memory_ms: list[int],
    memory_rows: int,
) -> dict[str, object]:
    """The benchmark's JSON line. ``run``: ``progress_interval``,
    ``progress_interval_used_s``, ``mpi_single_copy``, ``device`` and ``transfers``, as they
    were."""
    B, step_s, ratio_r, stages, idle = batch, t.step_s, t.ratio_r, t.stages, t.idle
    single_sps = B / t.single_s
    alone_sps = B / t.alone_s
    pipe_sps = B / step_s["1f1b"]
    speedup = med(ratio_r["1f1b"])
    speedup_best = med(ratio_r[t.best])
    peers = t.peers
    over_torch = t.over_torch
    return {
        "stages": 2,
        "balance_by": balance_by,
        "balance": list(balance),
        "predicted_stage_ms_per_micro_batch": [round(v * 1e3, 2) for v in predicted],
        "predicted_whole_ms_per_micro_batch": round(profile.whole_s * 1e3, 2),
        "predicted_speedup_bound": round(profile.whole_s / max(predicted), 3),
        "stage_share_of_single_zb": [round(v, 3) for v in t.share],
        "speedup_bound_slowest_stage_zb": round(1 / max(t.share), 3),
        "micro_batches": m,
        "batch": B,
        **run,
        "single_rank_samples_per_s": round(single_sps, 2),
        "single_rank_alone_samples_per_s": round(alone_sps, 2),
        "two_independent_loops_samples_per_s": round(2 * single_sps, 2),
        "pipeline_samples_per_s": round(pipe_sps, 2),
        "pipeline_gpipe_samples_per_s": round(B / step_s["gpipe"], 2),
        "speedup": round(speedup, 3),
        "speedup_each_round": [round(v, 3) for v in ratio_r["1f1b"]],
        "speedup_of_medians": round(pipe_sps / single_sps, 3),
        "speedup_gpipe": round(med(ratio_r["gpipe"]), 3),
        "speedup_1f1b_unsplit_backward": round(med(ratio_r["1f1b-unsplit"]), 3),
        "pipeline_zb_samples_per_s": round(B / step_s["zb"], 2),
        "speedup_zb": round(med(ratio_r["zb"]), 3),
        "speedup_zb_each_round": [round(v, 3) for v in ratio_r["zb"]],
        "idle_fraction_zb": round(idle["zb"], 4),
        "stage_wait_ms_per_step_zb": [round(b["wait_ms"], 1) for b in stages["zb"]],
        "pipeline_zbv_samples_per_s": round(B / step_s["zbv"], 2),
        "speedup_zbv": round(med(ratio_r["zbv"]), 3),
        "speedup_zbv_each_round": [round(v, 3) for v in ratio_r["zbv"]],
        "idle_fraction_zbv": round(idle["zbv"], 4),
        "stage_wait_ms_per_step_zbv": [round(b["wait_ms"], 1) for b in stages["zbv"]],
        "hethpc_best": t.best,
        "speedup_best": round(speedup_best, 3),
        "torch_samples_per_s": {s: round(B / step_s[s], 2) for s in peers},
        "speedup_torch": {s: round(med(ratio_r[s]), 3) for s in peers},
        "torch_best": t.torch_best,
        "hethpc_best_over_torch_best": None if over_torch is None else round(over_torch, 3),
        "goal_speedup_best": 1.75,
        "goal_speedup_best_met": speedup_best >= 1.75,
        "goal_over_torch_best": 1.1,
        "goal_over_torch_best_met": None if over_torch is None else over_torch >= 1.1,
        "split_backward_gain": round(
            med([a / b for a, b in zip(t.step_r["1f1b-unsplit"], t.step_r["1f1b"], strict=True)]),
            3,
        ),
        "speedup_vs_alone": round(pipe_sps / alone_sps, 3),
        "share_of_two_loops": round(speedup / 2, 3),
        "speedup_goal": 1.6,
        "speedup_ideal": round(2 * m / (m + 1), 3),
        "speedup_bound_from_stage_speeds": round(t.single_s * 1e3 / t.bound_ms, 3),
        "stage_forward_ms_per_micro_batch": [round(b["f_ms"], 2) for b in stages["1f1b"]],
        "stage_backward_ms_per_micro_batch": [round(b["b_ms"], 2) for b in stages["1f1b"]],
        "single_ms_per_micro_batch": round(t.single_mb_ms, 2),
        "stage_wait_ms_per_step": [round(b["wait_ms"], 1) for b in stages["1f1b"]],
        "stage_idle_fraction": [round(b["idle"], 4) for b in stages["1f1b"]],
        "idle_fraction": round(idle["1f1b"], 4),
        "idle_fraction_gpipe": round(idle["gpipe"], 4),
        "idle_fraction_theory": round(bubble_fraction(2, m), 4),
        "memory_micro_batches": memory_ms,
        "memory_rows_per_micro_batch": memory_rows,
        "peak_activation_mib_1f1b": memory["1f1b"],
        "peak_activation_mib_gpipe": memory["gpipe"],
        "peak_activation_mib_zb": memory["zb"],
        "peak_activation_mib_zbv": memory["zbv"],
        "peak_1f1b_flat_in_m": len(set(memory["1f1b"])) == 1,
    }
