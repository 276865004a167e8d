"""CUDA-aware MPI detection and the transfer paths: pure decisions from literal inputs; the
staging pool's reuse on CPU (no GPU needed)."""

from __future__ import annotations

import pytest
import torch

from hethpc.comm import staging
from hethpc.comm.cuda_aware import (
    CudaAwareness,
    decide,
    describe_transfers,
    parse_ompi_info,
    probe,
)

# Excerpts of `ompi_info --parsable --all` (Open MPI 4.1.4 here; the key names of 4.x and 5.x).
OMPI_4_NO = """\
options:mpi_ext:affinity, cuda, pcollreq
mca:opal:base:param:opal_built_with_cuda_support:value:false
mca:opal:base:param:opal_built_with_cuda_support:enumerator:value:1:true
mca:mpi:base:param:mpi_built_with_cuda_support:value:false
mca:mpi:base:param:mpi_built_with_cuda_support:enumerator:value:0:false
"""
OMPI_4_YES = "mca:mpi:base:param:mpi_built_with_cuda_support:value:true\n"
OMPI_5_YES = "mca:opal:base:param:opal_built_with_cuda_support:value:true\n"
NOT_OMPI = "MPICH Version: 4.1\n"


@pytest.mark.parametrize(
    "text, expected",
    [
        pytest.param(OMPI_4_NO, False, id="ompi4-without-cuda"),
        pytest.param(OMPI_4_YES, True, id="ompi4-with-cuda"),
        pytest.param(OMPI_5_YES, True, id="ompi5-opal-key"),
        pytest.param(NOT_OMPI, None, id="no-such-key"),
        pytest.param("", None, id="empty"),
    ],
)
def test_parse_ompi_info(text: str, expected: bool | None) -> None:
    assert parse_ompi_info(text) is expected


@pytest.mark.parametrize(
    "query, mpix, info, aware, source",
    [
        pytest.param(True, None, None, True, "MPI.Query_cuda_support()", id="query-yes"),
        pytest.param(False, True, OMPI_4_YES, False, "MPI.Query_cuda_support()",
                     id="query-wins-over-the-rest"),
        pytest.param(None, True, OMPI_4_NO, True, "MPIX_Query_cuda_support()",
                     id="mpix-runtime-wins-over-build-flag"),
        pytest.param(None, None, OMPI_4_YES, True, "ompi_info mpi_built_with_cuda_support",
                     id="build-flag"),
        pytest.param(None, None, OMPI_4_NO, False, "ompi_info mpi_built_with_cuda_support",
                     id="build-flag-no"),
        pytest.param(None, None, NOT_OMPI, False, "no probe answered (assumed not CUDA-aware)",
                     id="unknown-output"),
        pytest.param(None, None, None, False, "no probe answered (assumed not CUDA-aware)",
                     id="nothing"),
    ],
)  # fmt: skip
def test_decide(
    query: bool | None, mpix: bool | None, info: str | None, aware: bool, source: str
) -> None:
    assert decide(query=query, mpix=mpix, ompi_info=info) == CudaAwareness(aware, source)


YES, NO = CudaAwareness(True, "q"), CudaAwareness(False, "q")


@pytest.mark.parametrize(
    "gpu, world, aware, nccl, hvd_cuda, p2p, allreduce",
    [
        pytest.param(False, 1, None, False, False, "none", "none", id="one-process"),
        pytest.param(False, 2, None, False, False, "host memory", "host memory", id="cpu"),
        pytest.param(True, 2, YES, True, False, "CUDA-aware MPI (direct)", "Horovod NCCL",
                     id="gpu-aware-nccl"),
        pytest.param(True, 2, NO, True, False, "pinned host staging", "Horovod NCCL",
                     id="gpu-staged-p2p-nccl"),
        pytest.param(True, 2, YES, False, True, "CUDA-aware MPI (direct)",
                     "Horovod CUDA-aware MPI", id="gpu-horovod-mpi-gpu-ops"),
        pytest.param(True, 4, NO, False, False, "pinned host staging", "pinned host staging",
                     id="gpu-cpu-horovod"),
    ],
)  # fmt: skip
def test_describe_transfers(
    gpu: bool, world: int, aware: CudaAwareness | None, nccl: bool, hvd_cuda: bool,
    p2p: str, allreduce: str,
) -> None:  # fmt: skip
    t = describe_transfers(gpu=gpu, world=world, aware=aware, nccl=nccl, hvd_cuda=hvd_cuda)
    assert (t.p2p, t.allreduce) == (p2p, allreduce)
    assert t.cuda_aware_mpi == (aware.aware if aware is not None and world > 1 else None)
    assert set(t.as_dict()) == {"gpu", "cuda_aware_mpi", "cuda_aware_source", "p2p", "allreduce"}


class FakeMPI:
    """The few mpi4py names the probe reads."""

    def __init__(self, vendor: str, query: object = None) -> None:
        self._vendor = vendor
        if query is not None:
            self.Query_cuda_support = query

    def get_vendor(self) -> tuple[str, tuple[int, int, int]]:
        return self._vendor, (4, 1, 4)


def test_probe_stops_at_the_runtime_query() -> None:
    assert probe(FakeMPI("Open MPI", lambda: True)) == CudaAwareness(
        True, "MPI.Query_cuda_support()"
    )


def test_probe_without_query_on_this_machine() -> None:
    """This machine's own answer (not CUDA-aware: no CUDA here), whichever probe gives it."""
    got = probe(FakeMPI("Open MPI"))
    assert got.aware is False


class Later:
    """A fence that passes after ``n`` queries (an event still running on a stream)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def query(self) -> bool:
        self.n -= 1
        return self.n < 0

    def synchronize(self) -> None:
        self.n = -1


def test_host_buffers_are_reused_once_their_fence_passes() -> None:
    pool = staging.HostBuffers(pin=False)
    a = pool.take(64)
    assert a.dtype == torch.uint8 and a.shape == (64,)
    pool.give(a, Later(1))
    b = pool.take(64)  # a's fence has not passed yet: a new buffer
    assert b.data_ptr() != a.data_ptr() and pool.allocated == 2
    pool.give(b)
    c, d = pool.take(64), pool.take(64)  # both back now
    assert {c.data_ptr(), d.data_ptr()} == {a.data_ptr(), b.data_ptr()}
    assert pool.allocated == 2
    pool.give(c)
    assert pool.take(32).numel() == 32 and pool.allocated == 3  # another size: its own buffer


def test_steps_reuse_the_same_buffers() -> None:
    pool = staging.HostBuffers(pin=False)
    for _ in range(5):  # a step: two messages in flight, then both done
        bufs = [pool.take(1024), pool.take(1024)]
        for b in bufs:
            pool.give(b)
    assert pool.allocated == 2 and pool.cached() == 2


@pytest.mark.parametrize(
    "tensor",
    [
        pytest.param(torch.arange(12.0).reshape(3, 4), id="float32"),
        pytest.param(torch.arange(6).reshape(2, 3).t(), id="int64-non-contiguous"),
        pytest.param(torch.tensor([True, False, True]), id="bool"),
        pytest.param(torch.tensor(2.5, dtype=torch.float64), id="scalar"),
    ],
)
def test_to_host_and_back_keeps_the_values(tensor: torch.Tensor) -> None:
    pool = staging.HostBuffers(pin=False)
    host, fence = staging.to_host(tensor, pool)
    fence.synchronize()
    assert host.numel() == tensor.numel() * tensor.element_size()
    back = staging.to_device(host, tensor.dtype, tuple(tensor.shape), torch.device("cpu"), pool)
    torch.testing.assert_close(back, tensor)
    assert pool.cached() == 1  # the buffer went back


def test_host_copy_and_copy_back() -> None:
    t = torch.arange(10.0)
    host = staging.host_copy(t)
    assert host.dtype == t.dtype and host.shape == t.shape
    host.mul_(2)
    staging.copy_back(t, host)
    torch.testing.assert_close(t, torch.arange(10.0) * 2)
    weight = torch.nn.Parameter(torch.ones(3))  # a leaf that requires grad, as reduced in place
    staging.copy_back(weight, staging.host_copy(weight.detach() * 3))
    torch.testing.assert_close(weight.detach(), torch.full((3,), 3.0))


def test_say_once(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="hethpc.comm"):
        for _ in range(3):
            staging.say_once("test-key", "staged")
    assert [r.getMessage() for r in caplog.records] == ["hethpc.comm: staged"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="pinned memory works here")
def test_pool_falls_back_to_pageable_memory_when_pinning_fails(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pool = staging.HostBuffers(pin=True)  # no CUDA here: page-locking is refused
    with caplog.at_level("WARNING", logger="hethpc.comm"):
        a, b = pool.take(16), pool.take(16)
    assert a.numel() == b.numel() == 16 and not a.is_pinned() and pool.pin is False
    assert any("pageable memory" in r.getMessage() for r in caplog.records)
