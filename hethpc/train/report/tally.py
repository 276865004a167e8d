"""What the training loop counts from step to step: time, synced and skipped steps, losses."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import torch


@dataclass
class Tally:
    """One rank's running counts; ``synced``, ``skipped`` and the time travel in checkpoints.

    Attributes:
        start: the first step of this process (after a resume, the checkpoint's step).
        elapsed0: seconds the run had taken before this process (from the checkpoint).
        t0: ``time.perf_counter()`` when this process's first step began.
        synced: steps that synchronised (the job's own count, carried across a resume).
        skipped: steps skipped for a non-finite loss or gradient (likewise carried).
        eval_s: seconds spent in evaluations during the run (likewise carried).
        seen: samples of the global batches stepped by this process.
        in_a_row: the latest run of consecutive skipped steps.
        first_loss: the first finite step's loss (a tensor; None before it).
        last_losses: the last 10 finite steps' losses (tensors).
    """

    start: int = 0
    elapsed0: float = 0.0
    t0: float = 0.0
    synced: int = 0
    skipped: int = 0
    eval_s: float = 0.0
    seen: int = 0
    in_a_row: int = 0
    first_loss: torch.Tensor | None = None
    last_losses: deque[torch.Tensor] = field(default_factory=lambda: deque(maxlen=10))

    def elapsed(self) -> float:
        """Seconds of the run so far, the checkpoint's included."""
        return self.elapsed0 + time.perf_counter() - self.t0
