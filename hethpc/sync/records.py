"""What a sync policy reports: one record per step and a summary of the run."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class SyncRecord:
    """One training step as a sync policy saw it.

    Attributes:
        step: the policy's step counter (0-based), equal on every rank.
        grad_norm: L2 norm of this rank's local gradient before any communication.
        smoothed_norm: SelSync's EWMA of the norm (``nan`` for other policies).
        delta: SelSync's relative change of the smoothed norm (``nan`` for other policies).
        votes: number of ranks that voted to synchronise (SelSync; 0 for other policies).
        synced: whether the step synchronised (SYNC) or stayed local (LOCAL).
        sync_s: seconds spent in this step's collectives (vote and allreduces) on this rank.
        compute_s: seconds of forward and backward, as passed to ``step`` (``nan`` if not).
        bytes: bytes this rank put on the wire in tensor allreduces this step (compressed,
            when the policy compresses).
        nonfinite: the ranks whose loss or gradients were not finite, when the caller passed
            ``finite`` to ``step``; non-empty means every rank skipped the step (no update).
    """

    step: int
    grad_norm: float
    smoothed_norm: float
    delta: float
    votes: int
    synced: bool
    sync_s: float
    compute_s: float = math.nan
    bytes: int = 0
    nonfinite: tuple[int, ...] = ()

    @property
    def decision(self) -> str:
        """``"SYNC"`` or ``"LOCAL"``."""
        return "SYNC" if self.synced else "LOCAL"

    def as_dict(self) -> dict[str, Any]:
        """The fields plus ``decision``, for logs and JSON."""
        return {**asdict(self), "decision": self.decision}


@dataclass(frozen=True)
class SyncSummary:
    """A run so far, against what BSP would have communicated.

    Attributes:
        policy: the policy's name.
        steps: steps taken.
        synced_steps: steps that synchronised.
        sync_fraction: ``synced_steps / steps`` (0 before the first step).
        bytes: bytes this rank put on the wire in tensor allreduces (compressed, when the
            policy compresses).
        bsp_bytes: what BSP would have put in: one gradient allreduce per step.
        bytes_vs_bsp: ``bytes / bsp_bytes`` (0 before the first step).
        sync_s: seconds spent in collectives, summed over the steps.
        compression: the compression its averages travelled with (``"none"``, ``"fp16"``).
        compression_ratio: bytes its averages would have sent uncompressed over the bytes
            they sent (2.0 for fp16 of float32; 1.0 uncompressed).
    """

    policy: str
    steps: int
    synced_steps: int
    sync_fraction: float
    bytes: int
    bsp_bytes: int
    bytes_vs_bsp: float
    sync_s: float
    compression: str = "none"
    compression_ratio: float = 1.0

    def as_dict(self) -> dict[str, Any]:
        """The fields as a plain dict, for logs and JSON."""
        return asdict(self)
