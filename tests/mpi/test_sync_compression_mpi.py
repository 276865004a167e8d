"""Compressed averages on real ranks: within the codec's stated error of the float32 ones.

Every rank computes every rank's contribution itself (the same model, data drawn from each
rank's seed), so the expected sum and its error bound (``cast_error_bound``) are closed forms
on every rank; the result must also differ from the float32 one somewhere, or nothing was
compressed.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

from hethpc import comm
from hethpc.sync import BSP, FedAvg, SelSync, SyncError, SyncPolicy
from hethpc.sync.compression import cast_error_bound
from hethpc.sync.int8 import CHUNK, chunk_absmax, levels
from hethpc.sync.outer import OuterOptimizer
from hethpc.train import ConfigError, TrainConfig
from hethpc.train.settings.compare import check_same_config

CASTS = {"fp16": torch.float16, "bf16": torch.bfloat16}
F32_SLACK = 4 * torch.finfo(torch.float32).eps  # float32 rounding of what the ranks add up


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 3))


def _batch(rank: int, step: int, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 * rank + step)
    return torch.randn(rows, 6, generator=g), torch.randint(0, 3, (rows,), generator=g)


def _sizes(n: int) -> list[int]:
    return [4 + 5 * k for k in range(n)]  # unequal batches: weights b_k / B


def _grads(model: nn.Module, rank: int, step: int, rows: int) -> list[torch.Tensor]:
    """Rank ``rank``'s mean gradient at ``model`` (computed on a copy)."""
    twin = copy.deepcopy(model)
    x, y = _batch(rank, step, rows)
    nn.functional.cross_entropy(twin(x), y).backward()
    return [p.grad.detach().clone() for p in twin.parameters()]


def _within(got: torch.Tensor, want: torch.Tensor, bound: torch.Tensor, what: str) -> float:
    """Assert ``|got - want| <= bound`` (plus float32 slack); returns the largest error."""
    err = (got.double() - want.double()).abs()
    slack = F32_SLACK * want.double().abs() + 1e-12
    worst = float((err - bound - slack).max())
    assert worst <= 0, f"{what}: {worst:.3g} past the bound"
    return float(err.max())


@pytest.mark.parametrize("compression", list(CASTS))
@pytest.mark.parametrize("overlap", [False, True], ids=["after-backward", "overlap"])
@pytest.mark.parametrize("weighted", [False, True], ids=["equal", "weighted"])
def test_compressed_bsp_gradient_is_the_global_batch_gradient_within_the_bound(
    world: tuple[int, int], compression: str, overlap: bool, weighted: bool
) -> None:
    r, n = world
    sizes = _sizes(n)
    weights = [s / sum(sizes) if weighted else 1.0 / n for s in sizes]
    model = _model()
    policy = BSP(compression=compression, overlap=overlap, bucket_bytes=256)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # the averaged gradients stay in .grad
    parts = [[w * g for g in _grads(model, k, 0, sizes[k])] for k, w in enumerate(weights)]
    x, y = _batch(r, 0, sizes[r])
    policy.before_backward(model, weight=weights[r] if weighted else None)
    nn.functional.cross_entropy(model(x), y).backward()
    record = policy.step(model, opt, weight=weights[r] if weighted else None)
    largest = 0.0
    for i, p in enumerate(model.parameters()):
        stacked = torch.stack([part[i] for part in parts])
        want = stacked.double().sum(0)
        bound = cast_error_bound(stacked, CASTS[compression])
        largest = max(largest, _within(p.grad, want, bound, f"parameter {i}"))
    if n > 1:
        assert largest > 1e-7  # 16 bits crossed the wire, not 32
    numel = sum(p.numel() for p in model.parameters())
    assert record.bytes == 2 * numel
    policy.close()


@pytest.mark.parametrize("compression", list(CASTS))
def test_replicas_stay_identical_after_compressed_bsp_steps(
    world: tuple[int, int], compression: str
) -> None:
    r, n = world
    sizes = _sizes(n)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    policy = BSP(compression=compression)
    for step in range(3):
        x, y = _batch(r, step, sizes[r])
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        policy.step(model, opt, weight=sizes[r] / sum(sizes))
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()
    table = comm.allgather_array(flat)
    for k in range(n):
        np.testing.assert_array_equal(table[k], flat, err_msg=f"rank {k} differs")


def test_bytes_are_halved_in_the_records_and_the_summary(world: tuple[int, int]) -> None:
    r, _ = world
    records = {}
    for compression in ("none", "fp16"):
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        policy = BSP(compression=compression)
        x, y = _batch(r, 0, 8)
        nn.functional.cross_entropy(model(x), y).backward()
        records[compression] = (policy.step(model, opt), policy.summary())
    (plain, s_plain), (half, s_half) = records["none"], records["fp16"]
    assert half.bytes * 2 == plain.bytes > 0
    assert (s_plain.compression_ratio, s_half.compression_ratio) == (1.0, 2.0)
    assert s_half.bytes_vs_bsp == 0.5


def test_the_weight_check_stays_exact_under_compression(world: tuple[int, int]) -> None:
    """A sum of weights 1e-4 off 1 is below fp16's resolution of 1 (2^-10): riding in a 16-bit
    buffer it would pass; checked apart, it is refused on every rank."""
    r, n = world
    model = _model()
    policy = BSP(compression="fp16", check_weights=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = _batch(r, 0, 4)
    nn.functional.cross_entropy(model(x), y).backward()
    weight = 1.0 / n + (1e-4 if r == 0 else 0.0)
    match = "weights sum to 1.0001" if n > 1 else r"outside \(0, 1\]"
    with pytest.raises(SyncError, match=match):
        policy.step(model, opt, weight=weight)


def _averaged(
    world: tuple[int, int], policy: SyncPolicy, *, lr: float = 0.1, first: bool = True
) -> tuple[nn.Module, list[torch.Tensor], list[list[torch.Tensor]], list[float]]:
    """One local SGD step on every rank (unequal weights), then the policy's average; returns
    the model, the start parameters, every rank's step ``x_k - x_0`` and the weights. With
    ``first``, an average before it (its result is the reference the next one sends its
    difference from)."""
    r, n = world
    sizes = _sizes(n)
    weights = [s / sum(sizes) for s in sizes]
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    if first:
        x, y = _batch(r, 1, sizes[r])
        nn.functional.cross_entropy(model(x), y).backward()
        policy.step(model, opt, weight=weights[r])
        opt.zero_grad()
    start = [p.detach().clone() for p in model.parameters()]
    moves = [[-lr * g for g in _grads(model, k, 0, sizes[k])] for k in range(n)]
    x, y = _batch(r, 0, sizes[r])
    nn.functional.cross_entropy(model(x), y).backward()
    policy.step(model, opt, weight=weights[r])
    policy.settle()
    return model, start, moves, weights


@pytest.mark.parametrize("compression", list(CASTS))
@pytest.mark.parametrize("policy_name", ["fedavg", "selsync"])
def test_compressed_parameter_averages_are_within_the_bound(
    world: tuple[int, int], compression: str, policy_name: str
) -> None:
    _, n = world
    policy: SyncPolicy = (
        FedAvg(period=1, compression=compression)
        if policy_name == "fedavg"
        else SelSync(threshold=0.0, compression=compression)  # every warm-up step syncs
    )
    model, start, moves, weights = _averaged(world, policy)
    assert policy.summary().synced_steps == 2
    largest = 0.0
    for i, p in enumerate(model.parameters()):
        # What travels is the weighted difference from the last average, not the parameters.
        parts = torch.stack([w * m[i] for w, m in zip(weights, moves, strict=True)])
        want = start[i].double() + parts.double().sum(0)
        bound = cast_error_bound(parts, CASTS[compression])
        largest = max(largest, _within(p.detach(), want, bound, f"parameter {i}"))
    if n > 1:
        assert largest > 1e-9


@pytest.mark.parametrize("policy_name", ["fedavg", "selsync", "diloco"])
def test_int8_parameter_averages_err_by_at_most_half_a_level_per_rank(
    world: tuple[int, int], policy_name: str
) -> None:
    """Each rank's weighted change rounds to a level of its chunk's shared scale (the largest
    magnitude on any rank), ``scale / (127 // N)``: the sum errs by at most N half levels. The
    integers sum exactly, so every replica gets the same parameters."""
    _, n = world
    policy: SyncPolicy = {
        "fedavg": lambda: FedAvg(period=1, compression="int8"),
        "selsync": lambda: SelSync(threshold=0.0, compression="int8"),
        "diloco": lambda: FedAvg(
            period=1, outer=OuterOptimizer("sgd", lr=1.0, momentum=0.0), compression="int8"
        ),  # the outer step at lr 1 without momentum takes the average as it is
    }[policy_name]()
    # The run's first average: it sends each rank's change since the start, which the
    # replicas share (a second would carry the first's rounding back, by error feedback).
    model, start, moves, weights = _averaged(world, policy, first=False)
    parts = torch.stack([
        torch.cat([(w * m[i]).flatten() for i in range(len(m))])
        for w, m in zip(weights, moves, strict=True)
    ])  # fmt: skip
    level = levels(n)
    scales = chunk_absmax(parts.abs().amax(0))
    half = n * scales.repeat_interleave(CHUNK)[: parts.shape[1]].double() / level / 2
    want = torch.cat([p.flatten() for p in start]).double() + parts.double().sum(0)
    got = torch.cat([p.detach().flatten() for p in model.parameters()])
    largest = _within(got, want, half, f"{policy_name} parameters")
    if n > 1:
        assert largest > 1e-9
        assert policy.summary().compression_ratio > 3.5
    every = comm.allgather_array(got.numpy().astype(np.float64))
    assert np.array_equal(every, np.broadcast_to(every[0], every.shape))


def test_diloco_pseudo_gradients_compressed_move_the_outer_step_within_the_bound(
    world: tuple[int, int],
) -> None:
    """The outer Nesterov step is linear in the average with slope ``lr * (1 + momentum)`` at
    its first step, so its error is the average's times that."""
    _, n = world
    lr, momentum = 0.7, 0.5
    results = {}
    for compression in ("none", "fp16"):
        outer = OuterOptimizer("nesterov", lr=lr, momentum=momentum)
        policy = FedAvg(period=1, outer=outer, compression=compression)
        # The outer optimizer's start point is common from the first step: compressed at once.
        model, start, moves, weights = _averaged(world, policy, first=False)
        assert policy.summary().compression_ratio == (2.0 if compression == "fp16" else 1.0)
        results[compression] = [p.detach().clone() for p in model.parameters()]
    for i, (half, full) in enumerate(zip(results["fp16"], results["none"], strict=True)):
        parts = torch.stack([w * m[i] for w, m in zip(weights, moves, strict=True)])
        bound = lr * (1 + momentum) * cast_error_bound(parts, torch.float16)
        _within(half, full, bound + 2 * F32_SLACK * full.double().abs(), f"parameter {i}")


def test_the_optimizer_state_average_travels_in_bf16_under_fp16(world: tuple[int, int]) -> None:
    r, n = world
    sizes = _sizes(n)
    weights = [s / sum(sizes) for s in sizes]
    model = _model()
    grads = [_grads(model, k, 0, sizes[k]) for k in range(n)]
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    policy = FedAvg(period=1, optimizer_state=True, compression="fp16")
    x, y = _batch(r, 0, sizes[r])
    nn.functional.cross_entropy(model(x), y).backward()
    record = policy.step(model, opt, weight=weights[r])
    policy.settle()
    for i, p in enumerate(model.parameters()):
        # SGD's first momentum buffer is the gradient itself.
        parts = torch.stack([w * g[i] for w, g in zip(weights, grads, strict=True)])
        bound = cast_error_bound(parts, torch.bfloat16)
        _within(opt.state[p]["momentum_buffer"], parts.double().sum(0), bound, f"momentum {i}")
    numel = sum(p.numel() for p in model.parameters())
    # The run's first average: parameters in fp16 (their change since the start, which the
    # replicas share), momentum in bf16.
    assert record.bytes == 2 * numel + 2 * numel


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_16_bit_allreduce_sums_in_16_bits(world: tuple[int, int], dtype: torch.dtype) -> None:
    r, n = world
    t = torch.tensor([0.25 * (r + 1), -1.0, 3.0 * r], dtype=dtype)
    comm.allreduce_(t, comm.ReduceOp.SUM)
    assert t.dtype == dtype
    want = torch.tensor(
        [0.25 * n * (n + 1) / 2, -1.0 * n, 3.0 * n * (n - 1) / 2], dtype=torch.float64
    )
    torch.testing.assert_close(t.double(), want, rtol=0, atol=0)


def test_ranks_asking_for_different_compression_are_refused(world: tuple[int, int]) -> None:
    r, n = world
    if n == 1:
        pytest.skip("needs two or more ranks")
    cfg = TrainConfig(compression="fp16" if r == 0 else "none")
    with pytest.raises(ConfigError, match=r"compression \(rank 0: 'fp16', rank 1: 'none'"):
        check_same_config(cfg)


@pytest.mark.parametrize("equal", [True, False], ids=["equal-start", "unequal-start"])
def test_the_first_average_is_compressed_only_from_a_start_the_replicas_share(
    world: tuple[int, int], equal: bool
) -> None:
    """Replicas that start equal (a broadcast) send the first average's change since the start
    in fp16; replicas that start unequal cannot share a reference, so their first average
    travels in float32, and it makes them equal."""
    r, n = world
    model = _model()
    if not equal:
        with torch.no_grad():
            next(model.parameters()).add_(0.01 * r)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    policy = FedAvg(period=1, compression="fp16")
    x, y = _batch(r, 0, 8)
    nn.functional.cross_entropy(model(x), y).backward()
    record = policy.step(model, opt)
    numel = sum(p.numel() for p in model.parameters())
    shared = equal or n == 1
    assert record.bytes == (2 if shared else 4) * numel
    assert policy.summary().compression_ratio == (2.0 if shared else 1.0)
    got = torch.cat([p.detach().flatten() for p in model.parameters()])
    every = comm.allgather_array(got.numpy().astype(np.float64))
    assert np.array_equal(every, np.broadcast_to(every[0], every.shape))
