"""Sync policies in one process (world size 1): decisions, records, summary, resume, settings."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import nn

from hethpc.sync import BSP, FedAvg, LocalOnly, SelSync, SyncError, SyncPolicy, make_policy
from hethpc.sync.averaging import optimizer_state_tensors
from hethpc.sync.drift import DriftCorrection


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3), nn.Linear(3, 2))


def _grads(model: nn.Module, scale: float) -> None:
    for k, p in enumerate(model.parameters()):
        p.grad = torch.full_like(p, scale * (k + 1))


def _run(policy: SyncPolicy, scales: list[float], model: nn.Module | None = None) -> nn.Module:
    model = model or _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for s in scales:
        _grads(model, s)
        policy.step(model, opt)
    return model


@pytest.mark.parametrize(
    ("name", "kwargs", "cls"),
    [
        ("bsp", {}, BSP),
        ("selsync", {"threshold": 0.5}, SelSync),
        ("SelSync", {}, SelSync),
        ("fedavg", {"period": 4}, FedAvg),
        ("local", {}, LocalOnly),
        ("local-only", {}, LocalOnly),
    ],
    ids=["bsp", "selsync", "case", "fedavg", "local", "local-only"],
)
def test_make_policy(name: str, kwargs: dict[str, object], cls: type[SyncPolicy]) -> None:
    assert type(make_policy(name, **kwargs)) is cls


@pytest.mark.parametrize(
    ("name", "kwargs", "error", "match"),
    [
        ("allreduce", {}, ValueError, "unknown sync policy 'allreduce'; choose one of"),
        ("bsp", {"period": 3}, TypeError, "period"),
        ("fedavg", {"period": 0}, ValueError, "period must be an integer >= 1"),
        ("selsync", {"aggregation": "both"}, ValueError, "aggregation must be one of"),
        ("selsync", {"norm": "max"}, ValueError, "norm must be one of"),
        ("selsync", {"threshold": -1}, ValueError, "threshold must be a finite number"),
        ("selsync", {"criterion": "norm"}, ValueError, "criterion must be one of"),
        ("selsync", {"max_local_steps": -1}, ValueError, "max_local_steps must be None or"),
        ("selsync", {"max_local_steps": 2.5}, ValueError, "max_local_steps must be None or"),
    ],
    ids=[
        "unknown",
        "foreign-setting",
        "fedavg-period",
        "aggregation",
        "norm",
        "threshold",
        "criterion",
        "negative-bound",
        "fractional-bound",
    ],
)
def test_make_policy_refuses(
    name: str, kwargs: dict[str, object], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        make_policy(name, **kwargs)


def test_bsp_in_one_process_is_plain_sgd() -> None:
    ref = _model()
    opt = torch.optim.SGD(ref.parameters(), lr=0.01, momentum=0.9)
    for s in [1.0, 2.0, 3.0]:
        _grads(ref, s)
        opt.step()
    got = _run(BSP(), [1.0, 2.0, 3.0])
    for a, b in zip(got.state_dict().values(), ref.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_selsync_records_and_summary() -> None:
    policy = SelSync(threshold=0.3, window=2, criterion="previous")
    _run(policy, [1.0, 1.0, 1.0, 5.0, 5.0])
    recs = policy.records
    assert [r.step for r in recs] == [0, 1, 2, 3, 4]
    # a = 2/3; the global norm is proportional to the scale, so only the jump to 5 is significant.
    assert [r.decision for r in recs] == ["SYNC", "SYNC", "LOCAL", "SYNC", "LOCAL"]
    assert [r.votes for r in recs] == [1, 1, 0, 1, 0]
    assert recs[3].delta == pytest.approx(2 / 3 * 4)
    assert recs[4].delta == pytest.approx((2 / 3 * 4 / 3) / (1 + 2 / 3 * 4))
    assert math.isnan(recs[0].delta) and recs[0].smoothed_norm == recs[0].grad_norm
    model = _model()
    nbytes = sum(p.numel() * 4 for p in model.parameters())
    buffers = sum(b.numel() * 4 for b in model.buffers() if b.is_floating_point())
    assert [r.bytes for r in recs] == [nbytes + buffers] * 2 + [0] + [nbytes + buffers] + [0]
    s = policy.summary()
    assert (s.policy, s.steps, s.synced_steps, s.sync_fraction) == ("selsync", 5, 3, 0.6)
    assert s.bsp_bytes == 5 * nbytes
    assert s.bytes_vs_bsp == pytest.approx(3 * (nbytes + buffers) / (5 * nbytes))
    assert recs[2].as_dict()["decision"] == "LOCAL"


@pytest.mark.parametrize(
    ("kwargs", "decisions", "deltas"),
    [
        # window 2 (a = 2/3): S = 1, 1, 1, 11/3, 41/9; delta against S two steps back (= 1).
        (
            {"criterion": "window"},
            ["SYNC", "SYNC", "LOCAL", "SYNC", "SYNC"],
            [0.0, 0.0, 8 / 3, 32 / 9],
        ),
        # the default: against S at the last sync: 1 until step 3 syncs, then 11/3.
        (
            {},
            ["SYNC", "SYNC", "LOCAL", "SYNC", "LOCAL"],
            [0.0, 0.0, 8 / 3, (41 / 9 - 11 / 3) / (11 / 3)],
        ),
    ],
    ids=["window", "last-sync-default"],
)
def test_selsync_criteria_decide(
    kwargs: dict[str, object], decisions: list[str], deltas: list[float]
) -> None:
    policy = SelSync(threshold=0.3, window=2, **kwargs)  # type: ignore[arg-type]
    _run(policy, [1.0, 1.0, 1.0, 5.0, 5.0])
    assert [r.decision for r in policy.records] == decisions
    assert [r.delta for r in policy.records[1:]] == pytest.approx(deltas)


@pytest.mark.parametrize(
    ("bound", "decisions", "forced"),
    [
        (None, "SLLLLLL", 0),
        (2, "SLLSLLS", 2),
        (1, "SLSLSLS", 3),
        (0, "SSSSSSS", 6),
    ],
    ids=["none", "two", "one", "zero-is-bsp"],
)
def test_staleness_bound(bound: int | None, decisions: str, forced: int) -> None:
    # window 1 and a constant norm: only the warm-up step votes; the bound forces the rest.
    policy = SelSync(window=1, max_local_steps=bound)
    _run(policy, [1.0] * 7)
    assert "".join(r.decision[0] for r in policy.records) == decisions
    assert [r.votes for r in policy.records] == [1] + [0] * 6
    assert policy.forced_syncs == forced
    assert policy.summary_fields() == {"warmup_syncs": 1, "voted_syncs": 0, "forced_syncs": forced}


def test_layer_sum_norm_is_recorded() -> None:
    policy = SelSync(norm="layer_sum", window=1)
    model = _run(policy, [1.0])
    expected = sum(float(torch.linalg.vector_norm(p.grad)) for p in model.parameters())
    assert policy.records[0].grad_norm == pytest.approx(expected)


@pytest.mark.parametrize(
    ("policy", "synced"),
    [
        (BSP(), [True] * 7),
        (FedAvg(period=3), [False, False, True, False, False, True, False]),
        (FedAvg(period=1), [True] * 7),
        (LocalOnly(), [False] * 7),
    ],
    ids=["bsp", "fedavg-3", "fedavg-1", "local"],
)
def test_baseline_schedules(policy: SyncPolicy, synced: list[bool]) -> None:
    _run(policy, [1.0] * 7)
    assert [r.synced for r in policy.records] == synced
    assert policy.summary().synced_steps == sum(synced)


@pytest.mark.parametrize(
    ("policy", "averages"),
    [(BSP(), False), (FedAvg(period=3), True), (FedAvg(period=2), False), (LocalOnly(), True)],
    ids=["bsp", "fedavg-ends-local", "fedavg-ends-synced", "local"],
)
def test_finish_averages_only_after_local_steps(policy: SyncPolicy, averages: bool) -> None:
    model = _run(policy, [1.0] * 4)
    assert policy.finish(model) is averages
    assert policy.finish(model) is False


@pytest.mark.parametrize("weight", [0.5, 1.5, -1.0, math.nan], ids=["half", "over", "neg", "nan"])
def test_weights_must_sum_to_one(weight: float) -> None:
    model = _model()
    _grads(model, 1.0)
    with pytest.raises(SyncError, match="weight"):
        BSP().step(model, torch.optim.SGD(model.parameters(), lr=0.1), weight=weight)


def test_full_weight_in_one_process() -> None:
    model = _model()
    _grads(model, 1.0)
    rec = BSP().step(model, torch.optim.SGD(model.parameters(), lr=0.1), weight=1.0, compute_s=0.25)
    assert rec.synced and rec.compute_s == 0.25


@pytest.mark.parametrize(
    "make",
    [
        lambda: SelSync(threshold=0.3, window=3),
        lambda: SelSync(threshold=0.3, window=3, aggregation="grads"),
        lambda: SelSync(threshold=0.3, window=3, criterion="last_sync"),
        lambda: SelSync(threshold=0.3, window=3, criterion="previous", max_local_steps=2),
        lambda: FedAvg(period=4),
    ],
    ids=["selsync", "selsync-grads", "selsync-last-sync", "selsync-bound", "fedavg"],
)
def test_resume_decides_as_uninterrupted(make: object) -> None:
    scales = [1.0, 1.1, 0.9, 1.0, 3.0, 3.2, 3.1, 0.4, 0.5, 0.5, 2.0, 2.0]
    whole = make()  # type: ignore[operator]
    _run(whole, scales)
    first = make()  # type: ignore[operator]
    model = _run(first, scales[:5])
    resumed = make()  # type: ignore[operator]
    resumed.load_state_dict(first.state_dict())
    _run(resumed, scales[5:], model)
    assert [r.synced for r in first.records + resumed.records] == [r.synced for r in whole.records]
    assert [r.step for r in resumed.records] == list(range(5, 12))
    assert resumed.summary().synced_steps == whole.summary().synced_steps


def test_load_state_dict_refuses_another_policy() -> None:
    with pytest.raises(SyncError, match="saved by policy 'bsp'"):
        SelSync().load_state_dict(BSP().state_dict())


def test_load_state_dict_refuses_another_bound() -> None:
    with pytest.raises(ValueError, match="saved with max_local_steps=5"):
        SelSync().load_state_dict(SelSync(max_local_steps=5).state_dict())


def test_optimizer_state_tensors_are_the_per_parameter_moments() -> None:
    model = nn.Linear(3, 2)
    params = list(model.parameters())
    for opt, keys in (
        (torch.optim.SGD(params, lr=0.1, momentum=0.9), ["momentum_buffer"]),
        (torch.optim.Adam(params, lr=0.1), ["exp_avg", "exp_avg_sq"]),  # not its step
    ):
        assert optimizer_state_tensors(opt, params) == []  # no state before the first step
        model(torch.ones(4, 3)).sum().backward()
        opt.step()
        got = optimizer_state_tensors(opt, params)
        want = [opt.state[p][k] for p in params for k in keys]
        assert len(got) == len(want) and all(a is b for a, b in zip(got, want, strict=True))
    assert optimizer_state_tensors(torch.optim.SGD(params, lr=0.1), params) == []


@pytest.mark.parametrize(
    "make",
    [
        lambda: BSP(optimizer_state=True),
        lambda: SelSync(aggregation="grads", optimizer_state=True),
        lambda: LocalOnly(optimizer_state=True),
    ],
    ids=["bsp", "selsync-grads", "local"],
)
def test_optimizer_state_averaging_needs_parameter_averages(make: Any) -> None:
    with pytest.raises(ValueError, match="averaging the optimizer state"):
        make()


def test_for_other_parameters_keeps_the_counters_and_starts_the_rest_afresh() -> None:
    # A pipeline stage that holds other layers after a re-cut: SelSync's tracker and the
    # drift corrections were about the old layers; its counts and bound carry on.
    scales = [1.0, 1.1, 0.9, 1.0, 3.0, 3.2]
    first = SelSync(threshold=0.3, window=2, max_local_steps=3, drift=DriftCorrection())
    _run(first, scales)
    saved = first.state_dict()
    assert saved["tracker"]["count"] > 0 and saved["drift"]["steps"] + saved["step"] > 0
    fresh = SelSync(threshold=0.3, window=2, max_local_steps=3, drift=DriftCorrection())
    moved = fresh.for_other_parameters(saved)
    assert moved["step"] == saved["step"] == len(scales)
    assert (moved["synced"], moved["forced_syncs"]) == (saved["synced"], saved["forced_syncs"])
    assert moved["tracker"] == SelSync(threshold=0.3, window=2, max_local_steps=3).state_dict()[
        "tracker"
    ]
    assert moved["drift"]["drift"] is None and moved["drift"]["steps"] == 0
    fresh.load_state_dict(moved)  # loads, and goes on counting from the saved step
    _run(fresh, [1.0])
    assert fresh.records[-1].step == len(scales)
