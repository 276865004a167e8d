"""Deliberate faults for reliability tests: kill, stall, raise, poison or stop one rank at one
step."""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass

import torch

KINDS = ("kill", "stall", "raise", "nan", "term")


@dataclass(frozen=True)
class Fault:
    """Make ``rank`` misbehave at global step ``step``.

    Attributes:
        rank: the world rank that fails.
        step: the global step (0-based) at which it fails, before its forward pass.
        kind: ``kill`` (SIGKILL itself), ``stall`` (sleep forever), ``raise`` (RuntimeError),
            ``nan`` (its loss becomes NaN for that step), ``term`` (SIGTERM itself, as a
            scheduler or the launcher's Ctrl-C sends it).
    """

    rank: int
    step: int
    kind: str

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"fault kind {self.kind!r} is not one of {list(KINDS)}")

    @classmethod
    def parse(cls, text: str) -> Fault:
        """Parse ``"rank:step:kind"``, e.g. ``"1:20:kill"``.

        Raises:
            ValueError: the text is not of that form.
        """
        try:
            r, s, kind = text.split(":")
            return cls(int(r), int(s), kind)
        except ValueError as e:
            raise ValueError(f"fault {text!r} must look like 'rank:step:kind' ({e})") from e


def apply_faults(
    faults: tuple[Fault, ...], *, rank: int, step: int, loss: torch.Tensor
) -> torch.Tensor:
    """Trigger this rank's faults for ``step``; returns the (possibly poisoned) loss."""
    for f in faults:
        if f.rank != rank or f.step != step:
            continue
        # The wall time, so that a test can measure how long the job takes to end after it.
        print(f"hethpc fault: rank {rank} {f.kind} at step {step} (time {time.time():.3f})",
              file=sys.stderr, flush=True)  # fmt: skip
        if f.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif f.kind == "stall":
            while True:
                time.sleep(3600)
        elif f.kind == "raise":
            raise RuntimeError(f"fault injected on rank {rank} at step {step}")
        elif f.kind == "term":
            os.kill(os.getpid(), signal.SIGTERM)
        elif f.kind == "nan":
            loss = loss * float("nan")
    return loss
