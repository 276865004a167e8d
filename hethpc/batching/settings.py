"""The control settings of dynamic batching, in one place for the controller and the simulator."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hethpc.batching.allocation import Bound
from hethpc.batching.decision import Adjustment, decide
from hethpc.batching.errors import BatchingError
from hethpc.batching.estimate import TimeEstimator


@dataclass(frozen=True)
class ControlSettings:
    """How dynamic batching measures and decides; the same on every rank.

    Args:
        interval: steps between control decisions.
        deadband: adopt new sizes only when the largest relative change exceeds this (5 %).
        min_change: also hold unless some rank's size moves by more than this many samples
            (a one-sample move is rounding noise; 0 disables).
        window: most steps of the per-sample time estimate (at the current sizes).
        noise_z: standard errors of the measurement a size change (and a change of a rank's
            speed) must exceed; 3 holds the sizes still under 25 % per-step timing noise.
        trim: fraction of the window's times dropped at each end (spikes), in [0, 0.5).
        b_min: smallest batch of a rank, an int or one per rank (>= 1).
        b_max: largest batch of a rank, an int or one per rank; None for no bound.

    Raises:
        BatchingError: a setting is out of range.
    """

    interval: int = 10
    deadband: float = 0.05
    min_change: int = 1
    window: int = 200
    noise_z: float = 3.0
    trim: float = 0.2
    b_min: Bound = 1
    b_max: Bound = None

    def __post_init__(self) -> None:
        if self.interval < 1:
            raise BatchingError(f"interval must be at least 1 step, got {self.interval}")
        if not 0 <= self.deadband < 1:
            raise BatchingError(f"deadband must be in [0, 1), got {self.deadband}")
        if self.min_change < 0:
            raise BatchingError(f"min_change must be >= 0 samples, got {self.min_change}")
        if self.window < 1:
            raise BatchingError(f"window must be at least 1 step, got {self.window}")
        if not (math.isfinite(self.noise_z) and self.noise_z >= 0):
            raise BatchingError(f"noise_z must be a finite number >= 0, got {self.noise_z}")
        if not 0 <= self.trim < 0.5:
            raise BatchingError(f"trim must be in [0, 0.5), got {self.trim}")

    def estimator(self) -> TimeEstimator:
        """A per-rank time estimator with these settings."""
        return TimeEstimator(window=self.window, trim=self.trim, z=self.noise_z,
                             floor=self.deadband)  # fmt: skip

    def decide(
        self,
        step: int,
        sizes: Sequence[int] | np.ndarray,
        per_sample_s: Sequence[float] | np.ndarray,
        rel_se: Sequence[float] | np.ndarray,
        elasticity: Sequence[float] | np.ndarray,
        *,
        global_batch: int,
        force: bool = False,
    ) -> Adjustment:
        """The decision from every rank's estimate (:func:`decide` with these settings); a
        standard error that is not finite counts as 0."""
        se = np.asarray(rel_se, dtype=np.float64)
        return decide(
            step,
            sizes,
            per_sample_s,
            global_batch=global_batch,
            deadband=self.deadband,
            min_change=self.min_change,
            b_min=self.b_min,
            b_max=self.b_max,
            rel_se=np.where(np.isfinite(se), se, 0.0),
            z=self.noise_z,
            elasticity=elasticity,
            force=force,
        )
