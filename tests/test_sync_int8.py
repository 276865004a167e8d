"""int8 averages without MPI: levels, per-chunk scales, rounding, error feedback, bytes, state."""

from __future__ import annotations

import pytest
import torch

from hethpc.sync import FedAvg, SelSync
from hethpc.sync.bsp import BSP
from hethpc.sync.codecs import parse_compression
from hethpc.sync.compression import Bf16
from hethpc.sync.int8 import CHUNK, Int8, chunk_absmax, dequantize, levels, quantize


def test_levels_keep_the_sum_of_every_rank_inside_an_int8() -> None:
    for n in (1, 2, 3, 4, 8, 127):
        assert n * levels(n) <= 127 < n * (levels(n) + 1)
    with pytest.raises(ValueError, match=r"1 to 127 ranks .* got 128; use compression bf16"):
        levels(128)


def test_chunk_scales_are_each_chunks_largest_magnitude() -> None:
    x = torch.zeros(2 * CHUNK + 5)
    x[3], x[CHUNK + 7], x[-1] = -2.5, 0.75, 4.0
    torch.testing.assert_close(chunk_absmax(x), torch.tensor([2.5, 0.75, 4.0]))


@pytest.mark.parametrize("n", [1, 2, 4])
def test_rounding_errs_by_at_most_half_a_level_of_the_chunks_scale(n: int) -> None:
    g = torch.Generator().manual_seed(n)
    x = torch.randn(3 * CHUNK + 11, generator=g) * torch.logspace(-3, 2, 3 * CHUNK + 11)
    scales, level = chunk_absmax(x), levels(n)
    q = quantize(x, scales, level)
    assert q.dtype == torch.int8 and int(q.abs().max()) <= level
    back = dequantize(q, scales, level, torch.empty_like(x))
    step = scales.repeat_interleave(CHUNK)[: x.numel()] / level
    assert bool(((back - x).abs() <= step / 2 + 1e-6 * x.abs()).all())
    assert torch.equal(
        quantize(torch.zeros(5), torch.zeros(1), level), torch.zeros(5, dtype=torch.int8)
    )


def test_error_feedback_sends_what_rounding_left_out_next_time() -> None:
    codec = Int8()
    x = torch.tensor([1.0, 0.004, -0.3])  # 0.004 is below half a level (1 / 63 / 2)
    scales, level = chunk_absmax(x), levels(2)
    sent = codec.feed_back("a", x.clone())
    q = quantize(sent, scales, level)
    assert int(q[1]) == 0  # rounded away this time
    codec.keep_error("a", sent, q, scales, level)
    total = torch.zeros(3)
    for _ in range(8):  # the same values again and again: the small one adds up and is sent
        sent = codec.feed_back("a", x.clone())
        q = quantize(sent, scales, level)
        codec.keep_error("a", sent, q, scales, level)
        total += dequantize(q, scales, level, torch.empty(3))
    torch.testing.assert_close(total / 8, x, atol=1 / level / 8, rtol=0)
    assert set(codec.residuals) == {"a"}
    restored = Int8()
    restored.load_state_dict(codec.state_dict())
    assert torch.equal(restored.residuals["a"], codec.residuals["a"])


def test_int8_bytes_and_what_it_takes() -> None:
    codec = parse_compression("int8")
    assert type(codec) is Int8 and codec.spec() == "int8" and codec.compresses
    assert codec.wire_dtype(torch.float32) == torch.int8
    assert codec.wire_bytes(2048, torch.float32) == 2048 + 2 * 4  # the values and 2 scales
    assert codec.wire_bytes(10, torch.int64) == 80
    safe = codec.range_safe()  # an optimizer's second moments travel as bf16
    assert type(safe) is Bf16 and safe.tally is codec.tally
    FedAvg(period=2, compression="int8")
    SelSync(compression="int8")
    with pytest.raises(ValueError, match=r"'int8' is not built for sync 'bsp'"):
        BSP(compression="int8")
