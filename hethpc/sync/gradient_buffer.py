"""Flat gradient buffers: one per dtype and device, the parameters' ``.grad`` views of it.

Kept between calls of the same collective name and parameters, so a gradient accumulated in
place is not copied again.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from hethpc.comm import transfer_buffer


class GradientBuffer:
    """Flat buffers (one per dtype and device) whose slices are the parameters' gradients."""

    def __init__(self, params: list[torch.nn.Parameter], extra: int) -> None:
        kinds: dict[tuple[torch.dtype, torch.device], list[int]] = {}
        for i, p in enumerate(params):
            kinds.setdefault((p.dtype, p.device), []).append(i)
        # The weight check rides in the widest floating buffer.
        widest = max(kinds, key=lambda k: torch.finfo(k[0]).bits if k[0].is_floating_point
                     else 0)  # fmt: skip
        self.flats: list[torch.Tensor] = []
        self.views: list[torch.Tensor] = [torch.empty(0)] * len(params)
        self.extra = torch.empty(0)
        self.nbytes = 0
        for key, members in kinds.items():
            numel = sum(params[i].numel() for i in members)
            more = extra if key == widest else 0
            flat = transfer_buffer(numel + more, key[0], key[1])
            offset = 0
            for i in members:
                k = params[i].numel()
                self.views[i] = flat[offset : offset + k].view_as(params[i])
                offset += k
            if more:
                self.extra = flat[numel:]
            self.flats.append(flat)
            self.nbytes += numel * flat.element_size()

    def pack_(self, params: list[torch.nn.Parameter], scale: float) -> None:
        """Put ``scale * grad`` of each parameter into its slice and make ``.grad`` that slice."""
        for p, view in zip(params, self.views, strict=True):
            put_scaled_grad_(p, view, scale)


def put_scaled_grad_(p: torch.nn.Parameter, view: torch.Tensor, scale: float) -> None:
    """Make ``p.grad`` the slice ``view`` of a flat buffer, holding ``scale`` times the
    gradient (zeros without one); a gradient accumulated in place into ``view`` is scaled
    there, not copied."""
    g = p.grad
    if g is None:
        view.zero_()
    elif g.data_ptr() == view.data_ptr() and g.shape == view.shape:
        if scale != 1.0:
            view.mul_(scale)
        return
    elif scale == 1.0:
        view.copy_(g)
    else:
        torch.mul(g, scale, out=view)
    p.grad = view


# Gradient buffers by collective name and parameters, most recent last (a few per job).
_buffers: OrderedDict[tuple[str, int, tuple[int, ...]], GradientBuffer] = OrderedDict()
_MAX_BUFFERS = 8


def gradient_buffer(name: str, params: list[torch.nn.Parameter], extra: int) -> GradientBuffer:
    """The buffer of collective ``name`` over ``params`` (with ``extra`` elements), reused
    while the parameters keep their shapes, dtypes and devices."""
    key = (name, extra, tuple(id(p) for p in params))
    buf = _buffers.get(key)
    if buf is None or any(
        v.shape != p.shape or v.dtype != p.dtype or v.device != p.device
        for v, p in zip(buf.views, params, strict=True)
    ):
        buf = _buffers[key] = GradientBuffer(params, extra)
        while len(_buffers) > _MAX_BUFFERS:
            _buffers.popitem(last=False)
    _buffers.move_to_end(key)
    return buf
