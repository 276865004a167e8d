"""A control decision from gathered per-sample times: adopt, hold in the dead-band, fall back."""

from __future__ import annotations

import math

import pytest

from hethpc.batching import AllocationError
from hethpc.batching.decision import Adjustment, decide


@pytest.mark.parametrize(
    ("old", "per_sample", "kw", "new", "applied", "reason"),
    [
        ([64, 64], [1e-3, 3e-3], {}, [96, 32], True, "adopted"),
        ([96, 32], [1e-3, 3e-3], {}, [96, 32], False, "unchanged"),
        ([96, 32], [1e-3, 2.9e-3], {}, [95, 33], False, "dead-band"),
        ([96, 32], [1e-3, 2.9e-3], {"deadband": 0.0, "min_change": 0}, [95, 33], True, "adopted"),
        ([113, 15], [1e-3, 7.1e-3], {}, [112, 16], False, "dead-band"),  # 6.7 % but one sample
        ([113, 15], [1e-3, 7.1e-3], {"min_change": 0}, [112, 16], True, "adopted"),
        ([113, 15], [1e-3, 6.5e-3], {}, [111, 17], True, "adopted"),
        ([64, 64], [1e-3, 1.04e-3], {"force": True}, [65, 63], True, "probe"),
        ([43, 43, 42], [1e-3, 2e-3, 4e-3], {}, [73, 37, 18], True, "adopted"),
        ([64, 64], [1e-3, 9e-3], {"b_min": 20}, [108, 20], True, "adopted"),
    ],
    ids=["from-uniform", "balanced", "held-by-band", "band-zero", "one-sample-held",
         "one-sample-allowed", "two-samples", "probe-forced", "three-ranks",
         "clamped"],
)
def test_decide(
    old: list[int], per_sample: list[float], kw: dict, new: list[int], applied: bool, reason: str
) -> None:
    B = sum(old)
    rec = decide(7, old, per_sample, global_batch=B, **kw)
    assert (list(rec.new_sizes), rec.applied, rec.reason) == (new, applied, reason)
    assert rec.step == 7 and list(rec.old_sizes) == old
    assert rec.times == pytest.approx([p * b for p, b in zip(per_sample, old, strict=True)])
    assert rec.throughputs == pytest.approx([1 / p for p in per_sample])


@pytest.mark.parametrize(
    "bad", [math.nan, 0.0, -1e-3, math.inf], ids=["nan", "zero", "negative", "inf"]
)
def test_decide_keeps_sizes_when_a_rank_has_no_valid_time(bad: float) -> None:
    rec = decide(9, [64, 64], [1e-3, bad], global_batch=128, force=True)
    assert not rec.applied and rec.new_sizes == rec.old_sizes == (64, 64)
    assert rec.reason.startswith("invalid time: rank(s) 1 (")


def test_decide_raises_when_infeasible() -> None:
    with pytest.raises(AllocationError, match="exceeds what the 2 ranks may hold"):
        decide(0, [5, 5], [1e-3, 1e-3], global_batch=10, b_max=4)


def test_adjustment_dict_round_trip() -> None:
    rec = decide(3, [64, 64], [1e-3, 3e-3], global_batch=128)
    d = rec.as_dict()
    assert d["new_sizes"] == [96, 32] and isinstance(d["times"], list)
    assert Adjustment.from_dict(d) == rec


def test_adjustment_records_the_elasticities_it_assumed() -> None:
    # Rank 1's time moves half as fast as its batch: the proposal moves it further.
    plain = decide(3, [64, 64], [1e-3, 1.2e-3], global_batch=128)
    rec = decide(3, [64, 64], [1e-3, 1.2e-3], global_batch=128, elasticity=[1.0, 0.5])
    assert plain.elasticities == () and rec.elasticities == (1.0, 0.5)
    assert rec.new_sizes[1] < plain.new_sizes[1] < 64
    d = rec.as_dict()
    assert d["elasticities"] == [1.0, 0.5] and Adjustment.from_dict(d) == rec
