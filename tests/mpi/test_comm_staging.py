"""The CUDA send and receive paths of hethpc.comm.p2p, driven with CPU tensors on real ranks.

Without a GPU the paths a CUDA tensor takes (pinned staging, or straight to a CUDA-aware MPI)
run here on CPU tensors: the same deferred posting (the poster thread hands a payload to MPI only
once its fence has passed, in the order the sends started), the same buffer pool and the same
receive side.
What only a GPU shows (pinned memory, side-stream copies, CUDA events, mpi4py reading device
memory) is not run here: tests/mpi/test_comm_cuda.py runs it where a GPU is visible.
"""

from __future__ import annotations

import threading

import pytest
import torch

from hethpc import comm
from hethpc.comm import p2p, staging


class Gate:
    """A fence that passes when the test opens it (a CUDA event whose copy is still running)."""

    def __init__(self) -> None:
        self.open = threading.Event()

    def query(self) -> bool:
        return self.open.is_set()

    def synchronize(self) -> None:
        self.open.wait(timeout=30)


def _value(k: int) -> torch.Tensor:
    return torch.full((256, 3), float(k)) + torch.arange(3.0)


@pytest.mark.parametrize("route", [p2p.STAGED, p2p.DIRECT])
def test_sends_with_one_tag_arrive_in_order_whatever_their_fences(
    world: tuple[int, int], route: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    r, n = world
    if n == 1:
        pytest.skip("needs two ranks")
    g = comm.world()
    count = 5
    if r == 0:
        gates = [Gate() for _ in range(count)]
        it = iter(gates)
        real = staging.to_host

        def slow_to_host(t: torch.Tensor, pool: staging.HostBuffers) -> tuple[torch.Tensor, Gate]:
            host, _ = real(t, pool)
            return host, next(it)

        monkeypatch.setattr(staging, "to_host", slow_to_host)
        monkeypatch.setattr(staging, "ready_fence", lambda _t: next(it))
        reqs = [p2p._isend_cuda(_value(k), 1, 7, g, route) for k in range(count)]
        assert not any(q.test() for q in reqs)  # no copy has "finished": nothing is posted
        for gate in reversed(gates):  # later sends' copies finish first
            gate.open.set()
        for q in reqs:
            q.wait()
        assert not p2p._poster.queue
    elif r == 1:
        for k in range(count):
            req = p2p.RecvRequest(g.mpi_comm, 0, 7, torch.device("cpu"), route=route)
            torch.testing.assert_close(req.wait(), _value(k))
    comm.barrier()


def test_staged_buffers_are_reused_across_steps(world: tuple[int, int]) -> None:
    r, n = world
    if n == 1:
        pytest.skip("needs two ranks")
    g = comm.world()
    pool = staging.pool()
    before = pool.allocated
    for step in range(4):
        if r == 0:
            req = p2p._isend_cuda(_value(step), 1, 3, g, p2p.STAGED)
            req.wait()
        elif r == 1:
            got = p2p.RecvRequest(g.mpi_comm, 0, 3, torch.device("cpu"), route=p2p.STAGED)
            torch.testing.assert_close(got.wait(), _value(step))
    if r in (0, 1):
        assert pool.allocated - before <= 1  # one buffer, made in the first step, reused
    comm.barrier()


def test_cpu_tensors_never_touch_the_pool(world: tuple[int, int]) -> None:
    r, n = world
    if n == 1:
        pytest.skip("needs two ranks")
    made = staging.pool().allocated
    if r == 0:
        comm.send_tensor(_value(1), 1, tag=11)
    elif r == 1:
        torch.testing.assert_close(comm.recv_tensor(0, tag=11), _value(1))
    assert staging.pool().allocated == made and not p2p._poster.queue
    comm.barrier()


def test_staged_collectives_give_the_same_sums(
    world: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The collectives' staging (pinned copies out and back, pooled) on CPU tensors."""
    from hethpc.comm import broadcast, collectives

    r, n = world
    monkeypatch.setattr(collectives, "_needs_staging", lambda _ts: True)
    monkeypatch.setattr(broadcast, "_needs_staging", lambda _ts: True)
    want = torch.full((5, 2), n * (n + 1) / 2)
    for _ in range(3):  # repeated steps reuse the pool's buffers
        t = torch.full((5, 2), float(r + 1))
        torch.testing.assert_close(comm.allreduce(t, comm.ReduceOp.SUM), want)
        torch.testing.assert_close(t, torch.full((5, 2), float(r + 1)))  # untouched
        comm.allreduce_(t, comm.ReduceOp.SUM)
        torch.testing.assert_close(t, want)
        a = torch.full((7,), float(r + 1))
        comm.allreduce_async_(a, comm.ReduceOp.SUM, name="staged.async").wait()
        torch.testing.assert_close(a, torch.full((7,), n * (n + 1) / 2))
    model = torch.nn.Linear(3, 2)
    torch.nn.init.constant_(model.weight, float(r))
    comm.broadcast_model(model)
    torch.testing.assert_close(model.weight, torch.zeros(2, 3), check_device=False)


def test_a_staged_send_moves_while_its_sender_waits_in_another_mpi_call(
    world: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sender enters a barrier without waiting for its send; the receiver needs the tensor
    before it reaches the barrier. The poster thread posts it once its copy is done."""
    r, n = world
    if n == 1:
        pytest.skip("needs two ranks")
    g = comm.world()
    if r == 0:
        gate = Gate()
        real = staging.to_host
        monkeypatch.setattr(staging, "to_host", lambda t, pool: (real(t, pool)[0], gate))
        req = p2p._isend_cuda(_value(9), 1, 5, g, p2p.STAGED)
        threading.Timer(0.2, gate.open.set).start()  # the copy "finishes" while in the barrier
        comm.barrier()
        req.wait()
    elif r == 1:
        got = p2p.RecvRequest(g.mpi_comm, 0, 5, torch.device("cpu"), route=p2p.STAGED).wait()
        torch.testing.assert_close(got, _value(9))
        comm.barrier()
    else:
        comm.barrier()


class Broken:
    """A fence whose copy failed (a CUDA error)."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")


def test_a_failed_copy_is_raised_by_the_senders_wait(
    world: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    r, n = world
    if n == 1:
        pytest.skip("needs two ranks")
    if r == 0:
        real = staging.to_host
        monkeypatch.setattr(staging, "to_host", lambda t, pool: (real(t, pool)[0], Broken()))
        req = p2p._isend_cuda(_value(1), 1, 13, comm.world(), p2p.STAGED)
        with pytest.raises(comm.CommError, match="posting a CUDA tensor to rank 1 failed"):
            req.wait()
        assert not p2p._poster.queue  # the poster goes on with the next sends
    comm.barrier()
