"""hethpc.comm on real ranks: each result is checked against a closed form on every rank."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from hethpc import comm
from hethpc.comm import ReduceOp


def test_init_is_idempotent(world: tuple[int, int]) -> None:
    comm.init()
    assert (comm.rank(), comm.size()) == world
    assert 0 <= comm.local_rank() < comm.local_size() <= comm.size()


def test_transport_is_the_one_asked_for(world: tuple[int, int]) -> None:
    asked = os.environ.get("HETHPC_TEST_TRANSPORT") or "auto"
    want = {"auto": "horovod" if torch.cuda.is_available() else "mpi"}.get(asked, asked)
    st = comm.runtime.state()
    if world[1] == 1:
        assert comm.transport() == "none"
        return
    assert comm.transport() == want
    assert (st.hvd is None) == (want == "mpi")  # the mpi transport never starts Horovod
    comm.init(transport="auto")  # auto accepts the one started
    other = "horovod" if want == "mpi" else "mpi"
    with pytest.raises(comm.CommError, match=f"started with transport '{want}'"):
        comm.init(transport=other)


def test_barrier(world: tuple[int, int]) -> None:
    comm.barrier()


def test_allgather_object(world: tuple[int, int]) -> None:
    r, n = world
    got = comm.allgather_object({"rank": r, "name": f"r{r}"})
    assert got == [{"rank": k, "name": f"r{k}"} for k in range(n)]


def test_allgather_array(world: tuple[int, int]) -> None:
    r, n = world
    got = comm.allgather_array(np.array([r, 10.0 * r]))
    np.testing.assert_array_equal(got, np.array([[k, 10.0 * k] for k in range(n)]))


def test_allgather_array_shape_mismatch_raises_on_every_rank(world: tuple[int, int]) -> None:
    r, n = world
    if n == 1:
        pytest.skip("needs two ranks")
    with pytest.raises(comm.CommError, match="same shape"):
        comm.allgather_array(np.zeros(r + 1))


def test_allreduce_array_votes(world: tuple[int, int]) -> None:
    r, n = world
    votes = comm.allreduce_array(np.array([1 if r == n - 1 else 0], dtype=np.int32))
    assert votes.tolist() == [1]
    assert comm.allreduce_array(np.array([r]), ReduceOp.MAX).tolist() == [n - 1]


def test_broadcast_object(world: tuple[int, int]) -> None:
    r, _ = world
    assert comm.broadcast_object({"from": r}) == {"from": 0}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_allreduce_sum_and_average(world: tuple[int, int], dtype: torch.dtype) -> None:
    r, n = world
    x = torch.full((3, 2), float(r + 1), dtype=dtype)
    total = n * (n + 1) / 2
    expected_sum = torch.full((3, 2), total, dtype=dtype)
    torch.testing.assert_close(comm.allreduce(x, ReduceOp.SUM), expected_sum)
    torch.testing.assert_close(comm.allreduce(x), torch.full((3, 2), total / n, dtype=dtype))
    assert x[0, 0].item() == r + 1, "allreduce must not change its input"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("numel", [1, 2, 3, 1000])
def test_allreduce_of_16_bit_floats_fewer_than_the_ranks(
    world: tuple[int, int], dtype: torch.dtype, numel: int
) -> None:
    # hethpc's own MPI sum of 16-bit floats; Open MPI's ring (scripts/openmpi_env.sh) hands it
    # empty pieces when a buffer has fewer elements than there are ranks
    r, n = world
    x = torch.full((numel,), float(r + 1), dtype=dtype)
    comm.allreduce_(x, ReduceOp.SUM)
    assert torch.equal(x, torch.full((numel,), n * (n + 1) / 2, dtype=dtype))


def test_the_nonblocking_allreduce_is_the_ring(world: tuple[int, int]) -> None:
    # set by scripts/mpirun.sh, or by comm.init() before MPI starts; Open MPI's default for an
    # in-place buffer is a reduce and a broadcast, one direction of a link at a time
    if "OMPI_COMM_WORLD_SIZE" not in os.environ:
        pytest.skip("Open MPI's setting")
    assert os.environ.get("OMPI_MCA_coll_libnbc_iallreduce_algorithm") == "1"


def test_allreduce_prescale(world: tuple[int, int]) -> None:
    r, n = world
    x = torch.tensor([float(r + 1)], dtype=torch.float64)
    got = comm.allreduce(x, ReduceOp.SUM, prescale=0.5)
    torch.testing.assert_close(got, torch.tensor([0.5 * n * (n + 1) / 2], dtype=torch.float64))


def test_allreduce_in_place(world: tuple[int, int]) -> None:
    r, n = world
    x = torch.tensor([float(r)])
    out = comm.allreduce_(x, ReduceOp.SUM)
    assert out is x
    assert x.item() == n * (n - 1) / 2


def test_grouped_allreduce(world: tuple[int, int]) -> None:
    r, n = world
    ts = [torch.full((4,), float(r)), torch.full((2, 3), 2.0 * r, dtype=torch.float64)]
    got = comm.grouped_allreduce(ts, ReduceOp.SUM)
    s = n * (n - 1) / 2
    torch.testing.assert_close(got[0], torch.full((4,), s))
    torch.testing.assert_close(got[1], torch.full((2, 3), 2.0 * s, dtype=torch.float64))
    comm.grouped_allreduce_(ts, ReduceOp.AVERAGE, prescale=2.0)
    torch.testing.assert_close(ts[0], torch.full((4,), 2.0 * s / n))


def test_broadcast_model_and_optimizer(world: tuple[int, int]) -> None:
    r, _ = world
    torch.manual_seed(100 + r)  # different weights on every rank
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    model.train()
    model(torch.randn(8, 3))  # moves the BatchNorm running statistics
    opt = torch.optim.SGD(model.parameters(), lr=0.1 * (r + 1), momentum=0.9)
    model(torch.randn(8, 3)).sum().backward()
    opt.step()
    comm.broadcast_model(model)
    comm.broadcast_optimizer_state(opt)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    gathered = comm.allgather_object({k: v.numpy() for k, v in state.items()})
    for other in gathered:
        for k, v in state.items():
            np.testing.assert_array_equal(other[k], v.numpy(), err_msg=k)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1)


def test_group_allreduce_and_allgather(world: tuple[int, int]) -> None:
    r, n = world
    evens = comm.new_group([k for k in range(n) if k % 2 == 0])
    odds = comm.new_group([k for k in range(n) if k % 2 == 1]) if n > 1 else None
    mine = evens if r % 2 == 0 else odds
    assert mine is not None and mine.is_member
    expected = float(sum(mine.ranks))
    got = comm.allreduce(torch.tensor([float(r)]), ReduceOp.SUM, group=mine)
    assert got.item() == expected
    assert comm.allgather_object(r, group=mine) == list(mine.ranks)


def test_group_refuses_non_member(world: tuple[int, int]) -> None:
    r, n = world
    if n == 1:
        pytest.skip("needs two ranks")
    only_zero = comm.new_group([0])
    if r != 0:
        with pytest.raises(comm.CommError, match="not a member"):
            comm.barrier(group=only_zero)
    comm.barrier()


@pytest.mark.parametrize(
    "dtype,shape",
    [(torch.float32, (2, 3)), (torch.bfloat16, (5,)), (torch.int64, ()), (torch.float64, (0, 4))],
    ids=["f32-2x3", "bf16-5", "i64-scalar", "f64-empty"],
)
def test_send_recv_ring(world: tuple[int, int], dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    r, n = world
    if n == 1:
        pytest.skip("needs two ranks")
    # Rank r sends a tensor filled with r (shape grown by r rows) to r+1, receives from r-1.
    def make(k: int) -> torch.Tensor:
        full_shape = (shape[0] + k, *shape[1:]) if shape else ()
        return torch.full(full_shape, k, dtype=dtype)

    req = comm.isend_tensor(make(r), (r + 1) % n, tag=7)
    got = comm.recv_tensor((r - 1) % n, tag=7)
    req.wait()
    torch.testing.assert_close(got, make((r - 1) % n))


@pytest.mark.parametrize(
    "dtype,shape",
    [(torch.float32, (2, 3)), (torch.int64, ()), (torch.float64, (0, 4))],
    ids=["f32-2x3", "i64-scalar", "f64-empty"],
)
def test_irecv_posted_before_the_send(
    world: tuple[int, int], dtype: torch.dtype, shape: tuple[int, ...]
) -> None:
    r, n = world
    if n == 1:
        pytest.skip("needs two ranks")

    def make(k: int, tag: int) -> torch.Tensor:
        full_shape = (shape[0] + k, *shape[1:]) if shape else ()
        return torch.full(full_shape, 10 * k + tag, dtype=dtype)

    # Two receives posted out of order, completed by tag, before any send exists.
    reqs = {t: comm.irecv_tensor((r - 1) % n, tag=t) for t in (4, 3)}
    comm.barrier()
    sends = [comm.isend_tensor(make(r, t), (r + 1) % n, tag=t) for t in (3, 4)]
    got = {t: q.wait() for t, q in reqs.items()}
    for s in sends:
        s.wait()
    for t in (3, 4):
        torch.testing.assert_close(got[t], make((r - 1) % n, t))


def test_irecv_test_progresses_until_done(world: tuple[int, int]) -> None:
    r, n = world
    if n == 1:
        pytest.skip("needs two ranks")
    big = torch.arange(300_000, dtype=torch.float32) + r  # above the eager limit: a rendezvous
    req = comm.irecv_tensor((r - 1) % n, tag=9)
    send = comm.isend_tensor(big, (r + 1) % n, tag=9)
    while not (req.test() and send.test()):
        pass
    torch.testing.assert_close(req.wait(), torch.arange(300_000, dtype=torch.float32) + (r - 1) % n)


def test_irecv_refuses_itself(world: tuple[int, int]) -> None:
    r, n = world
    with pytest.raises(comm.CommError, match="irecv_tensor"):
        comm.irecv_tensor(r)
