"""hethpc.comm in a plain process: a world of size 1 that makes no collective call."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from hethpc import comm

pytestmark = pytest.mark.skipif(
    "OMPI_COMM_WORLD_SIZE" in os.environ, reason="checks the single-process world"
)


def test_plain_process_starts_no_mpi() -> None:
    code = (
        "import sys, torch\n"
        "from hethpc import comm\n"
        "comm.init(); comm.init()\n"
        "assert (comm.rank(), comm.size(), comm.local_rank(), comm.local_size()) == (0, 1, 0, 1)\n"
        "x = torch.arange(3.0)\n"
        "assert torch.equal(comm.allreduce(x, comm.ReduceOp.SUM, prescale=2.0), 2 * x)\n"
        "assert comm.allgather_object('a') == ['a']\n"
        "assert 'mpi4py.MPI' not in sys.modules and 'horovod.torch' not in sys.modules\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMI", "SLURM_"))}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=120)


def test_size_one_fast_paths() -> None:
    comm.init()
    if comm.size() != 1:
        pytest.skip("size-1 world only")
    x = torch.tensor([1.0, 2.0])
    assert comm.allreduce(x) is not x
    assert torch.equal(comm.allreduce_(x.clone(), prescale=3.0), 3 * x)
    assert torch.equal(comm.grouped_allreduce([x])[0], x)
    np.testing.assert_array_equal(comm.allgather_array(np.arange(2)), [[0, 1]])
    assert comm.broadcast_object(5) == 5
    with pytest.raises(comm.CommError, match="single rank"):
        comm.send_tensor(x, 1)


@pytest.mark.parametrize(
    ("views", "want"),
    [
        ([("auto", False, True), ("auto", False, True)], "mpi"),  # CPU ranks
        ([("auto", True, True), ("auto", True, True)], "horovod"),  # GPU ranks with Horovod
        ([("auto", False, True), ("auto", True, True)], "horovod"),  # a GPU on some rank
        ([("auto", True, True), ("auto", True, False)], "mpi"),  # Horovod missing on a rank
        ([("horovod", False, True)] * 3, "horovod"),
        ([("mpi", True, True)] * 2, "mpi"),
    ],
)
def test_transport_choice(views: list[tuple[str, bool, bool]], want: str) -> None:
    assert comm.runtime.choose_transport(views) == want


def test_ranks_asking_for_different_transports_are_named() -> None:
    with pytest.raises(comm.CommError, match=r"rank 0: 'mpi', rank 1: 'auto'.*--transport"):
        comm.runtime.choose_transport([("mpi", False, True), ("auto", False, True)])


def test_an_unknown_transport_names_the_setting() -> None:
    with pytest.raises(comm.CommError, match=r"'nccl' is not one of .*--transport"):
        comm.init(transport="nccl")


def test_on_host_detaches_every_tensor_and_keeps_the_structure() -> None:
    w = torch.ones(2, requires_grad=True)
    state = {"step": 3, "ref": [w * 2, (w, "tag")], "none": None}
    out = comm.on_host(state)
    assert out["step"] == 3 and out["none"] is None and isinstance(out["ref"][1], tuple)
    assert out["ref"][1][1] == "tag" and torch.equal(out["ref"][0], torch.full((2,), 2.0))
    assert not any(t.requires_grad for t in (out["ref"][0], out["ref"][1][0]))
    assert all(t.device.type == "cpu" for t in (out["ref"][0], out["ref"][1][0]))
