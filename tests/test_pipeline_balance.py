"""Cutting an nn.Sequential into stages: explicit counts, parameter balance, time balance."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from hethpc.pipeline import BalanceError
from hethpc.pipeline.balance import (
    balance_chunks,
    balance_costs,
    parse_balance,
    partition_by_counts,
    partition_by_params,
    split_model,
    stage_costs,
)
from hethpc.pipeline.profile import LayerProfile, layer_times, partition_by_time, profile_layers


@pytest.mark.parametrize(
    ("num_layers", "counts", "want"),
    [
        pytest.param(5, [2, 3], (2, 3), id="two-stages"),
        pytest.param(3, [1, 1, 1], (1, 1, 1), id="one-layer-each"),
        pytest.param(4, (4,), (4,), id="single-stage"),
    ],
)
def test_partition_by_counts(num_layers: int, counts: list[int], want: tuple[int, ...]) -> None:
    assert partition_by_counts(num_layers, counts) == want


@pytest.mark.parametrize(
    ("num_layers", "counts", "match"),
    [
        pytest.param(5, [2, 2], "covers 4 layers but the model has 5", id="too-few"),
        pytest.param(5, [3, 3], "covers 6 layers", id="too-many"),
        pytest.param(5, [5, 0], "at least one layer", id="empty-stage"),
        pytest.param(5, [], "balance is empty", id="no-stages"),
    ],
)
def test_partition_by_counts_errors(num_layers: int, counts: list[int], match: str) -> None:
    with pytest.raises(BalanceError, match=match):
        partition_by_counts(num_layers, counts)


@pytest.mark.parametrize(
    ("costs", "stages", "want"),
    [
        pytest.param([1, 1, 1, 1], 2, (2, 2), id="even"),
        pytest.param([4, 1, 1, 1, 1], 2, (1, 4), id="heavy-first"),
        pytest.param([1, 2, 3, 4, 5, 6, 7, 8, 9], 3, (5, 2, 2), id="increasing"),
        pytest.param([5, 5, 5], 3, (1, 1, 1), id="one-each"),
        pytest.param([0, 0, 10, 0], 2, (1, 3), id="zeros-earliest-cut"),
        pytest.param([3, 1, 2], 1, (3,), id="one-stage"),
    ],
)
def test_balance_costs_minimises_the_slowest_stage(
    costs: list[float], stages: int, want: tuple[int, ...]
) -> None:
    got = balance_costs(costs, stages)
    assert got == want
    assert sum(got) == len(costs)


def _brute_force_best(costs: list[int], stages: int) -> int:
    import itertools

    n = len(costs)
    best = None
    for cuts in itertools.combinations(range(1, n), stages - 1):
        bounds = (0, *cuts, n)
        worst = max(sum(costs[bounds[k] : bounds[k + 1]]) for k in range(stages))
        best = worst if best is None else min(best, worst)
    assert best is not None
    return best


@pytest.mark.parametrize("seed", range(5))
def test_balance_costs_is_optimal_against_brute_force(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    costs = torch.randint(0, 20, (8,), generator=g).tolist()
    for stages in (2, 3, 4):
        balance = balance_costs(costs, stages)
        starts = [sum(balance[:k]) for k in range(stages)]
        worst = max(sum(costs[s : s + b]) for s, b in zip(starts, balance, strict=True))
        assert worst == _brute_force_best(costs, stages)


@pytest.mark.parametrize(
    ("costs", "stages", "match"),
    [
        pytest.param([1, 2], 3, "cannot cut 2 layers into 3 stages", id="too-many-stages"),
        pytest.param([1, 2], 0, "at least 1", id="zero-stages"),
        pytest.param([1, -2], 2, "non-negative", id="negative-cost"),
    ],
)
def test_balance_costs_errors(costs: list[float], stages: int, match: str) -> None:
    with pytest.raises(BalanceError, match=match):
        balance_costs(costs, stages)


# Layer costs as on a stage after the first (every layer computes its input's gradient), as
# on the first stage (the data needs none), and the last stage's loss.
@pytest.mark.parametrize(
    ("costs", "first", "extra", "stages", "want"),
    [
        pytest.param([3, 3, 3], None, 0, 2, (1, 2), id="tie-earliest-cut"),
        pytest.param([3, 3, 3], [1, 3, 3], 0, 2, (2, 1), id="first-stage-saves"),
        pytest.param([2, 2, 2, 2], None, 3, 2, (3, 1), id="loss-on-the-last"),
        pytest.param([2, 2, 2, 2], None, 3, 1, (4,), id="one-stage-has-the-loss"),
        # two blocks of (Linear 3, ReLU 0.1) per half; the first Linear needs no input
        # gradient (2); the loss 0.3: the even cut still wins, 5.2 | 6.5
        pytest.param([3, 0.1] * 4, [2, 0.1] + [3, 0.1] * 3, 0.3, 2, (4, 4), id="bench-like"),
        pytest.param([3, 0.1] * 4, [2, 0.1] + [3, 0.1] * 3, 3.0, 2, (5, 3), id="heavy-loss"),
    ],
)
def test_balance_costs_counts_the_first_and_last_stage(
    costs: list[float],
    first: list[float] | None,
    extra: float,
    stages: int,
    want: tuple[int, ...],
) -> None:
    assert balance_costs(costs, stages, first_costs=first, last_extra=extra) == want


@pytest.mark.parametrize(
    ("balance", "want"),
    [
        pytest.param((4, 4), [5.2, 6.5], id="even"),
        pytest.param((5, 3), [8.2, 3.5], id="heavy-first"),
        pytest.param((8,), [11.7], id="whole"),
    ],
)
def test_stage_costs(balance: tuple[int, ...], want: list[float]) -> None:
    got = stage_costs([3, 0.1] * 4, balance, first_costs=[2, 0.1] + [3, 0.1] * 3, last_extra=0.3)
    assert got == pytest.approx(want)


@pytest.mark.parametrize("seed", range(5))
def test_balance_costs_with_first_and_last_is_optimal(seed: int) -> None:
    import itertools

    g = torch.Generator().manual_seed(seed)
    costs = torch.randint(1, 20, (7,), generator=g).tolist()
    first = [c - int(torch.randint(0, c + 1, (), generator=g)) for c in costs]
    extra = float(torch.randint(0, 30, (), generator=g))
    for stages in (1, 2, 3):
        got = balance_costs(costs, stages, first_costs=first, last_extra=extra)
        best = min(
            max(stage_costs(costs, b, first_costs=first, last_extra=extra))
            for cuts in itertools.combinations(range(1, 7), stages - 1)
            for b in [tuple(e - s for s, e in zip((0, *cuts), (*cuts, 7), strict=True))]
        )
        assert max(stage_costs(costs, got, first_costs=first, last_extra=extra)) == best


@pytest.mark.parametrize(
    ("first", "extra", "match"),
    [
        pytest.param([1, 1], 0, "first_costs has 2 entries but there are 3 layers", id="length"),
        pytest.param([1, -1, 1], 0, "non-negative", id="negative-first"),
        pytest.param(None, -1, "last_extra -1", id="negative-loss"),
    ],
)
def test_balance_costs_first_and_last_errors(
    first: list[float] | None, extra: float, match: str
) -> None:
    with pytest.raises(BalanceError, match=match):
        balance_costs([1, 1, 1], 2, first_costs=first, last_extra=extra)


def test_layer_profile_balances_by_its_costs() -> None:
    profile = LayerProfile((3, 0.1) * 4, (2, 0.1) + (3, 0.1) * 3, 0.3)
    assert profile.balance(2) == (4, 4)
    assert profile.stage_s((4, 4)) == pytest.approx([5.2, 6.5])
    assert profile.whole_s == pytest.approx(11.7)


def test_every_stage_gets_a_layer_with_parameters_when_there_are_enough() -> None:
    # Linear, ReLU, Linear, ReLU: the ReLUs timed as dear as the Linears (noise on a tiny
    # model) would give the last stage a ReLU alone, with nothing to train.
    costs, holds = [1.0, 1.0, 1.0, 3.0], [True, False, True, False]
    assert balance_costs(costs, 2) == (3, 1)
    assert balance_costs(costs, 2, holds=holds) == (2, 2)
    profile = LayerProfile(tuple(costs), tuple(costs), 0.0, tuple(holds))
    assert profile.balance(2) == (2, 2)
    # fewer layers with parameters than stages: the cheapest split, as without the flags
    assert balance_costs(costs, 3, holds=holds) == balance_costs(costs, 3)
    with pytest.raises(BalanceError, match="one flag per layer"):
        balance_costs(costs, 2, holds=[True])


def _model() -> nn.Sequential:
    # parameters per layer: 110, 0, 1100, 0, 202
    return nn.Sequential(
        nn.Linear(10, 10), nn.ReLU(), nn.Linear(10, 100), nn.ReLU(), nn.Linear(100, 2)
    )


def test_partition_by_params() -> None:
    assert partition_by_params(_model(), 2) == (3, 2)  # 1210 | 202 beats 110 | 1302
    assert partition_by_params(_model(), 3) == (1, 2, 2)  # 110 | 1100 | 202, earliest cuts


def test_partition_by_time_isolates_the_slow_layer() -> None:
    # The last layer costs ~100x the others together: it gets a stage of its own.
    model = nn.Sequential(
        nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 768), nn.Linear(768, 768)
    )
    sample = torch.randn(64, 8)
    times = layer_times(model, sample, repeats=2)
    assert len(times) == 5 and all(t > 0 for t in times)
    assert all(p.grad is None for p in model.parameters()), "timing must not leave gradients"
    assert partition_by_time(model, 2, sample, repeats=3) == (4, 1)


def test_profile_layers_measures_each_way_a_stage_runs_a_layer() -> None:
    # ReLU first: up to and including the first Linear, the first stage computes no input
    # gradient, so those two layers are timed both ways; the others once (copied).
    model = nn.Sequential(nn.ReLU(), nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 4))
    x, y = torch.randn(32, 16), torch.randint(0, 4, (32,))
    profile = profile_layers(model, x, target=y, loss_fn=nn.functional.cross_entropy, repeats=2)
    assert len(profile.layer_s) == len(profile.first_stage_s) == 4
    assert all(t > 0 for t in profile.layer_s + profile.first_stage_s)
    assert profile.first_stage_s[2:] == profile.layer_s[2:]
    assert profile.loss_s > 0
    assert profile.whole_s == pytest.approx(sum(profile.first_stage_s) + profile.loss_s)
    assert all(p.grad is None for p in model.parameters()), "timing must not leave gradients"
    assert all(p.device.type == "cpu" for p in model.parameters())
    assert profile_layers(model, x, repeats=1).loss_s == 0.0  # no loss_fn: not counted


def test_split_model_shares_layers_in_order() -> None:
    model = _model()
    stages = split_model(model, [2, 3])
    assert [len(s) for s in stages] == [2, 3]
    assert stages[1][0] is model[2]
    x = torch.randn(4, 10)
    torch.testing.assert_close(stages[1](stages[0](x)), model(x))


def test_split_model_rejects_a_bad_balance() -> None:
    with pytest.raises(BalanceError, match="covers 4 layers but the model has 5"):
        split_model(_model(), [2, 2])


def test_a_chunk_on_a_slower_rank_gets_fewer_layers() -> None:
    even = [1.0] * 8
    assert balance_chunks([even, even]) == (4, 4)
    assert balance_chunks([even, [2.0] * 8]) == (5, 3)  # stage 1 twice as slow: 5 vs 3 x 2
    assert balance_chunks([[3.0] * 8, even]) == (2, 6)
    # the first chunk's own costs (no input gradient) and the loss on the last still count
    assert balance_chunks([even, even], first_costs=[0.5] * 8, last_extra=2.0) == (7, 1)
    with pytest.raises(BalanceError, match=r"one cost per layer \(8\), got \[8, 7\]"):
        balance_chunks([even, even[:7]])


def test_stalls_stretch_a_ranks_profile_by_mean_over_median() -> None:
    from hethpc.pipeline import profile

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))
    factor = profile._stall_factor(model, torch.randn(16, 8))
    assert factor >= 1.0 and math.isfinite(factor)  # 1 where nothing stalls the passes
    assert all(p.grad is None for p in model.parameters())
    p = LayerProfile((1.0, 2.0), (0.5, 2.0), 0.25, (True, True))
    assert profile._stretched(p, 2.0) == LayerProfile((2.0, 4.0), (1.0, 4.0), 0.5, (True, True))


def test_a_chunk_whose_ranks_lack_memory_gets_the_layers_that_fit() -> None:
    even = [1.0] * 8
    mem = [[10.0] * 8, [10.0] * 8]
    assert balance_chunks([even, even], memory=mem, limits=[None, None]) == (4, 4)
    # chunk 0's ranks hold 30 bytes of layers: 3 of them, though its time allows 4
    assert balance_chunks([even, even], memory=mem, limits=[30.0, None]) == (3, 5)
    # memory binds the faster rank below its time share: slowest chunk 5 layers x 1.0 = 5
    assert balance_chunks([even, [0.5] * 8], memory=mem, limits=[None, 20.0]) == (6, 2)
    # a chunk's own bytes differ (more activations in flight on chunk 0 under 1F1B)
    assert balance_chunks([even, even], memory=[[20.0] * 8, [5.0] * 8],
                          limits=[60.0, 60.0]) == (3, 5)  # fmt: skip
    # whatever the memory, it is a cut: every layer on one chunk, in order
    for lim in (40.0, 50.0, 70.0):
        got = balance_chunks([even, even], memory=mem, limits=[lim, lim])
        assert sum(got) == 8 and all(10.0 * c <= lim for c in got)


@pytest.mark.parametrize(
    ("limits", "match"),
    [
        pytest.param([5.0, None], r"layer 0 alone needs 0.0 MiB on chunk 0", id="one-layer"),
        pytest.param([30.0, 30.0], r"need about 0.0 MiB in all and the limited chunks \[0, 1\]",
                     id="the-whole"),  # fmt: skip
    ],
)
def test_no_cut_within_memory_is_one_message_with_the_fix(
    limits: list[float | None], match: str
) -> None:
    with pytest.raises(BalanceError, match=match + ".*give more micro-batches"):
        balance_chunks([[1.0] * 8] * 2, memory=[[10.0] * 8] * 2, limits=limits)
    with pytest.raises(BalanceError, match=r"one vector of 8 layer bytes per chunk"):
        balance_chunks([[1.0] * 8] * 2, memory=[[10.0] * 7] * 2, limits=[None, None])


def test_the_profile_counts_each_layers_activations_and_parameters() -> None:
    from hethpc.pipeline.profile import layer_memory

    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
    profile = profile_layers(model, torch.randn(32, 16), repeats=1)
    # a Linear keeps its input (32 x 16 floats), a ReLU its output (32 x 64), the last Linear
    # its input (32 x 64); parameters are not activations
    assert profile.saved_bytes == (32 * 16 * 4, 32 * 64 * 4, 32 * 64 * 4)
    assert profile.param_bytes == ((16 * 64 + 64) * 4, 0, (64 * 4 + 4) * 4)
    twice = profile_layers(model, torch.randn(64, 16), repeats=1).saved_bytes
    assert twice == tuple(2 * b for b in profile.saved_bytes)  # per micro-batch: by its rows
    assert layer_memory(profile, 3, 4.0) == tuple(
        3 * a + 4 * p for a, p in zip(profile.saved_bytes, profile.param_bytes, strict=True))


@pytest.mark.parametrize(
    ("text", "want"),
    [("params", "params"), (" TIME ", "time"), ("14,12", (14, 12)), ("3, 4, 5", (3, 4, 5))],
)
def test_parse_balance(text: str, want: object) -> None:
    assert parse_balance(text) == want


@pytest.mark.parametrize("text", ["", "speed", "14,", "0,26", "1.5,2", "-1,3"])
def test_parse_balance_refuses_the_rest(text: str) -> None:
    with pytest.raises(ValueError, match="is not params, time or the layers per chunk"):
        parse_balance(text)
