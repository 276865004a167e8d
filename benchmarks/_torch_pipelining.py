"""bench_pipeline's peer rows: PyTorch's own ``torch.distributed.pipelining`` on the same model."""

from __future__ import annotations

import socket
from collections.abc import Callable

import torch
from _training import Loss, timed_steps
from torch import nn

from hethpc import comm
from hethpc.pipeline.balance import split_model

# torch.distributed.pipelining's schedules beside hethpc's: (class name, chunks of the model,
# chunk indices each rank holds). Interleaved: rank r holds chunks r and r+2; V: 0,3 and 1,2.
PEERS = {
    "torch-gpipe": ("ScheduleGPipe", 2, ((0,), (1,))),
    "torch-1f1b": ("Schedule1F1B", 2, ((0,), (1,))),
    "torch-interleaved-1f1b": ("ScheduleInterleaved1F1B", 4, ((0, 2), (1, 3))),
    "torch-interleaved-zb": ("ScheduleInterleavedZeroBubble", 4, ((0, 2), (1, 3))),
    "torch-zbv": ("ScheduleZBVZeroBubble", 4, ((0, 3), (1, 2))),
}


class TorchPipe:
    """This rank's part of a ``torch.distributed.pipelining`` schedule over the same model."""

    def __init__(self, name: str, model: nn.Sequential, m: int, loss_fn: Loss) -> None:
        from torch.distributed import pipelining

        cls_name, chunks, held = PEERS[name]
        parts = split_model(model, [len(model) // chunks] * chunks)
        mine = held[comm.rank()]
        stages = [pipelining.PipelineStage(parts[i], i, chunks, torch.device("cpu"))
                  for i in mine]  # fmt: skip
        cls = getattr(pipelining, cls_name)
        self.schedule = cls(stages[0] if len(stages) == 1 else stages, m, loss_fn=loss_fn)
        self.is_first, self.is_last = 0 in mine, chunks - 1 in mine
        self.params = [p for i in mine for p in parts[i].parameters()]

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """One batch; the schedule averages the micro-batch losses' gradients (mean loss)."""
        args = (x,) if self.is_first else ()
        if self.is_last:
            self.schedule.step(*args, target=y, losses=[])
        else:
            self.schedule.step(*args)


def init_torch_distributed() -> None:
    """A gloo process group over the MPI world (rank 0 picks a free port and broadcasts it)."""
    import torch.distributed as dist

    port = None
    if comm.rank() == 0:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
    port = comm.broadcast_object(port)
    dist.init_process_group("gloo", rank=comm.rank(), world_size=comm.size(),
                            init_method=f"tcp://127.0.0.1:{port}")  # fmt: skip


def make_peers(
    peers: str, make_model: Callable[[], nn.Sequential], m: int, loss_fn: Loss
) -> dict[str, TorchPipe]:
    """The ``--peers`` rows (comma-separated names of :data:`PEERS`, or ``none``), each on its
    own copy of the model; the gloo group is set up first when there is any.

    Raises:
        SystemExit: an unknown name.
    """
    names = [] if peers == "none" else [k for k in peers.split(",") if k]
    unknown = sorted(set(names) - set(PEERS))
    if unknown:
        raise SystemExit(f"unknown --peers {unknown}; choose from {', '.join(PEERS)} or 'none'")
    if names:
        init_torch_distributed()
    return {k: TorchPipe(k, make_model(), m, loss_fn) for k in names}


def time_peer(peer: TorchPipe, x: torch.Tensor, y: torch.Tensor, steps: int) -> list[float]:
    """As bench_pipeline's ``time_pipeline``: a barrier, then zero_grad, the step and the
    optimizer's step."""
    opt = torch.optim.SGD(peer.params, lr=1e-4)
    return timed_steps(opt, lambda: peer.train_step(x, y), steps, barrier=True)
