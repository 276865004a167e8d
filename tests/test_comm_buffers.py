"""transfer_buffer: large CPU buffers for collectives in huge-page-advised memory, the rest as
torch.empty; the gradient buffers of BSP use it."""

from __future__ import annotations

import gc
import sys

import pytest
import torch

from hethpc.comm import transfer_buffer
from hethpc.comm.buffers import HUGE_PAGE
from hethpc.sync.gradient_buffer import GradientBuffer

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")


def _vm_flags(address: int) -> list[str]:
    """The VmFlags of the mapping holding ``address``."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and ":" not in head:
                lo, hi = (int(v, 16) for v in head.split("-"))
                inside = lo <= address < hi
            elif inside and line.startswith("VmFlags:"):
                return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64, torch.int64])
def test_large_cpu_buffers_are_aligned_writable_and_released(dtype: torch.dtype) -> None:
    n = 3 * HUGE_PAGE // torch.empty(0, dtype=dtype).element_size() + 7
    t = transfer_buffer(n, dtype)
    assert t.shape == (n,) and t.dtype == dtype and t.device.type == "cpu"
    assert t.data_ptr() % HUGE_PAGE == 0 and not t.any()
    t.fill_(3)
    view = t[5:17]
    del t
    gc.collect()
    assert (view == 3).all()  # a view keeps the memory


@linux
def test_large_buffers_are_advised_huge_pages_and_small_ones_are_plain() -> None:
    big = transfer_buffer(HUGE_PAGE, torch.float32)
    assert "hg" in _vm_flags(big.data_ptr())  # MADV_HUGEPAGE
    small = transfer_buffer(1000, torch.float32)
    assert small.shape == (1000,) and small.dtype == torch.float32


def test_gradient_buffers_of_large_models_use_it() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.Linear(1024, 10))
    params = list(model.parameters())
    buf = GradientBuffer(params, extra=3)
    (flat,) = buf.flats
    assert flat.numel() == sum(p.numel() for p in params) + 3
    assert flat.data_ptr() % HUGE_PAGE == 0
    for p in params:
        p.grad = torch.ones_like(p)
    buf.pack_(params, 0.5)
    assert all(p.grad.data_ptr() >= flat.data_ptr() for p in params)
    assert float(flat[: flat.numel() - 3].sum()) == 0.5 * (flat.numel() - 3)
