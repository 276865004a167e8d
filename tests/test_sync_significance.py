"""SelSync's significance tracking as plain math: norms, EWMA, relative change, votes."""

from __future__ import annotations

import math

import pytest
import torch

from hethpc.sync import SignificanceTracker, gradient_norm
from hethpc.sync.significance import relative_change

NAN, INF = math.nan, math.inf


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-12)


def test_ewma_delta_and_votes_closed_form() -> None:
    # window 3: a = 2 / (3 + 1) = 0.5; warm-up covers the first three observations.
    t = SignificanceTracker(threshold=0.3, window=3)
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


def test_default_window_and_threshold() -> None:
    t = SignificanceTracker()
    assert (t.threshold, t.window, t.alpha) == (0.3, 25, 2 / 26)
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


def test_zero_gradients_after_warmup_do_not_vote() -> None:
    t = SignificanceTracker(threshold=0.3, window=1)
    assert t.update(0.0).vote  # warm-up
    s = t.update(0.0)
    assert (s.delta, s.vote) == (0.0, False)
    s = t.update(1.0)  # from a zero denominator: infinitely significant
    assert (s.delta, s.vote) == (INF, True)


@pytest.mark.parametrize("bad", [INF, NAN], ids=["inf", "nan"])
def test_non_finite_norm_votes_yes_and_leaves_the_ewma_finite(bad: float) -> None:
    t = SignificanceTracker(threshold=0.3, window=1)
    t.update(2.0)
    s = t.update(bad)
    assert s.vote and s.delta == INF and s.smoothed == 2.0
    assert t.smoothed == 2.0 and t.count == 2
    s = t.update(2.0)  # judged against the last finite history
    assert (s.smoothed, s.delta, s.vote) == (2.0, 0.0, False)


def test_non_finite_first_norm() -> None:
    t = SignificanceTracker(threshold=0.3, window=1)
    s = t.update(NAN)
    assert s.vote and math.isnan(s.smoothed) and math.isnan(t.smoothed)
    s = t.update(3.0)
    assert s.smoothed == 3.0 and math.isnan(s.delta) and not s.vote


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
    ],
    ids=["negative-threshold", "inf-threshold", "zero-window", "fractional-window", "bool-window"],
)
def test_bad_settings(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SignificanceTracker(**kwargs)  # type: ignore[arg-type]


def test_negative_norm_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot be negative"):
        SignificanceTracker().update(-1.0)


def test_state_dict_resumes_identically() -> None:
    norms = [1.0, 1.2, 0.9, 1.1, 3.0, 3.1, 0.5, 0.6, 0.6, 2.0, 2.0, 0.1]
    whole = SignificanceTracker(threshold=0.3, window=4)
    expected = [whole.update(g) for g in norms]
    first = SignificanceTracker(threshold=0.3, window=4)
    got = [first.update(g) for g in norms[:6]]
    resumed = SignificanceTracker(threshold=0.3, window=4)
    resumed.load_state_dict(first.state_dict())
    got += [resumed.update(g) for g in norms[6:]]
    assert [(s.vote, s.warmup) for s in got] == [(s.vote, s.warmup) for s in expected]
    assert [s.smoothed for s in got] == [s.smoothed for s in expected]


@pytest.mark.parametrize(
    ("state", "match"),
    [
        ({"threshold": 0.5, "window": 4, "count": 1, "smoothed": 1.0}, "saved with threshold=0.5"),
        ({"threshold": 0.3, "window": 25, "count": 1, "smoothed": 1.0}, "window=25"),
        ({"threshold": 0.3, "window": 4, "count": -1, "smoothed": 1.0}, "corrupt"),
        ({"threshold": 0.3, "window": 4, "count": 1, "smoothed": NAN}, "corrupt"),
    ],
    ids=["other-threshold", "other-window", "negative-count", "nan-smoothed"],
)
def test_load_state_dict_refuses(state: dict[str, float], match: str) -> None:
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


def test_delta_smoothing_closed_form() -> None:
    # The published code's variant: r_t = |g_t - g_(t-1)| / g_(t-1), D_t = EWMA(r);
    # window 3: a = 0.5 and three warm-up steps. g = 0 makes the next r infinite: yes, not folded.
    t = SignificanceTracker(threshold=0.3, window=3, smoothing="delta")
    norms = [2.0, 3.0, 3.0, 3.0, 0.0, 1.0, 1.0]
    deltas = [NAN, 0.5, 0.25, 0.125, 0.5625, INF, 0.28125]
    votes = [True, True, True, False, True, True, False]
    for k, g in enumerate(norms):
        s = t.update(g)
        assert _same(s.delta, deltas[k]), (k, s.delta)
        assert s.vote == votes[k], k
    resumed = SignificanceTracker(threshold=0.3, window=3, smoothing="delta")
    resumed.load_state_dict(t.state_dict())
    assert resumed.update(1.0).delta == t.update(1.0).delta


def test_smoothing_must_match_on_resume() -> None:
    with pytest.raises(ValueError, match="smoothing='delta'"):
        SignificanceTracker(smoothing="norm").load_state_dict(
            SignificanceTracker(smoothing="delta").state_dict()
        )
    with pytest.raises(ValueError, match="smoothing must be one of"):
        SignificanceTracker(smoothing="both")  # type: ignore[arg-type]
