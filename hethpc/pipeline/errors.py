"""Errors raised by hethpc.pipeline."""

from __future__ import annotations


class BalanceError(ValueError):
    """A model cannot be cut into the requested stages (bad counts, too few layers)."""


class ScheduleError(ValueError):
    """A schedule is asked for impossible sizes or its per-stage orders cannot all run."""


class PipelineError(ValueError):
    """A pipeline is set up or fed inconsistently (world size, batch, stage layout)."""
