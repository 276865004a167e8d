"""SelSync's significance tracking as plain math: norms, EWMA, relative change, votes."""

from __future__ import annotations

import math

import pytest
import torch

from hethpc.sync.significance import SignificanceTracker, gradient_norm, relative_change

NAN, INF = math.nan, math.inf


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-12)


def test_ewma_delta_and_votes_closed_form() -> None:
    # The literal step-to-step criterion, delta = |S_t - S_(t-1)| / S_(t-1).
    # window 3: a = 2 / (3 + 1) = 0.5; warm-up covers the first three observations.
    t = SignificanceTracker(threshold=0.3, window=3, criterion="previous")
    norms = [2.0, 4.0, 4.0, 4.0, 10.0, 10.0]
    smoothed = [2.0, 3.0, 3.5, 3.75, 6.875, 8.4375]
    deltas = [NAN, 0.5, 0.5 / 3.0, 0.25 / 3.5, 3.125 / 3.75, 1.5625 / 6.875]
    votes = [True, True, True, False, True, False]
    for k, g in enumerate(norms):
        s = t.update(g)
        assert s.norm == g
        assert s.smoothed == pytest.approx(smoothed[k])
        assert _same(s.delta, deltas[k]), (k, s.delta)
        assert s.warmup == (k < 3)
        assert s.vote == votes[k], k
    assert t.count == 6 and t.smoothed == pytest.approx(8.4375)


# window 3 (a = 0.5): a step to 4, a plateau, a jump to 10. S_t for these norms:
STEP_NORMS = [2.0, 4.0, 4.0, 4.0, 4.0, 4.0, 4.0, 10.0, 10.0]
STEP_S = [2.0, 3.0, 3.5, 3.75, 3.875, 3.9375, 3.96875, 6.984375, 8.4921875]


@pytest.mark.parametrize(
    ("criterion", "deltas", "votes"),
    [
        (
            # |S_t - S_(t-3)| / S_(t-3); fewer than 3 steps behind: the oldest S (S_1).
            "window",
            [
                NAN,
                0.5,
                0.75,
                0.875,
                0.875 / 3,
                0.4375 / 3.5,
                0.21875 / 3.75,
                3.109375 / 3.875,
                4.5546875 / 3.9375,
            ],
            [True, True, True, True, False, False, False, True, True],
        ),
        (
            # |S_t - S_ref| / S_ref, S_ref = S at the last SYNC (every yes vote syncs here).
            "last_sync",
            [
                0.0,
                0.5,
                0.5 / 3,
                0.25 / 3.5,
                0.375 / 3.5,
                0.4375 / 3.5,
                0.46875 / 3.5,
                3.484375 / 3.5,
                1.5078125 / 6.984375,
            ],
            [True, True, True, False, False, False, False, True, False],
        ),
        (
            "previous",
            [
                NAN,
                0.5,
                0.5 / 3,
                0.25 / 3.5,
                0.125 / 3.75,
                0.0625 / 3.875,
                0.03125 / 3.9375,
                3.015625 / 3.96875,
                1.5078125 / 6.984375,
            ],
            [True, True, True, False, False, False, False, True, False],
        ),
    ],
    ids=["window", "last-sync", "previous"],
)
def test_criteria_closed_form(criterion: str, deltas: list[float], votes: list[bool]) -> None:
    t = SignificanceTracker(threshold=0.3, window=3, criterion=criterion)  # type: ignore[arg-type]
    for k, g in enumerate(STEP_NORMS):
        s = t.update(g)
        if s.vote:
            t.synced()  # as the policy does when any rank votes yes
        assert s.smoothed == pytest.approx(STEP_S[k]), k
        assert _same(s.delta, deltas[k]), (k, s.delta, deltas[k])
        assert s.vote == votes[k], k


@pytest.mark.parametrize(
    ("criterion", "votes"),
    [
        ("previous", [True, False, False, False, False]),
        ("window", [True, False, False, False, False]),
        ("last_sync", [True, False, False, True, False]),
    ],
    ids=["previous", "window", "last-sync"],
)
def test_slow_drift_counts_only_since_the_last_sync(criterion: str, votes: list[bool]) -> None:
    # window 1: S_t = g_t. A slow decline never changes 30 % in one step (or one window), but
    # it drifts 40 % from the value the replicas agreed on at the warm-up sync.
    t = SignificanceTracker(threshold=0.3, window=1, criterion=criterion)  # type: ignore[arg-type]
    got = []
    for g in [1.0, 0.9, 0.8, 0.6, 0.5]:
        got.append(t.update(g).vote)
        if got[-1]:
            t.synced()
    assert got == votes


def test_last_sync_reference_moves_only_on_sync() -> None:
    t = SignificanceTracker(threshold=0.3, window=1, criterion="last_sync")
    t.update(1.0)  # the first S is the reference until a sync
    assert t.update(1.5).delta == pytest.approx(0.5)
    assert t.update(1.5).delta == pytest.approx(0.5)  # no sync yet: still against 1.0
    t.synced()
    assert t.update(1.5).delta == 0.0


def test_default_window_and_threshold() -> None:
    t = SignificanceTracker()
    assert (t.threshold, t.window, t.alpha, t.criterion) == (0.3, 25, 2 / 26, "last_sync")
    out = [t.update(1.0) for _ in range(30)]
    assert [s.vote for s in out] == [True] * 25 + [False] * 5
    assert all(s.warmup for s in out[:25]) and not any(s.warmup for s in out[25:])


@pytest.mark.parametrize(
    ("previous", "current", "expected"),
    [
        (None, 1.0, NAN),
        (0.0, 0.0, 0.0),
        (0.0, 1e-30, INF),
        (2.0, 1.0, 0.5),
        (2.0, 3.0, 0.5),
        (4.0, 4.0, 0.0),
    ],
    ids=["first", "zero-to-zero", "zero-to-positive", "halved", "grew", "unchanged"],
)
def test_relative_change(previous: float | None, current: float, expected: float) -> None:
    assert _same(relative_change(previous, current), expected)


ALL = ["window", "last_sync", "previous"]


@pytest.mark.parametrize("criterion", ALL)
def test_zero_gradients_after_warmup_do_not_vote(criterion: str) -> None:
    t = SignificanceTracker(threshold=0.3, window=1, criterion=criterion)  # type: ignore[arg-type]
    assert t.update(0.0).vote  # warm-up
    s = t.update(0.0)
    assert (s.delta, s.vote) == (0.0, False)
    s = t.update(1.0)  # from a zero denominator: infinitely significant
    assert (s.delta, s.vote) == (INF, True)


@pytest.mark.parametrize("criterion", ALL)
@pytest.mark.parametrize("bad", [INF, NAN], ids=["inf", "nan"])
def test_non_finite_norm_votes_yes_and_leaves_the_ewma_finite(bad: float, criterion: str) -> None:
    t = SignificanceTracker(threshold=0.3, window=1, criterion=criterion)  # type: ignore[arg-type]
    t.update(2.0)
    s = t.update(bad)
    assert s.vote and s.delta == INF and s.smoothed == 2.0
    assert t.smoothed == 2.0 and t.count == 2
    s = t.update(2.0)  # judged against the last finite history
    assert (s.smoothed, s.delta, s.vote) == (2.0, 0.0, False)


@pytest.mark.parametrize(
    ("criterion", "delta"), [("window", NAN), ("previous", NAN), ("last_sync", 0.0)]
)
def test_non_finite_first_norm(criterion: str, delta: float) -> None:
    t = SignificanceTracker(threshold=0.3, window=1, criterion=criterion)  # type: ignore[arg-type]
    s = t.update(NAN)
    assert s.vote and math.isnan(s.smoothed) and math.isnan(t.smoothed)
    t.synced()  # nothing to take as the reference yet
    s = t.update(3.0)
    assert s.smoothed == 3.0 and _same(s.delta, delta) and not s.vote


def test_threshold_zero_always_votes() -> None:
    t = SignificanceTracker(threshold=0.0, window=1)
    assert all(t.update(1.0).vote for _ in range(10))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"threshold": -0.1}, "threshold must be a finite number >= 0"),
        ({"threshold": INF}, "threshold must be a finite number >= 0"),
        ({"window": 0}, "window must be an integer >= 1"),
        ({"window": 2.5}, "window must be an integer >= 1"),
        ({"window": True}, "window must be an integer >= 1"),
        ({"criterion": "norm"}, "criterion must be one of"),
    ],
    ids=[
        "negative-threshold",
        "inf-threshold",
        "zero-window",
        "fractional-window",
        "bool-window",
        "criterion",
    ],
)
def test_bad_settings(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SignificanceTracker(**kwargs)  # type: ignore[arg-type]


def test_negative_norm_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot be negative"):
        SignificanceTracker().update(-1.0)


CRITERIA = ["window", "last_sync", "previous", "delta", "delta_mean"]


@pytest.mark.parametrize("criterion", CRITERIA)
@pytest.mark.parametrize("cut", [2, 6, 9], ids=["in-warmup", "mid", "late"])
def test_state_dict_resumes_identically(criterion: str, cut: int) -> None:
    norms = [1.0, 1.2, 0.9, 1.1, 3.0, 3.1, 0.5, 0.6, 0.6, 2.0, 2.0, 0.1, INF, 0.1, 0.12]

    def run(t: SignificanceTracker, gs: list[float]) -> list[tuple[bool, bool, float, float]]:
        out = []
        for g in gs:
            s = t.update(g)
            if s.vote:
                t.synced()
            out.append((s.vote, s.warmup, s.smoothed, s.delta))
        return out

    def make() -> SignificanceTracker:
        return SignificanceTracker(threshold=0.3, window=4, criterion=criterion)  # type: ignore[arg-type]

    expected = run(make(), norms)
    first = make()
    got = run(first, norms[:cut])
    resumed = make()
    resumed.load_state_dict(first.state_dict())
    got += run(resumed, norms[cut:])
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        assert a[:2] == b[:2] and _same(a[2], b[2]) and _same(a[3], b[3])


def _saved(**changes: object) -> dict[str, object]:
    t = SignificanceTracker(threshold=0.3, window=4)
    for g in [1.0, 2.0, 3.0]:
        t.update(g)
    return {**t.state_dict(), **changes}


@pytest.mark.parametrize(
    ("state", "match"),
    [
        (_saved(threshold=0.5), "saved with threshold=0.5"),
        (_saved(window=25), "window=25"),
        (_saved(criterion="previous"), "criterion='previous'"),
        (_saved(count=-1), "corrupt"),
        (_saved(smoothed=NAN), "corrupt"),
        (_saved(reference=-1.0), "corrupt"),
        (_saved(history=[1.0]), "corrupt"),
        (_saved(history=[None, 1.0, INF]), "corrupt"),
    ],
    ids=[
        "other-threshold",
        "other-window",
        "other-criterion",
        "negative-count",
        "nan-smoothed",
        "negative-reference",
        "short-history",
        "inf-history",
    ],
)
def test_load_state_dict_refuses(state: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SignificanceTracker(threshold=0.3, window=4).load_state_dict(state)


def _params(*grads: list[float] | None) -> list[torch.nn.Parameter]:
    out = []
    for g in grads:
        p = torch.nn.Parameter(torch.zeros(2 if g is None else len(g)))
        p.grad = None if g is None else torch.tensor(g)
        out.append(p)
    return out


@pytest.mark.parametrize(
    ("grads", "kind", "expected"),
    [
        (([3.0, 4.0], [12.0]), "global", 13.0),
        (([3.0, 4.0], [12.0]), "layer_sum", 17.0),
        (([3.0, 4.0], None), "global", 5.0),
        ((None,), "global", 0.0),
        (([1.0, INF],), "global", INF),
    ],
    ids=["global", "layer-sum", "skips-missing-grad", "no-grads", "inf"],
)
def test_gradient_norm(grads: tuple[list[float] | None, ...], kind: str, expected: float) -> None:
    assert gradient_norm(_params(*grads), kind=kind) == expected  # type: ignore[arg-type]


def test_gradient_norm_refuses_unknown_kind() -> None:
    with pytest.raises(ValueError, match="norm kind must be one of"):
        gradient_norm(_params([1.0]), kind="max")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("criterion", "deltas", "votes"),
    [
        (
            # EWMA of r (a = 0.5): r = 0.5, 0, 0, 1, inf (not folded), 0.
            "delta",
            [NAN, 0.5, 0.25, 0.125, 0.5625, INF, 0.28125],
            [True, True, True, False, True, True, False],
        ),
        (
            # mean of the last 3 values of r.
            "delta_mean",
            [NAN, 0.5, 0.25, 0.5 / 3, 1 / 3, INF, 1 / 3],
            [True, True, True, False, True, True, True],
        ),
    ],
    ids=["delta", "delta-mean"],
)
def test_smoothed_change_closed_form(
    criterion: str, deltas: list[float], votes: list[bool]
) -> None:
    # The published code's order: r_t = |g_t - g_(t-1)| / g_(t-1) is smoothed, not the norm;
    # window 3 and three warm-up steps. g = 0 makes the next r infinite: yes, not folded.
    t = SignificanceTracker(threshold=0.3, window=3, criterion=criterion)  # type: ignore[arg-type]
    for k, g in enumerate([2.0, 3.0, 3.0, 3.0, 0.0, 1.0, 1.0]):
        s = t.update(g)
        assert _same(s.delta, deltas[k]), (k, s.delta)
        assert s.vote == votes[k], k
