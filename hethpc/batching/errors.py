"""Errors raised by hethpc.batching."""

from __future__ import annotations


class BatchingError(ValueError):
    """A batch-controller setting is invalid, or the ranks disagree on one."""


class SlowdownError(ValueError):
    """A slowdown specification cannot be parsed or is out of range."""


class AllocationError(ValueError):
    """The global batch cannot be split within the bounds, or the inputs are not usable."""


class WeightError(ValueError):
    """The ranks' gradient weights are not usable (not finite, negative, or not summing to 1)."""
