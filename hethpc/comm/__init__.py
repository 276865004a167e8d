"""The only code in hethpc that talks to Horovod or mpi4py.

Everything that communicates takes a ``group`` argument (default: the world) and has a
size-1 fast path, so a plain ``python`` process (world size 1) makes no collective call.

Tensors go through the transport chosen at :func:`init`: Horovod (fused allreduce, process
sets; NCCL on GPUs) or mpi4py alone (``transport="mpi"``, the default of CPU-only jobs, where
a small allreduce costs what MPI takes instead of waiting for Horovod's background cycle of
about 1 ms). Small Python objects, numpy arrays, votes and point-to-point tensors always go
through mpi4py.
"""

from __future__ import annotations

from hethpc.comm.broadcast import broadcast_model, broadcast_optimizer_state
from hethpc.comm.buffers import transfer_buffer
from hethpc.comm.collectives import (
    Pending,
    ReduceOp,
    allreduce,
    allreduce_,
    allreduce_async_,
    grouped_allreduce,
    grouped_allreduce_,
)
from hethpc.comm.cuda_aware import CudaAwareness, Transfers, cuda_awareness, transfers
from hethpc.comm.errors import CommError
from hethpc.comm.groups import Group, new_group, world
from hethpc.comm.link import (
    Link,
    LinkError,
    LinkStats,
    current_link,
    link_stats,
    parse_link,
    set_link,
)
from hethpc.comm.objects import (
    allgather_array,
    allgather_object,
    allreduce_array,
    barrier,
    broadcast_object,
)
from hethpc.comm.p2p import (
    RecvRequest,
    Request,
    irecv_tensor,
    isend_tensor,
    recv_tensor,
    send_tensor,
)
from hethpc.comm.runtime import (
    abort,
    abort_on_exception,
    init,
    is_horovod_optimizer,
    is_initialized,
    local_rank,
    local_size,
    rank,
    size,
    transport,
)
from hethpc.comm.waiting import comm_seconds

__all__ = [
    "CommError",
    "CudaAwareness",
    "Group",
    "Link",
    "LinkError",
    "LinkStats",
    "RecvRequest",
    "Transfers",
    "Pending",
    "ReduceOp",
    "Request",
    "abort",
    "comm_seconds",
    "abort_on_exception",
    "allgather_array",
    "allgather_object",
    "allreduce",
    "allreduce_",
    "allreduce_array",
    "allreduce_async_",
    "barrier",
    "broadcast_model",
    "broadcast_object",
    "broadcast_optimizer_state",
    "cuda_awareness",
    "grouped_allreduce",
    "grouped_allreduce_",
    "init",
    "irecv_tensor",
    "is_horovod_optimizer",
    "is_initialized",
    "isend_tensor",
    "local_rank",
    "local_size",
    "new_group",
    "rank",
    "recv_tensor",
    "send_tensor",
    "size",
    "transfer_buffer",
    "transfers",
    "transport",
    "world",
    "current_link",
    "link_stats",
    "parse_link",
    "set_link",
]
