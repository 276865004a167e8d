"""PowerSGD without MPI: exact at the gradient's rank, error feedback, warm start, state, and
the settings that choose it (the sum over ranks of one rank is its own gradient)."""

from __future__ import annotations

import math
import threading

import pytest
import torch
from torch import nn

from hethpc.sync import BSP, FedAvg, SelSync
from hethpc.sync.codecs import parse_compression
from hethpc.sync.powersgd import PowerSGD, compressible, orthonormalise
from hethpc.train import ConfigError, TrainConfig


def _alone(flat: torch.Tensor, part: str) -> None:
    """The sum over a world of one rank: nothing changes."""


def _rank_r(shape: tuple[int, ...], r: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    n, m = shape[0], math.prod(shape[1:])
    return (torch.randn(n, r, generator=g) @ torch.randn(r, m, generator=g)).reshape(shape)


@pytest.mark.parametrize(
    ("text", "rank"), [("powersgd", 4), ("powersgd:1", 1), ("PowerSGD:16", 16)]
)
def test_parse_powersgd(text: str, rank: int) -> None:
    codec = parse_compression(text)
    assert isinstance(codec, PowerSGD)
    assert (codec.rank, codec.spec()) == (rank, f"powersgd:{rank}")


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("powersgd:0", "the rank after 'powersgd:' must be an integer >= 1"),
        ("powersgd:-2", "must be an integer >= 1"),
        ("powersgd:two", "must be an integer >= 1"),
        ("fp16:2", "fp16 takes no ':'"),
        ("powerSGD4", "is unknown; choose none, fp16, bf16, int8 or powersgd"),
    ],
)
def test_bad_powersgd_settings_get_one_message(text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_compression(text)


@pytest.mark.parametrize(
    ("shape", "rank", "expected"),
    [
        ((64,), 4, False),  # vectors travel as they are
        ((64, 64), 4, True),
        ((8, 8), 4, False),  # the factors would not be twice smaller
        ((16, 3, 3, 3), 4, True),  # a convolution's kernel as 16 x 27
        ((16, 3, 3, 3), 8, False),
    ],
)
def test_what_is_compressed(shape: tuple[int, ...], rank: int, expected: bool) -> None:
    assert compressible(shape, rank) is expected


def test_orthonormalise() -> None:
    p = torch.randn(30, 4, generator=torch.Generator().manual_seed(0))
    q = orthonormalise(p)
    torch.testing.assert_close(q.T @ q, torch.eye(4), atol=1e-5, rtol=0)
    torch.testing.assert_close(q @ (q.T @ p), p, atol=1e-5, rtol=0)  # the same span


@pytest.mark.parametrize(
    ("shape", "true_rank", "rank"),
    [((40, 30), 3, 3), ((40, 30), 2, 4), ((32, 4, 3, 3), 2, 2)],
    ids=["rank-r", "rank-below-r", "conv"],
)
def test_a_gradient_of_rank_r_is_sent_exactly(
    shape: tuple[int, ...], true_rank: int, rank: int
) -> None:
    codec = PowerSGD(rank, start_step=0)
    grad = _rank_r(shape, true_rank, seed=1)
    bias = torch.randn(shape[0])
    grads = [grad.clone(), bias.clone()]
    nbytes = codec.reduce_(grads, _alone)
    torch.testing.assert_close(grads[0], grad, atol=1e-4, rtol=1e-4)
    assert torch.equal(grads[1], bias)  # uncompressed, untouched
    n, m = shape[0], math.prod(shape[1:])
    assert nbytes == 4 * ((n + m) * rank + shape[0])
    assert float(codec.errors[0].abs().max()) < 1e-4


def test_error_feedback_drives_the_accumulated_error_to_zero() -> None:
    """A constant full-rank gradient, sent at rank 2: the updates sent add up to the gradients
    taken (the error left is bounded, so relative to the sum it falls as 1/t); without the
    feedback they stay the rank-2 part of it, far off."""
    grad = torch.randn(24, 20, generator=torch.Generator().manual_seed(0))

    def relative_error(steps: int, feedback: bool) -> float:
        codec = PowerSGD(2, start_step=0)
        total = torch.zeros_like(grad)
        for _ in range(steps):
            sent = [grad.clone()]
            codec.reduce_(sent, _alone)
            if not feedback:
                codec.errors.clear()
            total += sent[0]
        return float((total - steps * grad).norm() / (steps * grad.norm()))

    early, late = relative_error(100, True), relative_error(400, True)
    assert late < 0.02
    assert late < early / 3  # falling as 1/t
    assert relative_error(400, False) > 0.5


def _summed_over(ranks: int) -> list:
    """``ranks`` summing allreduces that meet in threads, one per virtual rank."""
    barrier = threading.Barrier(ranks)
    parts: list = [None] * ranks

    def make(k: int):
        def allreduce(flat: torch.Tensor, part: str) -> None:
            parts[k] = flat.clone()
            barrier.wait()
            total = torch.stack(parts).sum(0)
            barrier.wait()
            flat.copy_(total)

        return allreduce

    return [make(k) for k in range(ranks)]


@pytest.mark.parametrize("ranks", [2, 3])
def test_error_feedback_adds_up_over_ranks(ranks: int) -> None:
    """Each rank sends its own constant full-rank gradient, weighted 1 / ranks: the updates
    add up to the mean gradient over the steps, as on one rank (each rank keeps only its share
    of what the sum dropped; keeping all of it would feed the loss back ``ranks`` times)."""
    grads = [torch.randn(24, 20, generator=torch.Generator().manual_seed(k)) for k in range(ranks)]
    mean = torch.stack(grads).mean(0)
    steps = 300
    codecs = [PowerSGD(2, start_step=0) for _ in range(ranks)]
    allreduces = _summed_over(ranks)
    totals = [torch.zeros_like(mean) for _ in range(ranks)]

    def run(k: int) -> None:
        for _ in range(steps):
            sent = [grads[k] / ranks]
            codecs[k].reduce_(sent, allreduces[k], ranks)
            totals[k] += sent[0]

    threads = [threading.Thread(target=run, args=(k,)) for k in range(ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for total in totals:
        torch.testing.assert_close(total, totals[0])  # every replica applies the same update
    assert float((totals[0] - steps * mean).norm() / (steps * mean.norm())) < 0.02


def test_the_first_steps_are_plain_allreduces() -> None:
    calls: list[str] = []
    codec = PowerSGD(2, start_step=2)
    grad = torch.randn(24, 20, generator=torch.Generator().manual_seed(0))
    for step in range(3):
        sent = [grad.clone()]
        nbytes = codec.reduce_(sent, lambda flat, part: calls.append(part))
        if step < 2:
            assert torch.equal(sent[0], grad) and nbytes == 4 * grad.numel()
        else:
            assert not torch.equal(sent[0], grad) and nbytes == 4 * (24 + 20) * 2
    assert calls == ["first", "first", "first", "second"]


def test_a_restored_state_continues_bit_identically() -> None:
    grads = [torch.randn(24, 20, generator=torch.Generator().manual_seed(k)) for k in range(6)]
    codec = PowerSGD(2, start_step=1)
    for g in grads[:3]:
        codec.reduce_([g.clone()], _alone)
    again = PowerSGD(2, start_step=1)
    again.load_state_dict(codec.state_dict())
    for g in grads[3:]:
        a, b = [g.clone()], [g.clone()]
        codec.reduce_(a, _alone)
        again.reduce_(b, _alone)
        assert torch.equal(a[0], b[0])
    other = PowerSGD(3, start_step=1)
    other.load_state_dict(codec.state_dict())  # another rank: starts afresh
    assert (other.step, other.errors, other.qs) == (0, {}, {})


def test_bsp_with_powersgd_keeps_its_state_in_the_policy_state() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(30, 40), nn.Tanh(), nn.Linear(40, 5))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    policy = BSP(compression="powersgd:2")
    for _ in range(12):
        for p in model.parameters():
            p.grad = torch.ones_like(p)
        record = policy.step(model, opt)
    state = policy.state_dict()
    assert state["compression"] == "powersgd:2" and state["codec"]["step"] == 12
    # Past the plain steps: both weights (40 x 30, 5 x 40) as rank-2 factors, biases as they are.
    assert record.bytes == 4 * ((40 + 30) * 2 + 40 + (5 + 40) * 2 + 5)
    again = BSP(compression="powersgd:2")
    again.load_state_dict(state)
    assert isinstance(again.codec, PowerSGD) and again.codec.step == 12


def test_powersgd_is_refused_where_it_is_not_built() -> None:
    with pytest.raises(ValueError, match="compression 'powersgd:4' is not built for sync 'fedavg'"):
        FedAvg(compression="powersgd")
    with pytest.raises(ValueError, match="not built for sync 'selsync'"):
        SelSync(aggregation="grads", compression="powersgd")


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"compression": "powersgd:0"}, "must be an integer >= 1"),
        ({"compression": "powersgd", "sync": "fedavg"}, r"not built for sync fedavg \(it takes"),
    ],
    ids=["rank-0", "fedavg"],
)
def test_bad_powersgd_configurations_are_named(kw: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as e:
        TrainConfig(**kw)
    assert e.value.key == "compression"
    assert TrainConfig(compression="powersgd:8").compression == "powersgd:8"
    assert TrainConfig(compression="powersgd:2", overlap=True).overlap  # one round per bucket
