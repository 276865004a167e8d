"""Start-up of MPI and Horovod, the world's rank and size, and ending a failed job."""

from __future__ import annotations

import os
import sys
import traceback
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from hethpc.comm.errors import CommError

# Variables that MPI launchers (mpirun/mpiexec of Open MPI, MPICH, Intel MPI) and srun set in
# each rank. Their presence means MPI must be started; their absence means a plain process.
_LAUNCHER_VARS = (
    "OMPI_COMM_WORLD_SIZE",
    "PMI_SIZE",
    "PMIX_RANK",
    "PMI_RANK",
    "MPI_LOCALNRANKS",
    "HYDRA_CONTROL_FD",
)


@dataclass(frozen=True)
class _State:
    rank: int
    size: int
    local_rank: int
    local_size: int
    mpi: Any  # the mpi4py.MPI module, or None in a plain process
    hvd: Any  # horovod.torch, or None in a plain process and with transport "mpi"
    transport: str = "horovod"


_state: _State | None = None


def _launched_by_mpi() -> bool:
    if "mpi4py.MPI" in sys.modules:
        return True
    if any(v in os.environ for v in _LAUNCHER_VARS):
        return True
    # srun starts MPI ranks itself (PMI2/PMIx); a single task needs no MPI.
    return "SLURM_STEP_ID" in os.environ and int(os.environ.get("SLURM_NTASKS", "1")) > 1


TRANSPORTS = ("auto", "horovod", "mpi")


def init(*, transport: str | None = None) -> None:
    """Start MPI (with ``MPI_THREAD_MULTIPLE``) and the tensor transport; idempotent.

    ``transport`` carries the tensor collectives (allreduce, broadcast of a model):

    - ``"horovod"``: Horovod's fused allreduce in its background thread (NCCL on GPUs);
    - ``"mpi"``: mpi4py alone, Horovod never started (:mod:`hethpc.comm.mpi_tensors`). On CPU
      ranks an allreduce then costs what MPI takes instead of waiting for Horovod's cycle
      (about 1 ms), and MPI keeps the bandwidth Horovod's polling thread takes from it
      (``benchmarks/bench_comm.py``, ``bench_overhead.py``);
    - ``"auto"``: ``"horovod"`` when any rank sees a GPU and every rank has Horovod
      installed, else ``"mpi"``.

    None: the one started already, else ``"auto"``. Every rank must ask for the same one
    (checked: a mismatch is refused on every rank instead of hanging in Horovod's start). A
    later call naming another transport than the one started is refused; ``"auto"`` and None
    accept the one started.

    Under ``mpirun``/``mpiexec``/``srun`` every rank joins the world, and with more than one
    rank an uncaught exception then ends every rank (:func:`abort_on_exception`, unless
    ``sys.excepthook`` was replaced already). In a plain ``python`` process nothing is started:
    the world has size 1 and no collective is ever called.

    Raises:
        CommError: an unknown transport, ranks asking for different ones, a switch after the
            start, MPI without ``MPI_THREAD_MULTIPLE``, or Horovod without MPI support.
    """
    global _state
    if transport is not None and transport not in TRANSPORTS:
        raise CommError(
            f"transport {transport!r} is not one of {list(TRANSPORTS)} (the transport setting, "
            "--transport)"
        )
    if _state is not None:
        if _state.size > 1 and transport not in (None, "auto", _state.transport):
            raise CommError(
                f"hethpc.comm was started with transport {_state.transport!r}; it cannot "
                f"switch to {transport!r} in the same process: ask for it at the first "
                "hethpc.comm.init() (or leave transport at 'auto')"
            )
        return
    if not _launched_by_mpi():
        _state = _State(rank=0, size=1, local_rank=0, local_size=1, mpi=None, hvd=None)
        return

    import mpi4py

    if "mpi4py.MPI" not in sys.modules:
        mpi4py.rc.thread_level = "multiple"
        # Open MPI's nonblocking allreduce (hethpc's, in place) otherwise reduces to one rank
        # and broadcasts back: the two directions of a link take turns; the ring uses both at
        # once (scripts/openmpi_env.sh)
        os.environ.setdefault("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "1")
    from mpi4py import MPI

    provided = MPI.Query_thread()
    if provided != MPI.THREAD_MULTIPLE:
        names = {
            MPI.THREAD_SINGLE: "SINGLE",
            MPI.THREAD_FUNNELED: "FUNNELED",
            MPI.THREAD_SERIALIZED: "SERIALIZED",
        }
        raise CommError(
            f"MPI provides thread level MPI_THREAD_{names.get(provided, provided)}, but hethpc "
            "needs MPI_THREAD_MULTIPLE so that Horovod's background thread and mpi4py can share "
            "MPI. Use an MPI library built with thread support (Open MPI: "
            "'ompi_info | grep -i thread' must list MPI_THREAD_MULTIPLE: yes), and do not set "
            "mpi4py.rc.thread_level to a lower level before hethpc.comm.init()."
        )
    world_comm = MPI.COMM_WORLD
    transport = _agree_transport(world_comm, transport or "auto")
    hvd: Any = None
    if transport == "horovod":
        import horovod.torch

        hvd = horovod.torch
        if not hvd.mpi_built():
            raise CommError(
                "Horovod was built without MPI support; rebuild it with HOROVOD_WITH_MPI=1 "
                "(scripts/setup.sh does this)."
            )
        hvd.init(comm=world_comm, process_sets="dynamic")
    node_comm = world_comm.Split_type(MPI.COMM_TYPE_SHARED, key=world_comm.Get_rank())
    _state = _State(
        rank=world_comm.Get_rank(),
        size=world_comm.Get_size(),
        local_rank=node_comm.Get_rank(),
        local_size=node_comm.Get_size(),
        mpi=MPI,
        hvd=hvd,
        transport=transport,
    )
    node_comm.Free()
    if _state.size > 1 and sys.excepthook is sys.__excepthook__:
        # A user's script (hethpc.fit, a Coordinator loop) that raises on one rank would
        # otherwise hang: at exit MPI_Finalize waits for the ranks still in a collective.
        sys.excepthook = _abort_hook


def _agree_transport(world_comm: Any, asked: str) -> str:
    """The transport every rank starts: each rank's view, allgathered, then
    :func:`choose_transport` (the same answer on every rank)."""
    import importlib.util

    import torch

    gpu = asked == "auto" and torch.cuda.is_available()
    has_horovod = asked != "auto" or importlib.util.find_spec("horovod") is not None
    return choose_transport(world_comm.allgather((asked, gpu, has_horovod)))


def choose_transport(views: list[tuple[str, bool, bool]]) -> str:
    """The transport of a world whose rank ``r`` asked for ``views[r] = (asked, sees_gpu,
    has_horovod)``: the one asked, with ``"auto"`` resolved to ``"horovod"`` when a rank sees
    a GPU and every rank has Horovod installed, else ``"mpi"`` (a GPU machine without Horovod
    stages CUDA tensors through the host).

    Raises:
        CommError: the ranks asked for different transports (named per rank).
    """
    kinds = sorted({a for a, _, _ in views})
    if len(kinds) > 1:
        which = ", ".join(f"rank {r}: {a!r}" for r, (a, _, _) in enumerate(views))
        raise CommError(
            f"the ranks asked for different transports ({which}); every rank must use the same "
            "transport setting (--transport)"
        )
    if kinds[0] != "auto":
        return kinds[0]
    gpus = any(g for _, g, _ in views)
    return "horovod" if gpus and all(h for _, _, h in views) else "mpi"


def transport() -> str:
    """The transport that carries tensor collectives: ``"horovod"`` or ``"mpi"`` (see
    :func:`init`); ``"none"`` in a world of size 1, which makes no collective call."""
    st = state()
    return st.transport if st.size > 1 else "none"


def is_initialized() -> bool:
    """Whether :func:`init` has run in this process."""
    return _state is not None


def state() -> _State:
    """The started runtime; starts it on first use."""
    if _state is None:
        init()
    assert _state is not None
    return _state


def rank() -> int:
    """This process's rank in the world."""
    return state().rank


def size() -> int:
    """Number of ranks in the world."""
    return state().size


def local_rank() -> int:
    """This process's rank among the ranks on its node (picks its GPU)."""
    return state().local_rank


def local_size() -> int:
    """Number of ranks on this process's node."""
    return state().local_size


def is_horovod_optimizer(optimizer: object) -> bool:
    """Whether ``optimizer`` is wrapped by Horovod (``hvd.DistributedOptimizer``).

    Read from its class, without importing Horovod.
    """
    return any(c.__module__.split(".")[0] == "horovod" for c in type(optimizer).__mro__)


def abort(code: int = 1, message: str | None = None) -> None:
    """End every rank of the job now, printing ``message`` tagged with this rank.

    Use it when one rank cannot go on: the others would otherwise wait forever in their next
    collective.
    """
    if message:
        print(f"[rank {rank()}] {message}", file=sys.stderr, flush=True)
    st = _state
    if st is not None and st.mpi is not None and st.size > 1:
        st.mpi.COMM_WORLD.Abort(code)
    raise SystemExit(code)


def _abort_hook(
    exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None
) -> None:
    text = "".join(traceback.format_exception(exc_type, exc, tb))
    r = _state.rank if _state is not None else 0
    sys.stderr.write("".join(f"[rank {r}] {line}\n" for line in text.rstrip().splitlines()))
    sys.stderr.write(f"[rank {r}] rank {r} failed; aborting all ranks\n")
    sys.stderr.flush()
    if _state is not None and _state.mpi is not None and _state.size > 1:
        _state.mpi.COMM_WORLD.Abort(1)


def abort_on_exception() -> None:
    """Make an uncaught exception on any rank end the whole job with a non-zero exit code.

    Without this, a rank that raises exits while the others wait in their next collective.
    """
    sys.excepthook = _abort_hook
