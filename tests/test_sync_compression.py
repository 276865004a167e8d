"""Compression codecs without MPI: names, wire bytes, round-trip and summation error bounds, and
the settings that choose them (world size 1)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import hethpc
from hethpc.sync import BSP, SSP, FedAvg, SelSync
from hethpc.sync.codecs import COMPRESSIONS, parse_compression
from hethpc.sync.compression import (
    Bf16,
    Codec,
    Fp16,
    Tally,
    cast_error_bound,
    smallest_step,
    unit_roundoff,
)
from hethpc.train import ConfigError, TrainConfig
from hethpc.train.settings.compare import resume_differences

CASTS = [(Fp16, torch.float16), (Bf16, torch.bfloat16)]


@pytest.mark.parametrize(
    ("text", "cls"),
    [("none", Codec), ("fp16", Fp16), ("bf16", Bf16), (" FP16 ", Fp16)],
    ids=["none", "fp16", "bf16", "case-and-spaces"],
)
def test_parse_compression(text: str, cls: type[Codec]) -> None:
    codec = parse_compression(text)
    assert type(codec) is cls
    assert codec.spec() == cls.name
    assert list(COMPRESSIONS) == ["none", "fp16", "bf16", "int8", "powersgd"]


@pytest.mark.parametrize("text", ["int4", "", "fp8", "power", "int16"])
def test_unknown_compression_is_refused_listing_the_choices(text: str) -> None:
    with pytest.raises(ValueError, match=r"is unknown; choose none, fp16, bf16, int8 or powersgd"):
        parse_compression(text)


@pytest.mark.parametrize(
    ("codec", "dtype", "wire", "nbytes"),
    [
        (Codec(), torch.float32, torch.float32, 4000),
        (Fp16(), torch.float32, torch.float16, 2000),
        (Fp16(), torch.float64, torch.float16, 2000),
        (Fp16(), torch.float16, torch.float16, 2000),
        (Fp16(), torch.int64, torch.int64, 8000),
        (Bf16(), torch.float32, torch.bfloat16, 2000),
        (Bf16(), torch.float16, torch.float16, 2000),
    ],
    ids=["none", "fp16-f32", "fp16-f64", "fp16-f16", "fp16-int", "bf16-f32", "bf16-f16"],
)
def test_wire_dtype_and_bytes(
    codec: Codec, dtype: torch.dtype, wire: torch.dtype, nbytes: int
) -> None:
    assert codec.wire_dtype(dtype) == wire
    assert codec.wire_bytes(1000, dtype) == nbytes
    flat = torch.ones(1000, dtype=dtype)
    assert codec.compress(flat).dtype == wire


def test_unit_roundoff_and_smallest_step() -> None:
    assert unit_roundoff(torch.float16) == 2.0**-11
    assert unit_roundoff(torch.bfloat16) == 2.0**-8
    assert smallest_step(torch.float16) == 2.0**-25  # half the smallest subnormal, 2^-24


@pytest.mark.parametrize(("cls", "dtype"), CASTS, ids=["fp16", "bf16"])
@pytest.mark.parametrize("scale", [1e-7, 1e-4, 1.0, 1e3], ids=lambda s: f"scale{s:g}")
def test_round_trip_errs_by_at_most_one_rounding(
    cls: type[Codec], dtype: torch.dtype, scale: float
) -> None:
    codec = cls()
    flat = torch.randn(10_000, generator=torch.Generator().manual_seed(1)) * scale
    wire = torch.empty(flat.numel(), dtype=dtype)
    out = torch.empty_like(flat)
    codec.decompress(codec.compress(flat, wire), out)
    err = (out - flat).abs()
    bound = unit_roundoff(dtype) * flat.abs() + smallest_step(dtype)
    assert bool((err <= bound).all())
    assert float(err.max()) > 0  # the cast really rounds: the bound is what is tested


def test_none_sends_the_buffer_itself() -> None:
    flat = torch.randn(7)
    assert Codec().compress(flat) is flat
    assert Codec().decompress(flat, flat) is flat


def _sum_in(parts: torch.Tensor, dtype: torch.dtype, order: list[int]) -> torch.Tensor:
    """What an allreduce in ``dtype`` computes: each part rounded, then the partial sums."""
    acc = parts[order[0]].to(dtype)
    for k in order[1:]:
        acc = acc + parts[k].to(dtype)
    return acc.double()


@pytest.mark.parametrize(("cls", "dtype"), CASTS, ids=["fp16", "bf16"])
@pytest.mark.parametrize("n", [2, 3, 8])
def test_sums_in_16_bits_stay_within_the_stated_bound(
    cls: type[Codec], dtype: torch.dtype, n: int
) -> None:
    g = torch.Generator().manual_seed(n)
    weights = torch.rand(n, generator=g) + 0.2
    weights /= weights.sum()
    # Gradients of unequal sizes and signs, weighted by b_k / B before compressing.
    parts = torch.randn(n, 5000, generator=g) * torch.logspace(-6, 1, 5000) * weights[:, None]
    exact = parts.double().sum(0)
    bound = cast_error_bound(parts, dtype)
    for order in (list(range(n)), list(range(n))[::-1]):
        err = (_sum_in(parts, dtype, order) - exact).abs()
        assert bool((err <= bound).all())
    # The bound is tight enough to mean something: a few roundings of the largest terms.
    magnitude = parts.double().abs().sum(0)
    assert bool((bound <= 2 * n * (unit_roundoff(dtype) * 1.01 * magnitude + 1e-7)).all())


def test_range_safe_shares_the_tally() -> None:
    fp16 = Fp16()
    safe = fp16.range_safe()
    assert type(safe) is Bf16 and safe.tally is fp16.tally
    bf16 = Bf16()
    assert bf16.range_safe() is bf16
    none = Codec()
    assert none.range_safe() is none


def test_tally_ratio() -> None:
    t = Tally()
    assert t.ratio == 1.0
    t.add(4000, 2000)
    t.add(400, 400)
    assert (t.raw, t.wire, t.ratio) == (4400, 2400, 4400 / 2400)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2))


@pytest.mark.parametrize(("compression", "ratio"), [("none", 1.0), ("fp16", 2.0), ("bf16", 2.0)])
def test_bsp_counts_the_bytes_on_the_wire(compression: str, ratio: float) -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    policy = BSP(compression=compression)
    for _ in range(3):
        for p in model.parameters():
            p.grad = torch.ones_like(p)
        record = policy.step(model, opt)
    numel = sum(p.numel() for p in model.parameters())
    assert record.bytes == numel * 4 / ratio
    s = policy.summary()
    assert (s.compression, s.compression_ratio, s.bytes_vs_bsp) == (compression, ratio, 1 / ratio)


def test_a_policy_refuses_a_compression_it_cannot_send() -> None:
    with pytest.raises(ValueError, match=r"compression 'fp16' is not built for sync 'ssp'"):
        SSP(compression="fp16")
    with pytest.raises(ValueError, match="is unknown"):
        FedAvg(compression="int3")


def test_compressed_parameter_averages_keep_a_reference_in_their_state() -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    policy = SelSync(threshold=0.0, compression="fp16")
    start = [p.detach().clone() for p in model.parameters()]
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    for _ in range(2):  # each synchronises: the reference becomes the averaged parameters
        policy.step(model, opt)
    state = policy.state_dict()
    assert state["compression"] == "fp16"
    for ref, p, s in zip(state["reference"], model.parameters(), start, strict=True):
        torch.testing.assert_close(ref, p.detach(), rtol=0, atol=0)
        assert not torch.equal(ref, s)
    again = SelSync(threshold=0.0, compression="fp16")
    again.load_state_dict(state)
    # Both averages travelled in fp16: the first sent the change from the start point.
    assert again.summary().compression_ratio == policy.summary().compression_ratio == 2.0
    assert again.state_dict()["reference"] is state["reference"]
    # Another compression may follow (the job asks for --resume-changes): the reference stays
    # where it is still needed, and goes where it is not.
    other = SelSync(threshold=0.0, compression="bf16")
    other.load_state_dict(state)
    assert other.state_dict()["reference"] is state["reference"]
    plain = SelSync(threshold=0.0)
    plain.load_state_dict(state)
    assert plain.state_dict()["reference"] is None


def test_the_first_average_travels_uncompressed_and_sets_the_reference() -> None:
    """When no parameters are known to be common to the replicas (a resume from an
    uncompressed run after local steps; replicas that started unequal: on ranks, below),
    the next average sends the values as they are, and its result is the reference."""
    model = _model()
    numel = sum(p.numel() for p in model.parameters())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    plain = FedAvg(period=2)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    plain.step(model, opt)  # a local step: the replicas may differ
    policy = FedAvg(period=2, compression="fp16")
    policy.load_state_dict(plain.state_dict())
    assert policy.state_dict()["reference"] is None
    assert policy.step(model, opt).bytes == 4 * numel  # the average, in float32
    ref = policy.state_dict()["reference"]
    assert ref is not None
    for r, p in zip(ref, model.parameters(), strict=True):
        assert torch.equal(r, p.detach())
    policy.step(model, opt)
    assert policy.step(model, opt).bytes == 2 * numel  # the next one, in fp16


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"compression": "int3"}, r"compression 'int3' is unknown; choose none, fp16"),
        ({"compression": "fp16", "sync": "ssp"}, r"not built for sync ssp \(it takes \['none'\]"),
    ],
    ids=["unknown", "ssp"],
)
def test_bad_compression_settings_are_named(kw: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as e:
        TrainConfig(**kw)
    assert e.value.key == "compression"


def test_compression_is_a_shared_setting_that_resume_compares() -> None:
    a, b = TrainConfig(), TrainConfig(compression="fp16")
    assert a.digest() != b.digest()  # so check_same_config refuses ranks that differ
    assert resume_differences(a.to_dict(), b) == ["compression: 'none' -> 'fp16'"]


def test_fit_and_coordinator_take_the_keyword(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 60)
    x = rng.normal(0, 0.3, (60, 4)).astype(np.float32) + np.eye(4, dtype=np.float32)[y]
    result = hethpc.fit(
        nn.Linear(4, 3), (x, y), batch_size=10, epochs=1, compression="bf16",
        run_dir=str(tmp_path / "run"), progress=False,
    )  # fmt: skip
    s = result.summary
    assert (s["compression"], s["compression_ratio"], s["config"]["compression"]) == (
        "bf16", 2.0, "bf16"
    )
    model = nn.Linear(4, 3)
    coord = hethpc.Coordinator(model, torch.optim.SGD(model.parameters(), lr=0.1),
                               global_batch=8, compression="fp16")  # fmt: skip
    assert coord.policy.codec.spec() == "fp16"
