"""Count the bytes autograd keeps for backward (activation memory), live and at peak."""

from __future__ import annotations

from typing import Any

import torch


class _Saved:
    __slots__ = ("tensor", "meter", "nbytes")

    def __init__(self, tensor: torch.Tensor, meter: ActivationMeter) -> None:
        # Detached: a layer that saves its own output (ReLU, Tanh) would otherwise hold that
        # output's graph from inside the graph, a cycle that outlives a retained graph.
        self.tensor = tensor.detach()
        self.meter = meter
        self.nbytes = tensor.numel() * tensor.element_size()
        meter.live_bytes += self.nbytes
        meter.peak_bytes = max(meter.peak_bytes, meter.live_bytes)

    def __del__(self) -> None:
        self.meter.live_bytes -= self.nbytes


class ActivationMeter:
    """Context manager: tensors saved for backward inside it are counted until freed.

    Counts every saved tensor once per save (parameters excluded), on any device; it measures
    how activation memory grows with the schedule, not the allocator's totals.

    Attributes:
        live_bytes: bytes saved now.
        peak_bytes: the most bytes saved at once since the meter was made (or :meth:`reset`).
    """

    def __init__(self) -> None:
        self.live_bytes = 0
        self.peak_bytes = 0
        self._hooks: Any = None

    def reset(self) -> None:
        """Start a new peak from the bytes live now."""
        self.peak_bytes = self.live_bytes

    def __enter__(self) -> ActivationMeter:
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)
        self._hooks.__enter__()
        return self

    def _pack(self, tensor: torch.Tensor) -> Any:
        # Parameters are saved by every micro-batch but exist once: they are not activations.
        # (Linear saves its weight as a transposed view, whose base is the parameter.)
        if isinstance(tensor, torch.nn.Parameter) or isinstance(tensor._base, torch.nn.Parameter):
            return tensor
        return _Saved(tensor, self)

    def __exit__(self, *exc: object) -> None:
        self._hooks.__exit__(*exc)
        self._hooks = None


def _unpack(saved: Any) -> torch.Tensor:
    return saved.tensor if isinstance(saved, _Saved) else saved
