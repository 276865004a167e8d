"""Host memory for the large tensors that MPI moves: backed by transparent huge pages.

Between ranks on one node, Open MPI copies a large message straight from one process's memory
into the other's (single-copy shared memory: CMA or XPMEM), page by page; a 29 MB gradient
buffer in ordinary 4 KiB pages takes about twice as long to allreduce between two ranks as the
same bytes in 2 MiB pages (5.49 against 2.54 ms on the 2-core host, ``benchmarks/NOTES.md``).
torch's CPU allocator does not ask for huge pages, so the buffers that hethpc keeps for its
collectives come from here: an anonymous private mapping, 2 MiB-aligned, advised
``MADV_HUGEPAGE`` (honoured where transparent huge pages are ``always`` or ``madvise``).
Small tensors, GPU tensors and platforms without the advice get ``torch.empty``.
"""

from __future__ import annotations

import mmap

import numpy as np
import torch

HUGE_PAGE = 2 << 20  # the PMD size of x86-64 and arm64 with 4 KiB pages


def transfer_buffer(
    numel: int, dtype: torch.dtype, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """A 1-D tensor of ``numel`` elements for collectives; contents undefined (zeros on the
    huge-page path). Its memory is released with the last tensor viewing it."""
    device = torch.device(device)
    nbytes = numel * dtype.itemsize
    if device.type != "cpu" or nbytes < HUGE_PAGE or not hasattr(mmap, "MADV_HUGEPAGE"):
        return torch.empty(numel, dtype=dtype, device=device)
    try:
        area = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except (OSError, ValueError):
        return torch.empty(numel, dtype=dtype, device=device)
    skip = -np.frombuffer(area, dtype=np.uint8).ctypes.data % HUGE_PAGE
    try:
        area.madvise(mmap.MADV_HUGEPAGE, skip, nbytes - nbytes % mmap.PAGESIZE)
    except OSError:
        pass  # transparent huge pages are off: ordinary pages, as torch.empty would give
    return torch.frombuffer(area, dtype=dtype, count=numel, offset=skip)
