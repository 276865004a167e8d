"""Whether this MPI reads and writes CUDA memory itself (CUDA-aware), and the transfer paths.

Decided once per process, from the first of these that answers:

1. ``mpi4py.MPI.Query_cuda_support()`` (mpi4py 4: the library's own runtime answer);
2. the MPIX extension's ``MPIX_Query_cuda_support()`` found in the loaded MPI library (Open MPI,
   MPICH 4), also a runtime answer;
3. Open MPI's build flag, ``ompi_info --parsable --all``: ``mpi_built_with_cuda_support``
   (``opal_built_with_cuda_support`` in newer releases);

and otherwise "not CUDA-aware", which is always safe: tensors are then staged through pinned
host memory (:mod:`hethpc.comm.staging`). :func:`decide` is the pure decision, tested with
literal inputs; :func:`probe` gathers its inputs; :func:`transfers` says which path each kind of
transfer takes (recorded in a run's ``config.json``).
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from dataclasses import dataclass
from typing import Any

import torch

from hethpc.comm.runtime import state

_OMPI_KEYS = ("mpi_built_with_cuda_support", "opal_built_with_cuda_support")


@dataclass(frozen=True)
class CudaAwareness:
    """Whether MPI takes CUDA buffers, and what said so.

    Attributes:
        aware: MPI may be handed CUDA tensors directly.
        source: how it was decided, e.g. ``"MPI.Query_cuda_support()"``.
    """

    aware: bool
    source: str


def parse_ompi_info(text: str) -> bool | None:
    """Open MPI's "built with CUDA support" flag in ``ompi_info --parsable --all`` output.

    Args:
        text: the whole output; lines like
            ``mca:mpi:base:param:mpi_built_with_cuda_support:value:true``.

    Returns:
        True or False as the flag says; None when no such line is there (not an Open MPI, or an
        ``ompi_info`` that does not list it).
    """
    for line in text.splitlines():
        parts = line.strip().split(":")
        if len(parts) >= 3 and parts[-2] == "value" and parts[-3] in _OMPI_KEYS:
            return parts[-1].strip().lower() in ("true", "1", "yes")
    return None


def decide(
    *, query: bool | None, mpix: bool | None, ompi_info: str | None
) -> CudaAwareness:
    """The decision, from the answers of the three probes (None: that probe had no answer).

    Args:
        query: ``MPI.Query_cuda_support()``, or None when this mpi4py lacks it.
        mpix: ``MPIX_Query_cuda_support()`` of the loaded MPI, or None when it has none.
        ompi_info: the output of ``ompi_info --parsable --all``, or None when not run.

    Returns:
        The first answer among ``query``, ``mpix``, the ``ompi_info`` flag; not CUDA-aware
        when none answers.
    """
    if query is not None:
        return CudaAwareness(bool(query), "MPI.Query_cuda_support()")
    if mpix is not None:
        return CudaAwareness(bool(mpix), "MPIX_Query_cuda_support()")
    built = parse_ompi_info(ompi_info) if ompi_info is not None else None
    if built is not None:
        return CudaAwareness(built, "ompi_info mpi_built_with_cuda_support")
    return CudaAwareness(False, "no probe answered (assumed not CUDA-aware)")


def _query(mpi: Any) -> bool | None:
    fn = getattr(mpi, "Query_cuda_support", None)
    if fn is None:
        return None
    try:
        return bool(fn())
    except Exception:  # noqa: BLE001 - an MPI without the extension may raise NotImplementedError
        return None


def _mpix() -> bool | None:
    try:
        fn = ctypes.CDLL(None).MPIX_Query_cuda_support  # symbols of the MPI mpi4py loaded
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_int
    return bool(fn())


def _ompi_info(mpi: Any) -> str | None:
    if "open mpi" not in str(mpi.get_vendor()[0]).lower():
        return None
    exe = shutil.which("ompi_info")
    if exe is None:
        return None
    try:
        run = subprocess.run(
            [exe, "--parsable", "--all"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return run.stdout


def probe(mpi: Any) -> CudaAwareness:
    """Ask the started MPI (the ``mpi4py.MPI`` module); the probes stop at the first answer."""
    query = _query(mpi)
    mpix = _mpix() if query is None else None
    info = _ompi_info(mpi) if query is None and mpix is None else None
    return decide(query=query, mpix=mpix, ompi_info=info)


@dataclass(frozen=True)
class Transfers:
    """Which path each kind of transfer takes in this process (recorded in ``config.json``).

    Attributes:
        gpu: this process computes on a CUDA device.
        cuda_aware_mpi: MPI takes CUDA tensors (None: not asked, no GPU or no MPI).
        cuda_aware_source: what said so.
        p2p: point-to-point tensors (pipeline activations and gradients).
        allreduce: Horovod's collectives on tensors.
    """

    gpu: bool
    cuda_aware_mpi: bool | None
    cuda_aware_source: str
    p2p: str
    allreduce: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "gpu": self.gpu,
            "cuda_aware_mpi": self.cuda_aware_mpi,
            "cuda_aware_source": self.cuda_aware_source,
            "p2p": self.p2p,
            "allreduce": self.allreduce,
        }


def describe_transfers(
    *, gpu: bool, world: int, aware: CudaAwareness | None, nccl: bool, hvd_cuda: bool
) -> Transfers:
    """The paths, from the facts (pure).

    Args:
        gpu: a CUDA device is present.
        world: the number of ranks.
        aware: the MPI's answer (None: not probed).
        nccl: Horovod was built with NCCL.
        hvd_cuda: Horovod was built with CUDA-aware MPI operations.
    """
    if world == 1:
        return Transfers(gpu, None, "one process: no transfers", "none", "none")
    if not gpu:
        return Transfers(False, None, "no GPU: not asked", "host memory", "host memory")
    assert aware is not None
    p2p = "CUDA-aware MPI (direct)" if aware.aware else "pinned host staging"
    allreduce = (
        "Horovod NCCL" if nccl else "Horovod CUDA-aware MPI" if hvd_cuda else "pinned host staging"
    )
    return Transfers(True, aware.aware, aware.source, p2p, allreduce)


_awareness: CudaAwareness | None = None


def cuda_awareness() -> CudaAwareness:
    """This process's answer, probed on first use and kept (starts MPI if needed)."""
    global _awareness
    if _awareness is None:
        mpi = state().mpi
        _awareness = probe(mpi) if mpi is not None else CudaAwareness(False, "no MPI")
    return _awareness


def transfers() -> Transfers:
    """The paths this process's transfers take (probes MPI once when a GPU is present)."""
    st = state()
    gpu = torch.cuda.is_available()
    hvd = st.hvd
    return describe_transfers(
        gpu=gpu,
        world=st.size,
        aware=cuda_awareness() if gpu and st.size > 1 else None,
        nccl=bool(hvd is not None and hvd.nccl_built()),
        hvd_cuda=bool(hvd is not None and getattr(hvd, "cuda_built", lambda: False)()),
    )
