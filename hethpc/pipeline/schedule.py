"""Pipeline schedules as tables of (clock tick, stage, micro-batch, F/B/W): pure functions.

A schedule fixes, for every stage, the order in which it runs the forward (F) and backward (B)
pass of each micro-batch; a zero-bubble schedule splits the backward into B (the input's
gradient, which the previous stage waits for) and W (the weights' gradients, which nobody
waits for). Ticks come from simulating that order with one tick per pass: a pass starts as
soon as its stage is free and its input exists (F after the previous stage's F of the same
micro-batch, B after the next stage's B, the last stage's B after its own F, W after its own B).

The V-shaped zero-bubble schedule (``"zbv"``) cuts the model into 2P chunks, two per stage
(rank), and its table's rows name the chunk too (:attr:`Task.chunk`); the same rules hold
between chunks, and a stage still runs one pass per tick.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from hethpc.pipeline.errors import ScheduleError

FORWARD = "F"
BACKWARD = "B"  # the whole backward, or only the input's gradient where the stage has a W
WEIGHT = "W"  # the weights' gradients of a split backward


class Task(NamedTuple):
    """One row of a schedule: at ``tick``, ``stage`` runs pass ``kind`` of ``micro_batch`` (on
    its model chunk ``chunk`` where a stage holds several, as in ZB-V; None: the stage's only
    chunk, whose index is the stage's)."""

    tick: int
    stage: int
    micro_batch: int
    kind: str  # "F", "B" or "W"
    chunk: int | None = None


def chunk_of(task: Task) -> int:
    """The model chunk ``task`` runs: its ``chunk``, or its stage where it has none."""
    return task.stage if task.chunk is None else task.chunk


def _check(stages: int, micro_batches: int) -> None:
    if stages < 1 or micro_batches < 1:
        raise ScheduleError(
            f"a schedule needs at least one stage and one micro-batch, got stages={stages}, "
            f"micro_batches={micro_batches}"
        )


def _warm_up(stages: int, stage: int, micro_batches: int) -> tuple[int, list[tuple[int, str]]]:
    """1F1B's warm-up on ``stage``: ``P-1-stage`` forwards (at most m), and their passes."""
    warm = min(stages - 1 - stage, micro_batches)
    return warm, [(i, FORWARD) for i in range(warm)]


def gpipe_order(stages: int, micro_batches: int) -> list[list[tuple[int, str]]]:
    """GPipe: every stage runs all forwards, then all backwards (last micro-batch first)."""
    _check(stages, micro_batches)
    m = micro_batches
    order = [(i, FORWARD) for i in range(m)] + [(i, BACKWARD) for i in reversed(range(m))]
    return [list(order) for _ in range(stages)]


def one_f_one_b_order(stages: int, micro_batches: int) -> list[list[tuple[int, str]]]:
    """1F1B (PipeDream-Flush): ``P-1-s`` warm-up forwards on stage ``s``, then alternate.

    Stage ``s`` never holds more than ``P - s`` micro-batches of activations.
    """
    _check(stages, micro_batches)
    m = micro_batches
    out = []
    for s in range(stages):
        warm, order = _warm_up(stages, s, m)
        for i in range(m - warm):
            order += [(warm + i, FORWARD), (i, BACKWARD)]
        order += [(i, BACKWARD) for i in range(m - warm, m)]
        out.append(order)
    return out


def zero_bubble_order(stages: int, micro_batches: int) -> list[list[tuple[int, str]]]:
    """ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", arXiv 2401.10241): 1F1B with each
    backward split into B and W, stage ``s`` postponing its first ``s`` W passes.

    Stage ``s`` runs 1F1B's ``P-1-s`` warm-up forwards, then F, B and (from its ``s``-th B on)
    the oldest pending W; the postponed W passes run at the end, where 1F1B's stages wait for
    gradients. The later stages send their B passes upstream sooner, so the bubble shrinks from
    1F1B's ``(P-1)(F+B+W)`` to ``(P-1)(F+B-W)`` (with equal passes, a third). Activations live
    from F to W: every stage holds at most ``min(P, m)`` micro-batches, 1F1B's peak (that of
    its first stage; 1F1B's later stages hold fewer).
    """
    _check(stages, micro_batches)
    m = micro_batches
    out = []
    for s in range(stages):
        warm, order = _warm_up(stages, s, m)
        w = 0  # the next micro-batch whose W is pending
        for k in range(m):  # the k-th B, after the steady state's F
            if warm + k < m:
                order.append((warm + k, FORWARD))
            order.append((k, BACKWARD))
            if k >= s:
                order.append((w, WEIGHT))
                w += 1
        order += [(i, WEIGHT) for i in range(w, m)]
        out.append(order)
    return out


def clock(orders: Sequence[Sequence[tuple[int, str]]]) -> list[Task]:
    """Assign clock ticks to per-stage orders (one tick per pass) and return the table.

    Args:
        orders: ``orders[s]`` lists stage ``s``'s passes as ``(micro_batch, "F"|"B"|"W")``;
            each stage must run F and B of every micro-batch exactly once, and W of every
            micro-batch exactly once or never.

    Returns:
        Tasks sorted by (tick, stage).

    Raises:
        ScheduleError: the orders are incomplete, or they wait on each other forever.
    """
    stages = len(orders)
    if stages == 0:
        raise ScheduleError("a schedule needs at least one stage")
    m = sum(1 for _, k in orders[0] if k == FORWARD)
    plain = sorted((i, k) for i in range(m) for k in (FORWARD, BACKWARD))
    split = sorted(plain + [(i, WEIGHT) for i in range(m)])
    for s, order in enumerate(orders):
        if sorted(order) not in (plain, split):
            raise ScheduleError(
                f"stage {s} must run F and B (and W, if any) of micro-batches 0..{m - 1} "
                f"exactly once, got {order}"
            )
    done = _tick([[(s, i, k) for i, k in order] for s, order in enumerate(orders)], orders)
    return sorted(
        (Task(t, s, i, k) for (s, i, k), t in done.items()), key=lambda r: (r.tick, r.stage)
    )


def _tick(
    passes: Sequence[Sequence[tuple[int, int, str]]], shown: Sequence[Sequence[object]]
) -> dict[tuple[int, int, str], int]:
    """Simulate per-stage orders of ``(chunk, micro_batch, kind)`` passes, one pass per stage
    and tick: F of chunk ``c`` after F of ``c-1``, B after B of ``c+1`` (the last chunk's after
    its own F), W after its own B. Returns each pass's tick; ``shown`` (the orders as the caller
    gave them) names the waiting passes when the orders deadlock."""
    stages = len(passes)
    last = max((c for order in passes for c, _, _ in order), default=0)
    done: dict[tuple[int, int, str], int] = {}  # (chunk, micro_batch, kind) -> tick
    pos, free = [0] * stages, [0] * stages
    total = sum(len(order) for order in passes)
    while len(done) < total:
        progressed = False
        for s in range(stages):
            while pos[s] < len(passes[s]):
                c, i, kind = passes[s][pos[s]]
                if kind == FORWARD:
                    dep = (c - 1, i, FORWARD) if c > 0 else None
                elif kind == WEIGHT:
                    dep = (c, i, BACKWARD)
                else:
                    dep = (c + 1, i, BACKWARD) if c < last else (c, i, FORWARD)
                if dep is not None and dep not in done:
                    break
                start = max(free[s], done[dep] + 1 if dep is not None else 0)
                done[(c, i, kind)] = start
                free[s] = start + 1
                pos[s] += 1
                progressed = True
        if not progressed:
            stuck = {s: shown[s][pos[s]] for s in range(stages) if pos[s] < len(passes[s])}
            raise ScheduleError(f"the per-stage orders deadlock; stages wait at {stuck}")
    return done


def gpipe_schedule(stages: int, micro_batches: int) -> list[Task]:
    """The GPipe table: all forwards, then all backwards, on every stage."""
    return clock(gpipe_order(stages, micro_batches))


def one_f_one_b_schedule(stages: int, micro_batches: int) -> list[Task]:
    """The 1F1B table: one forward, one backward in steady state."""
    return clock(one_f_one_b_order(stages, micro_batches))


def zero_bubble_schedule(stages: int, micro_batches: int) -> list[Task]:
    """The ZB-H1 table: 1F1B with split backwards, W passes filling the bubble."""
    return clock(zero_bubble_order(stages, micro_batches))


def v_chunks(stages: int) -> list[int]:
    """The stage (rank) of each of the ``2P`` chunks of a V: chunk ``c`` runs on stage ``c``
    for ``c < P``, else on ``2P-1-c`` (stage 0 holds the first and the last chunk)."""
    return [c if c < stages else 2 * stages - 1 - c for c in range(2 * stages)]


def zbv_order(stages: int, micro_batches: int) -> list[list[tuple[int, int, str]]]:
    """ZB-V (Qi et al., "Pipeline Parallelism with Controllable Memory", arXiv 2405.15362):
    2P chunks in a V (:func:`v_chunks`), each backward split into B and W.

    Stage ``s`` holds chunk ``s`` (going down the V) and chunk ``2P-1-s`` (coming back up).
    Its warm-up runs ``2(P-s)-1`` forwards of the first, then ``s`` pairs of forwards of both,
    then ``P-s`` rounds of F, B, W of the second; the steady state alternates F, B, W of the
    first and F, B, W of the second; the cool-down runs ``s`` pairs of B passes of both, then
    B and W of the first, then the remaining W passes (torch.distributed.pipelining's
    ScheduleZBVZeroBubble builds the same order). Counts stop at ``m`` (fewer micro-batches
    than the warm-up wants shorten it).
    With passes of equal length the bubble nearly vanishes once ``m >= 2P``. Activations live
    from F to W: a stage holds at most ``2P`` chunk-micro-batches, i.e. 1F1B's peak of ``P``
    micro-batches of a whole stage (each chunk holds half a stage's layers).

    Returns:
        ``orders[s]``: stage ``s``'s passes as ``(chunk, micro_batch, "F"|"B"|"W")``.
    """
    _check(stages, micro_batches)
    return [_zbv_stage_order(stages, micro_batches, s) for s in range(stages)]


def _zbv_stage_order(stages: int, m: int, s: int) -> list[tuple[int, int, str]]:
    """Stage ``s``'s part of :func:`zbv_order`."""
    P, down, up = stages, s, 2 * stages - 1 - s
    order: list[tuple[int, int, str]] = []
    done: dict[tuple[int, str], int] = {}  # (chunk, kind) -> passes so far

    def count(c: int, kind: str) -> int:
        return done.get((c, kind), 0)

    def run(*passes: tuple[int, str]) -> None:
        for c, kind in passes:
            k = count(c, kind)
            if k < m:  # the phases' counts stop at m
                order.append((c, k, kind))
                done[c, kind] = k + 1

    for _ in range(2 * (P - s) - 1):
        run((down, FORWARD))
    for _ in range(s):
        run((up, FORWARD), (down, FORWARD))
    for _ in range(P - s):
        run((up, FORWARD), (up, BACKWARD), (up, WEIGHT))
    while count(up, FORWARD) < m:
        run((down, FORWARD), (down, BACKWARD), (down, WEIGHT))
        run((up, FORWARD), (up, BACKWARD), (up, WEIGHT))
    for _ in range(s):
        run((down, BACKWARD), (up, BACKWARD))
    while count(down, BACKWARD) < m or count(up, BACKWARD) < m:
        run((down, BACKWARD), (down, WEIGHT), (up, BACKWARD))
    for c in (up, down):
        while count(c, WEIGHT) < m:
            run((c, WEIGHT))
    return order


def clock_chunks(
    orders: Sequence[Sequence[tuple[int, int, str]]], chunks: Sequence[int]
) -> list[Task]:
    """:func:`clock` for stages holding several model chunks: one pass per stage and tick.

    Args:
        orders: ``orders[s]`` lists stage ``s``'s passes as ``(chunk, micro_batch, kind)``.
        chunks: ``chunks[c]``, the stage running chunk ``c``; chunk ``c`` takes chunk
            ``c-1``'s output and returns its input's gradient to it.

    Returns:
        Tasks (with their chunk) sorted by (tick, stage).

    Raises:
        ScheduleError: a stage runs a chunk it does not hold, the passes are incomplete, or
            the orders wait on each other forever.
    """
    stages = len(orders)
    if stages == 0 or not chunks:
        raise ScheduleError("a schedule needs at least one stage and one chunk")
    if sorted(set(chunks)) != list(range(stages)):
        raise ScheduleError(f"each of the {stages} stages must hold a chunk, got {list(chunks)}")
    m = sum(1 for c, _, k in orders[chunks[0]] if c == 0 and k == FORWARD)
    for s, order in enumerate(orders):
        mine = [c for c, st in enumerate(chunks) if st == s]
        if len(order) != sum(1 for c, _, _ in order if c in mine):
            raise ScheduleError(f"stage {s} holds chunks {mine} only, got {order}")
        for c in mine:
            runs = sorted((i, k) for cc, i, k in order if cc == c)
            plain = sorted((i, k) for i in range(m) for k in (FORWARD, BACKWARD))
            if runs not in (plain, sorted(plain + [(i, WEIGHT) for i in range(m)])):
                raise ScheduleError(
                    f"stage {s} must run F and B (and W, if any) of micro-batches 0..{m - 1} of "
                    f"chunk {c} exactly once, got {runs}"
                )
    done = _tick(orders, orders)
    return sorted(
        (Task(t, chunks[c], i, k, c) for (c, i, k), t in done.items()),
        key=lambda r: (r.tick, r.stage),
    )


def zbv_schedule(stages: int, micro_batches: int) -> list[Task]:
    """The ZB-V table: 2P chunks in a V, two per stage, split backwards filling the bubble."""
    return clock_chunks(zbv_order(stages, micro_batches), v_chunks(stages))


SCHEDULES = {"gpipe": gpipe_schedule, "1f1b": one_f_one_b_schedule, "zb": zero_bubble_schedule,
             "zbv": zbv_schedule}  # fmt: skip
V_SCHEDULES = {"zbv"}  # schedules over 2P chunks, two per stage


def chunks_per_stage(name: str) -> int:
    """Model chunks each stage holds under schedule ``name``: 2 for a V, else 1."""
    return 2 if name in V_SCHEDULES else 1


def make_schedule(name: str, stages: int, micro_batches: int) -> list[Task]:
    """The schedule called ``name`` ("gpipe", "1f1b", "zb" or "zbv").

    Raises:
        ScheduleError: unknown name or impossible sizes.
    """
    if name not in SCHEDULES:
        raise ScheduleError(f"unknown schedule {name!r}; choose one of {sorted(SCHEDULES)}")
    return SCHEDULES[name](stages, micro_batches)


def stage_tasks(table: Sequence[Task], stage: int) -> list[Task]:
    """The rows of ``stage`` (of all its chunks), in the order that stage runs them."""
    return sorted((t for t in table if t.stage == stage), key=lambda r: r.tick)


def makespan(table: Sequence[Task]) -> int:
    """Ticks from the first pass to the end of the last."""
    return max(t.tick for t in table) + 1


def idle_fraction(table: Sequence[Task]) -> float:
    """Share of stage-ticks spent waiting (the bubble), with every pass one tick long."""
    stages = 1 + max(t.stage for t in table)
    return 1.0 - len(table) / (stages * makespan(table))


def bubble_fraction(stages: int, micro_batches: int) -> float:
    """The theoretical idle fraction ``(P-1)/(m+P-1)`` of GPipe and 1F1B."""
    _check(stages, micro_batches)
    return (stages - 1) / (micro_batches + stages - 1)


def has_weight_passes(table: Sequence[Task], stage: int) -> bool:
    """Whether ``stage`` runs its backwards split into B and W."""
    return any(t.stage == stage and t.kind == WEIGHT for t in table)


def peak_in_flight(table: Sequence[Task], stage: int) -> int:
    """Most micro-batches whose forward has run on ``stage`` but not yet their backward (their
    W, where the stage splits it): those whose activations the stage holds (counted per
    chunk where the stage holds several)."""
    return _peak(table, stage, None)


def chunk_in_flight(table: Sequence[Task], chunk: int) -> int:
    """:func:`peak_in_flight` of one model chunk: the most micro-batches whose activations
    chunk ``chunk`` holds at once."""
    stage = next(t.stage for t in table if chunk_of(t) == chunk)
    return _peak(table, stage, chunk)


def _peak(table: Sequence[Task], stage: int, chunk: int | None) -> int:
    last = WEIGHT if has_weight_passes(table, stage) else BACKWARD
    live = peak = 0
    for t in stage_tasks(table, stage):
        if chunk is not None and chunk_of(t) != chunk:
            continue
        if t.kind == FORWARD:
            live += 1
        elif t.kind == last:
            live -= 1
        peak = max(peak, live)
    return peak
