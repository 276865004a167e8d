"""Which device a rank computes on (the ``device`` setting, the GPUs it sees, its local rank),
and how it is described in the log and the summary."""

from __future__ import annotations

from typing import Any

import torch

from hethpc import comm
from hethpc.train.errors import ConfigError

DEVICES = ("auto", "cuda", "cpu")


def pick_device(setting: str, *, local_rank: int, gpus: int) -> torch.device:
    """The device of a rank (pure: the facts are arguments).

    One rank per GPU: rank ``k`` of a node takes GPU ``k mod gpus``, so more ranks than GPUs
    share them (two ranks on one GPU in a device check).

    Args:
        setting: ``"auto"`` (a GPU when there is one, else the CPU), ``"cuda"`` or ``"cpu"``.
        local_rank: the rank among the ranks on this node.
        gpus: CUDA devices this process sees (``torch.cuda.device_count()``).

    Raises:
        ConfigError: ``"cuda"`` without a visible GPU, or an unknown setting.
    """
    if setting not in DEVICES:
        raise ConfigError(f"device = {setting!r} is not one of {list(DEVICES)}", key="device")
    if setting == "cpu" or (setting == "auto" and gpus == 0):
        return torch.device("cpu")
    if gpus == 0:
        build = "a CPU build" if torch.version.cuda is None else f"for CUDA {torch.version.cuda}"
        raise ConfigError(
            "device = 'cuda', but this process sees no GPU (torch.cuda.device_count() is 0; "
            f"torch {torch.__version__} is {build}): check CUDA_VISIBLE_DEVICES or srun "
            "--gpus-per-task, and run scripts/setup.sh on the GPU node for torch's CUDA build; "
            "or use device cpu or auto",
            key="device",
        )
    return torch.device("cuda", local_rank % gpus)


def ranks_sharing(local_rank: int, local_size: int, gpus: int) -> int:
    """How many of a node's ranks compute on this rank's GPU (itself counted), as
    :func:`pick_device` deals them out: ranks ``k`` with the same ``k mod gpus``."""
    if gpus <= 0:
        return 1
    return sum(1 for k in range(local_size) if k % gpus == local_rank % gpus)


def this_device(setting: str, local_rank: int) -> torch.device:
    """:func:`pick_device` with the GPUs this process sees; a GPU becomes this process's
    current device (what CUDA-aware MPI, NCCL and a bare ``.cuda()`` use)."""
    gpus = torch.cuda.device_count() if setting != "cpu" else 0
    device = pick_device(setting, local_rank=local_rank, gpus=gpus)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


def describe_device(device: torch.device) -> str:
    """``"cpu"``, or the GPU with the paths its transfers take."""
    if device.type != "cuda":
        return str(device)
    t = comm.transfers()
    return f"{device} (p2p: {t.p2p}; allreduce: {t.allreduce})"


def run_facts(device: torch.device) -> dict[str, Any]:
    """This rank's device and transfer paths, for the run's summary."""
    return {"device": str(device), "transfers": comm.transfers().as_dict()}
