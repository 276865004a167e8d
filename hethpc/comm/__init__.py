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

from hethpc.comm.broadcast import broadcast_model
from hethpc.comm.collectives import allreduce_
from hethpc.comm.errors import CommError
from hethpc.comm.groups import Group, new_group, world
from hethpc.comm.objects import allgather_object, barrier, broadcast_object
from hethpc.comm.runtime import init, local_rank, rank, size

__all__ = [
    "CommError",
    "Group",
    "allgather_object",
    "allreduce_",
    "barrier",
    "broadcast_model",
    "broadcast_object",
    "init",
    "local_rank",
    "new_group",
    "rank",
    "size",
    "world",
]

# Not public: the rest of the layer, which hethpc's own modules and the commands call as
# ``comm.<name>``; imported from its module elsewhere (e.g. :mod:`hethpc.comm.p2p`).
from hethpc.comm.broadcast import broadcast_optimizer_state  # noqa: F401
from hethpc.comm.buffers import transfer_buffer  # noqa: F401
from hethpc.comm.collectives import (  # noqa: F401
    Pending,
    ReduceOp,
    allreduce,
    allreduce_async_,
    grouped_allreduce,
    grouped_allreduce_,
)
from hethpc.comm.cuda_aware import CudaAwareness, Transfers, cuda_awareness, transfers  # noqa: F401
from hethpc.comm.link import (  # noqa: F401
    Link,
    LinkError,
    LinkStats,
    current_link,
    link_stats,
    parse_link,
    set_link,
)
from hethpc.comm.objects import allgather_array, allreduce_array, on_host  # noqa: F401
from hethpc.comm.p2p import (  # noqa: F401
    RecvRequest,
    Request,
    irecv_tensor,
    isend_tensor,
    recv_tensor,
    send_tensor,
)
from hethpc.comm.runtime import (  # noqa: F401
    abort,
    abort_on_exception,
    is_horovod_optimizer,
    is_initialized,
    local_size,
    transport,
)
from hethpc.comm.waiting import comm_seconds  # noqa: F401
