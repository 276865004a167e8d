"""Link emulation on real ranks: each collective lasts as long as on the emulated link."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from hethpc import comm
from hethpc.comm import Link, ReduceOp


@pytest.fixture(autouse=True)
def _link_off() -> object:
    yield
    comm.set_link(None)


def _timed(fn: object, link: Link | None) -> float:
    comm.set_link(None)
    comm.barrier()
    comm.set_link(link)
    t0 = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - t0


@pytest.mark.parametrize("nbytes", [4_000, 400_000, 4_000_000], ids=["4KB", "400KB", "4MB"])
def test_a_tensor_allreduce_lasts_as_on_the_link(nbytes: int) -> None:
    comm.init()
    n = comm.size()
    link = Link(bandwidth=50e6, latency=2e-3)  # 400 Mbit/s, 2 ms: well above the real cost
    t = torch.ones(nbytes // 4)
    took = _timed(lambda: comm.grouped_allreduce_([t], ReduceOp.SUM), link)
    want = link.allreduce_s(nbytes, n)
    assert want <= took + 1e-4 and took < want + 0.05, (took, want)
    assert torch.all(t == n)  # the real reduction happened
    if n > 1:
        assert comm.link_stats().bytes == nbytes and comm.link_stats().calls == 1


def test_small_arrays_pay_the_latency() -> None:
    comm.init()
    link = Link(bandwidth=1e9, latency=5e-3)
    took = _timed(lambda: comm.allreduce_array(np.ones(4), ReduceOp.SUM), link)
    want = link.allreduce_s(32, comm.size())
    assert want <= took + 1e-4 and took < want + 0.05, (took, want)


def test_off_adds_nothing() -> None:
    comm.init()
    t = torch.ones(1000)
    took = _timed(lambda: comm.grouped_allreduce_([t], ReduceOp.SUM), None)
    assert took < 0.05 and comm.link_stats().calls == 0


@pytest.mark.parametrize("posted_early", [False, True], ids=["recv", "irecv-wait"])
def test_a_point_to_point_message_arrives_as_on_the_link(posted_early: bool) -> None:
    comm.init()
    if comm.size() < 2:
        pytest.skip("needs two ranks")
    r = comm.rank()
    link = Link(bandwidth=50e6, latency=2e-3)
    t = torch.ones(100_000)  # 400 KB: 8 ms on the link, plus 2 ms
    req = comm.irecv_tensor(0, tag=5) if posted_early and r == 1 else None
    comm.barrier()
    comm.set_link(link)
    sent = got = 0.0
    if r == 0:
        sent = time.time()
        comm.send_tensor(t, 1, tag=5)
    elif r == 1:
        out = req.wait() if req is not None else comm.recv_tensor(0, tag=5)
        got = time.time()
        assert torch.equal(out, t)
    comm.set_link(None)
    times = comm.allgather_object((sent, got))
    if r == 1:
        took, want = times[1][1] - times[0][0], link.p2p_s(400_000)
        assert want - 1e-3 <= took < want + 0.05, (took, want)
