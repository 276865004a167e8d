"""GPipe, 1F1B, zero-bubble (ZB-H1) and ZB-V schedules as tables, checked without devices or
MPI."""

from __future__ import annotations

import pytest

from hethpc.comm.progress import auto_interval
from hethpc.pipeline import ScheduleError
from hethpc.pipeline.pipe import MPI_TAG_UB, max_micro_batches
from hethpc.pipeline.runner import tag
from hethpc.pipeline.schedule import (
    Task,
    bubble_fraction,
    chunk_in_flight,
    chunk_of,
    chunks_per_stage,
    clock,
    clock_chunks,
    gpipe_schedule,
    has_weight_passes,
    idle_fraction,
    make_schedule,
    makespan,
    one_f_one_b_schedule,
    peak_in_flight,
    stage_tasks,
    v_chunks,
    zbv_order,
    zbv_schedule,
    zero_bubble_order,
    zero_bubble_schedule,
)

SIZES = [
    pytest.param(1, 1, id="P1-m1"),
    pytest.param(1, 4, id="P1-m4"),
    pytest.param(2, 1, id="P2-m1"),
    pytest.param(2, 8, id="P2-m8"),
    pytest.param(3, 2, id="P3-m2"),
    pytest.param(4, 6, id="P4-m6"),
    pytest.param(4, 16, id="P4-m16"),
]
SCHEDULES = ["gpipe", "1f1b", "zb"]
KINDS = {"gpipe": "FB", "1f1b": "FB", "zb": "FBW"}  # the passes each stage runs


def assert_after_inputs(at: dict[tuple[int, int, str], int], chunks: int) -> None:
    """Each pass of ``at`` ((chunk, micro-batch, kind) -> tick, a stage being its own chunk in
    the one-chunk schedules) runs after its inputs: F after the previous chunk's F, B after its
    own F and the next chunk's B, W after its own B."""
    for (c, i, kind), tick in at.items():
        if kind == "F" and c > 0:
            assert tick > at[c - 1, i, "F"]
        if kind == "B":
            assert tick > at[c, i, "F"]
            if c < chunks - 1:
                assert tick > at[c + 1, i, "B"]
        if kind == "W":
            assert tick > at[c, i, "B"]


@pytest.mark.parametrize("name", SCHEDULES)
@pytest.mark.parametrize(("stages", "m"), SIZES)
def test_every_pass_runs_once_after_its_inputs(name: str, stages: int, m: int) -> None:
    table = make_schedule(name, stages, m)
    at = {(t.stage, t.micro_batch, t.kind): t.tick for t in table}
    kinds = KINDS[name]
    assert len(at) == len(table) == len(kinds) * stages * m
    assert set(at) == {(s, i, k) for s in range(stages) for i in range(m) for k in kinds}
    assert_after_inputs(at, stages)
    for s in range(stages):  # one pass per tick per stage
        ticks = [t.tick for t in stage_tasks(table, s)]
        assert len(set(ticks)) == len(ticks)
        assert has_weight_passes(table, s) is ("W" in kinds)


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("stages", "m"), SIZES)
def test_bubble_is_the_theoretical_fraction(name: str, stages: int, m: int) -> None:
    table = make_schedule(name, stages, m)
    assert makespan(table) == 2 * (m + stages - 1)
    assert idle_fraction(table) == pytest.approx(bubble_fraction(stages, m))
    assert bubble_fraction(stages, m) == pytest.approx((stages - 1) / (m + stages - 1))


@pytest.mark.parametrize(("stages", "m"), SIZES)
def test_activation_memory_gpipe_holds_all_1f1b_at_most_p(stages: int, m: int) -> None:
    gpipe = gpipe_schedule(stages, m)
    ofob = one_f_one_b_schedule(stages, m)
    for s in range(stages):
        assert peak_in_flight(gpipe, s) == m
        assert peak_in_flight(ofob, s) == min(stages - s, m)


@pytest.mark.parametrize(("stages", "m"), SIZES)
def test_zero_bubble_holds_at_most_1f1b_peak_and_idles_less(stages: int, m: int) -> None:
    zb = zero_bubble_schedule(stages, m)
    ofob = one_f_one_b_schedule(stages, m)
    ofob_peak = max(peak_in_flight(ofob, s) for s in range(stages))
    assert ofob_peak == min(stages, m)
    for s in range(stages):  # 1F1B's peak (its first stage's), on every stage
        assert peak_in_flight(zb, s) <= ofob_peak
    assert peak_in_flight(zb, 0) == peak_in_flight(ofob, 0)
    if stages == 1:
        assert idle_fraction(zb) == idle_fraction(ofob) == 0.0
    else:
        assert idle_fraction(zb) < idle_fraction(ofob)
    if m >= stages:  # ZB-H1's bubble: (P-1)(F+B-W) = P-1 ticks, a third of 1F1B's 3(P-1)
        assert makespan(zb) == 3 * m + stages - 1
        assert idle_fraction(zb) == pytest.approx((stages - 1) / (3 * m + stages - 1))


def test_zero_bubble_table_for_two_stages_and_three_micro_batches() -> None:
    # Stage 1 postpones its first W: its B passes go upstream one tick sooner each.
    assert zero_bubble_order(2, 3) == [
        [(0, "F"), (1, "F"), (0, "B"), (0, "W"), (2, "F"), (1, "B"), (1, "W"), (2, "B"),
         (2, "W")],
        [(0, "F"), (0, "B"), (1, "F"), (1, "B"), (0, "W"), (2, "F"), (2, "B"), (1, "W"),
         (2, "W")],
    ]
    assert [(t.tick, t.stage, t.micro_batch, t.kind) for t in zero_bubble_schedule(2, 3)] == [
        (0, 0, 0, "F"), (1, 0, 1, "F"), (1, 1, 0, "F"), (2, 1, 0, "B"), (3, 0, 0, "B"),
        (3, 1, 1, "F"), (4, 0, 0, "W"), (4, 1, 1, "B"), (5, 0, 2, "F"), (5, 1, 0, "W"),
        (6, 0, 1, "B"), (6, 1, 2, "F"), (7, 0, 1, "W"), (7, 1, 2, "B"), (8, 0, 2, "B"),
        (8, 1, 1, "W"), (9, 0, 2, "W"), (9, 1, 2, "W"),
    ]  # fmt: skip


def test_1f1b_table_for_two_stages_and_three_micro_batches() -> None:
    assert one_f_one_b_schedule(2, 3) == [
        Task(0, 0, 0, "F"),
        Task(1, 0, 1, "F"),
        Task(1, 1, 0, "F"),
        Task(2, 1, 0, "B"),
        Task(3, 0, 0, "B"),
        Task(3, 1, 1, "F"),
        Task(4, 0, 2, "F"),
        Task(4, 1, 1, "B"),
        Task(5, 0, 1, "B"),
        Task(5, 1, 2, "F"),
        Task(6, 1, 2, "B"),
        Task(7, 0, 2, "B"),
    ]


def test_gpipe_table_for_two_stages_and_two_micro_batches() -> None:
    assert gpipe_schedule(2, 2) == [
        Task(0, 0, 0, "F"),
        Task(1, 0, 1, "F"),
        Task(1, 1, 0, "F"),
        Task(2, 1, 1, "F"),
        Task(3, 1, 1, "B"),
        Task(4, 0, 1, "B"),
        Task(4, 1, 0, "B"),
        Task(5, 0, 0, "B"),
    ]


@pytest.mark.parametrize(
    ("orders", "match"),
    [
        pytest.param(
            [[(0, "B"), (0, "F")], [(0, "F"), (0, "B")]], "deadlock", id="backward-before-forward"
        ),
        pytest.param([[(0, "F")], [(0, "F"), (0, "B")]], "exactly once", id="missing-pass"),
        pytest.param(
            [[(0, "F"), (0, "W"), (0, "B")]], "deadlock", id="weights-before-their-backward"
        ),
        pytest.param(
            [[(0, "F"), (0, "B"), (1, "F"), (1, "B"), (0, "W")]], "exactly once",
            id="some-weight-passes",
        ),
        pytest.param([], "at least one stage", id="no-stages"),
    ],
)
def test_clock_rejects_orders_that_cannot_run(orders: list, match: str) -> None:
    with pytest.raises(ScheduleError, match=match):
        clock(orders)


@pytest.mark.parametrize(
    ("name", "stages", "m", "match"),
    [
        pytest.param("zigzag", 2, 4, "unknown schedule 'zigzag'", id="unknown"),
        pytest.param("1f1b", 0, 4, "at least one stage", id="zero-stages"),
        pytest.param("gpipe", 2, 0, "one micro-batch", id="zero-micro-batches"),
        pytest.param("zbv", 0, 4, "at least one stage", id="zbv-zero-stages"),
        pytest.param("zbv", 2, 0, "one micro-batch", id="zbv-zero-micro-batches"),
    ],
)
def test_make_schedule_errors(name: str, stages: int, m: int, match: str) -> None:
    with pytest.raises(ScheduleError, match=match):
        make_schedule(name, stages, m)


@pytest.mark.parametrize(("stages", "m"), SIZES)
def test_zbv_runs_every_pass_of_every_chunk_once_after_its_inputs(stages: int, m: int) -> None:
    table = zbv_schedule(stages, m)
    chunks = 2 * stages
    at = {(chunk_of(t), t.micro_batch, t.kind): t.tick for t in table}
    assert len(at) == len(table) == 3 * chunks * m
    assert set(at) == {(c, i, k) for c in range(chunks) for i in range(m) for k in "FBW"}
    for t in table:  # the V: stage s holds chunks s and 2P-1-s
        assert t.chunk in (t.stage, chunks - 1 - t.stage)
    assert_after_inputs(at, chunks)
    for s in range(stages):  # one pass per tick per stage, both chunks together
        ticks = [t.tick for t in stage_tasks(table, s)]
        assert len(set(ticks)) == len(ticks)
        assert has_weight_passes(table, s)


@pytest.mark.parametrize("stages", [2, 4])
@pytest.mark.parametrize("m", [4, 8, 16])
def test_zbv_idles_less_than_zero_bubble_and_holds_1f1b_peak(stages: int, m: int) -> None:
    zbv, zb = zbv_schedule(stages, m), zero_bubble_schedule(stages, m)
    assert idle_fraction(zbv) < idle_fraction(zb)
    # A chunk is half a stage: 2 * min(P, m) chunk-micro-batches are 1F1B's peak of min(P, m).
    for s in range(stages):
        assert peak_in_flight(zbv, s) <= 2 * min(stages, m)
    if m >= 2 * stages:  # with unit passes: 6m passes per stage plus P-1 idle ticks
        assert makespan(zbv) == 6 * m + stages - 1


def test_zbv_order_for_two_stages_and_four_micro_batches() -> None:
    # Stage 0 (chunks 0 and 3): three warm-up forwards of chunk 0, then F, B, W of chunk 3 twice;
    # stage 1 (chunks 1 and 2, the V's bottom): one pair of forwards first.
    assert v_chunks(2) == [0, 1, 1, 0]
    assert zbv_order(2, 4) == [
        [(0, 0, "F"), (0, 1, "F"), (0, 2, "F"), (3, 0, "F"), (3, 0, "B"), (3, 0, "W"),
         (3, 1, "F"), (3, 1, "B"), (3, 1, "W"), (0, 3, "F"), (0, 0, "B"), (0, 0, "W"),
         (3, 2, "F"), (3, 2, "B"), (3, 2, "W"), (0, 1, "B"), (0, 1, "W"), (3, 3, "F"),
         (3, 3, "B"), (3, 3, "W"), (0, 2, "B"), (0, 2, "W"), (0, 3, "B"), (0, 3, "W")],
        [(1, 0, "F"), (2, 0, "F"), (1, 1, "F"), (2, 1, "F"), (2, 0, "B"), (2, 0, "W"),
         (1, 2, "F"), (1, 0, "B"), (1, 0, "W"), (2, 2, "F"), (2, 1, "B"), (2, 1, "W"),
         (1, 3, "F"), (1, 1, "B"), (1, 1, "W"), (2, 3, "F"), (2, 2, "B"), (2, 2, "W"),
         (1, 2, "B"), (2, 3, "B"), (1, 3, "B"), (1, 2, "W"), (2, 3, "W"), (1, 3, "W")],
    ]  # fmt: skip
    assert makespan(zbv_schedule(2, 4)) == 25


def test_chunks_per_stage() -> None:
    assert [chunks_per_stage(k) for k in ("gpipe", "1f1b", "zb", "zbv")] == [1, 1, 1, 2]
    assert all(t.chunk is None for t in zero_bubble_schedule(2, 3))  # one chunk per stage
    assert chunk_of(Task(0, 1, 0, "F")) == 1 and chunk_of(Task(0, 1, 0, "F", 2)) == 2


@pytest.mark.parametrize(
    ("orders", "chunks", "match"),
    [
        pytest.param([[(0, 0, "F"), (1, 0, "F"), (1, 0, "B"), (0, 0, "B")]], [0, 0, 0],
                     "exactly once", id="missing-chunk"),
        pytest.param([[(0, 0, "F"), (0, 0, "B")]], [0, 1], "each of the 1 stages",
                     id="chunk-without-stage"),
        pytest.param([[(0, 0, "F"), (0, 0, "B")], [(0, 0, "F"), (1, 0, "B")]], [0, 1],
                     "holds chunks \\[1\\] only", id="foreign-chunk"),
        pytest.param([[(0, 0, "B"), (0, 0, "F"), (1, 0, "F"), (1, 0, "B")]], [0, 0],
                     "deadlock", id="backward-before-forward"),
        pytest.param([], [], "at least one stage", id="empty"),
    ],
)
def test_clock_chunks_rejects_orders_that_cannot_run(
    orders: list, chunks: list[int], match: str
) -> None:
    with pytest.raises(ScheduleError, match=match):
        clock_chunks(orders, chunks)


@pytest.mark.parametrize(
    ("task_s", "interval"),
    [(None, 0.0005), (0.0, 0.0005), (0.001, 0.0005), (0.035, 0.0035), (1.0, 0.01)],
    ids=["untimed", "zero", "short-pass", "512-row-pass", "long-pass"],
)
def test_auto_progress_interval_is_a_tenth_of_a_pass_within_bounds(
    task_s: float | None, interval: float
) -> None:
    assert auto_interval(task_s) == pytest.approx(interval)


@pytest.mark.parametrize("name", ["zb", "zbv"])
def test_message_tags_are_unique_and_within_mpi_bounds(name: str) -> None:
    lanes = chunks_per_stage(name)
    m = max_micro_batches(name)
    tags = {tag(i, k, lane, lanes) for i in range(m) for k in "FB" for lane in range(lanes)}
    assert len(tags) == 2 * lanes * m  # one per (micro-batch, direction, lane)
    assert 2 * max(tags) + 1 <= MPI_TAG_UB  # comm sends on tags 2t and 2t+1
    if name == "zbv":  # its limit is the tags': one more micro-batch would not fit
        assert 2 * tag(m, "B", lanes - 1, lanes) + 1 > MPI_TAG_UB
    assert [tag(i, k) for i in range(2) for k in "FB"] == [0, 1, 2, 3]  # one lane: as before


@pytest.mark.parametrize(
    ("name", "want"),
    [("gpipe", [6, 6, 6]), ("1f1b", [3, 2, 1]), ("zb", [3, 3, 3]), ("zbv", [6, 5, 4, 3, 2, 1])],
)
def test_each_chunk_holds_its_in_flight_micro_batches(name: str, want: list[int]) -> None:
    table = make_schedule(name, 3, 6)
    assert [chunk_in_flight(table, c) for c in range(len(want))] == want
    if name != "zbv":  # one chunk per stage: the stage's own peak
        assert [peak_in_flight(table, s) for s in range(3)] == want
