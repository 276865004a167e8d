"""Waiting for a late rank sleeps instead of spinning (its thread uses almost no CPU; Horovod's
background thread, when running, is its own), and counts as time in collectives."""

from __future__ import annotations

import time

import pytest

from hethpc import comm

LATE_S = 0.4


@pytest.mark.timeout(60)
def test_a_rank_waiting_for_a_late_one_uses_almost_no_cpu() -> None:
    late = comm.size() - 1
    comm.barrier()
    if comm.rank() == late:
        time.sleep(LATE_S)
    before = comm.comm_seconds()
    t0, c0 = time.perf_counter(), time.thread_time()
    comm.barrier()
    wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
    assert comm.comm_seconds() - before == pytest.approx(wall, abs=0.01)
    if comm.rank() != late:
        assert wall > 0.8 * LATE_S
        assert cpu < 0.15 * wall, f"{cpu:.3f} s of CPU in a {wall:.3f} s wait"


@pytest.mark.timeout(60)
def test_waiting_in_an_allreduce_also_sleeps() -> None:
    import torch

    late = comm.size() - 1
    comm.barrier()
    if comm.rank() == late:
        time.sleep(LATE_S)
    t = torch.full((1000,), float(comm.rank()))
    t0, c0 = time.perf_counter(), time.thread_time()
    comm.allreduce_(t, comm.ReduceOp.SUM)
    wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
    n = comm.size()
    torch.testing.assert_close(t, torch.full((1000,), float(n * (n - 1) / 2)))
    if comm.rank() != late:
        assert cpu < 0.15 * wall, f"{cpu:.3f} s of CPU in a {wall:.3f} s wait"
