"""hethpc.comm on CUDA tensors, on real ranks: what only a GPU shows (pinned staging, side-stream
copies, CUDA events, the poster thread's fences), with closed-form answers.

Skipped where no GPU is visible (every CPU machine, CI among them). On a GPU machine the device
check runs it on 2 ranks that may share one GPU (``scripts/device_check.sh``, step
``cuda_tests``); NCCL needs a GPU per rank, so run it with ``HETHPC_TEST_TRANSPORT=mpi`` there
when ranks share a GPU.
"""

from __future__ import annotations

import pytest
import torch

from hethpc import comm
from hethpc.comm import ReduceOp
from hethpc.train import this_device

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


@pytest.fixture(scope="module")
def dev(world: tuple[int, int]) -> torch.device:
    """This rank's GPU (local rank mod GPUs: ranks may share one)."""
    return this_device("cuda", comm.local_rank())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_allreduce_sum_and_average(
    world: tuple[int, int], dev: torch.device, dtype: torch.dtype
) -> None:
    r, n = world
    x = torch.full((1000, 3), float(r + 1), dtype=dtype, device=dev)
    total = comm.allreduce(x, ReduceOp.SUM)
    assert total.device == dev and total.dtype == dtype
    torch.testing.assert_close(total, torch.full_like(x, n * (n + 1) / 2))
    mean = comm.allreduce(x, ReduceOp.AVERAGE)
    torch.testing.assert_close(mean, torch.full_like(x, (n + 1) / 2))
    torch.testing.assert_close(x, torch.full_like(x, float(r + 1)))  # the input untouched


def test_allreduce_in_place_on_a_parameter(world: tuple[int, int], dev: torch.device) -> None:
    r, n = world
    weight = torch.nn.Parameter(torch.full((5,), float(r), device=dev))  # requires grad
    out = comm.allreduce_(weight, ReduceOp.SUM)
    assert out is weight
    torch.testing.assert_close(weight.detach(), torch.full((5,), n * (n - 1) / 2, device=dev))


def test_grouped_allreduce_mixed_dtypes(world: tuple[int, int], dev: torch.device) -> None:
    r, n = world
    ts = [torch.full((4,), float(r), device=dev),
          torch.full((2, 3), 2.0 * r, dtype=torch.float64, device=dev),
          torch.full((7,), float(r), dtype=torch.bfloat16, device=dev)]  # fmt: skip
    s = n * (n - 1) / 2
    comm.grouped_allreduce_(ts, ReduceOp.SUM)
    torch.testing.assert_close(ts[0], torch.full((4,), s, device=dev))
    torch.testing.assert_close(ts[1], torch.full((2, 3), 2.0 * s, dtype=torch.float64, device=dev))
    torch.testing.assert_close(ts[2], torch.full((7,), s, dtype=torch.bfloat16, device=dev))


def test_many_allreduces_reuse_the_pinned_buffers(
    world: tuple[int, int], dev: torch.device
) -> None:
    """Back-to-back reductions of one shape: a buffer reused while its copy ran would show."""
    r, n = world
    for k in range(50):
        x = torch.full((4096,), float(r + k), device=dev)
        got = comm.allreduce(x, ReduceOp.SUM)
        assert got[0].item() == n * k + n * (n - 1) / 2, k


def test_broadcast_model_and_optimizer(world: tuple[int, int], dev: torch.device) -> None:
    r, _ = world
    torch.manual_seed(100 + r)  # different weights on every rank
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4)).to(dev)
    model(torch.randn(8, 3, device=dev))  # moves the BatchNorm running statistics
    opt = torch.optim.SGD(model.parameters(), lr=0.1 * (r + 1), momentum=0.9)
    model(torch.randn(8, 3, device=dev)).sum().backward()
    opt.step()
    comm.broadcast_model(model)
    comm.broadcast_optimizer_state(opt)
    assert all(p.device == dev for p in model.parameters())
    state = comm.on_host(model.state_dict())
    for other in comm.allgather_object(state):
        for k, v in state.items():
            torch.testing.assert_close(other[k], v, rtol=0, atol=0, msg=k)
    momentum = opt.state[next(iter(model.parameters()))]["momentum_buffer"]
    assert momentum.device == dev
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1)


@pytest.mark.parametrize(
    "dtype,shape",
    [(torch.float32, (2, 3)), (torch.bfloat16, (5,)), (torch.int64, ()), (torch.float64, (0, 4)),
     (torch.float32, (300_000,))],
    ids=["f32-2x3", "bf16-5", "i64-scalar", "f64-empty", "f32-large"],
)  # fmt: skip
def test_send_recv_ring(
    world: tuple[int, int], dev: torch.device, dtype: torch.dtype, shape: tuple[int, ...]
) -> None:
    r, n = world
    if n == 1:
        pytest.skip("needs two ranks")

    def make(k: int) -> torch.Tensor:
        full_shape = (shape[0] + k, *shape[1:]) if shape else ()
        return torch.full(full_shape, k, dtype=dtype, device=dev)

    req = comm.isend_tensor(make(r), (r + 1) % n, tag=7)
    got = comm.recv_tensor((r - 1) % n, tag=7, device=dev)
    req.wait()
    assert got.device == dev
    torch.testing.assert_close(got, make((r - 1) % n))


def test_sends_of_tensors_dropped_at_once(world: tuple[int, int], dev: torch.device) -> None:
    """Each send's tensor is freed by the caller right away and its memory handed to the next
    one by the caching allocator; the bytes sent must still be each send's own."""
    r, n = world
    if n == 1:
        pytest.skip("needs two ranks")
    size = 1 << 20
    sends = [comm.isend_tensor(torch.full((size,), float(10 * r + k), device=dev), (r + 1) % n,
                               tag=20 + k) for k in range(8)]  # fmt: skip
    for k in range(8):
        got = comm.recv_tensor((r - 1) % n, tag=20 + k, device=dev)
        torch.testing.assert_close(got, torch.full((size,), float(10 * ((r - 1) % n) + k),
                                                   device=dev))  # fmt: skip
    for s in sends:
        s.wait()


def test_irecv_posted_before_the_send(world: tuple[int, int], dev: torch.device) -> None:
    r, n = world
    if n == 1:
        pytest.skip("needs two ranks")
    reqs = {t: comm.irecv_tensor((r - 1) % n, tag=t, device=dev) for t in (4, 3)}
    comm.barrier()
    sends = [comm.isend_tensor(torch.full((9,), 10.0 * r + t, device=dev), (r + 1) % n, tag=t)
             for t in (3, 4)]  # fmt: skip
    for t, q in reqs.items():
        torch.testing.assert_close(q.wait(), torch.full((9,), 10.0 * ((r - 1) % n) + t,
                                                        device=dev))  # fmt: skip
    for s in sends:
        s.wait()


def test_transfers_name_the_gpu_paths(world: tuple[int, int], dev: torch.device) -> None:
    _, n = world
    t = comm.transfers()
    assert t.gpu is True
    if n > 1:
        assert t.p2p in ("CUDA-aware MPI (direct)", "pinned host staging")
        assert t.cuda_aware_mpi is not None and t.cuda_aware_source
