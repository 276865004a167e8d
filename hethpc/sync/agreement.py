"""The ranks' agreement of one step: votes, non-finite flags and weight checks in one allreduce.

Votes go through one tiny mpi4py collective; only a failed check gathers every rank's row, to
name the culprits. The weight rows are also what a BSP step carries in its gradient buffer.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from hethpc import comm
from hethpc.comm import Group, ReduceOp
from hethpc.sync.errors import SyncError

# Sums of b_k / B over ranks are compared with 1 to this tolerance.
WEIGHT_TOLERANCE = 1e-6


def group_size(group: Group | None) -> int:
    """Ranks in ``group`` (None: the world)."""
    return comm.size() if group is None else group.size


def check_weight(weight: float | None) -> bool:
    """Whether one rank's ``weight`` is usable on its own: None, or finite in ``(0, 1]``."""
    return weight is None or (math.isfinite(weight) and 0.0 < weight <= 1.0)


class Agreement(NamedTuple):
    """What the ranks agreed on in one step's control exchange (the same on every rank)."""

    votes: int  # ranks that voted to synchronise
    nonfinite: list[int]  # ranks whose loss or gradients were not finite (empty: none)


def agree(vote: bool, weight: float | None, *, group: Group | None = None) -> int:
    """Exchange votes and check the weights in one tiny allreduce; the same result on every rank.

    Args:
        vote: this rank's wish to synchronise now.
        weight: this rank's share of the global batch, ``b_k / B``; None for equal shares.
            Either every rank passes a weight or none does, and the weights sum to 1.
        group: the ranks that decide together (default: the world).

    Returns:
        The number of ranks that voted yes.

    Raises:
        SyncError: on every rank, when a weight is invalid, only some ranks pass one, or the
            weights do not sum to 1 (the message names the ranks and their weights).
    """
    return agree_step(vote, weight, group=group).votes


def agree_step(
    vote: bool, weight: float | None, *, finite: bool = True, group: Group | None = None
) -> Agreement:
    """:func:`agree`, with each rank's non-finite flag in the same allreduce.

    Args:
        vote: this rank's wish to synchronise now.
        weight: this rank's ``b_k / B`` (see :func:`agree`).
        finite: whether this rank's loss and gradients are finite.
        group: the ranks that decide together (default: the world).

    Returns:
        The votes, and the ranks whose values were not finite (gathered only when some were).

    Raises:
        SyncError: on every rank, as :func:`agree`.
    """
    row = np.array([float(vote), *weight_row(weight), float(not finite)])
    # One Allreduce decides (this runs every step); only a failed check gathers every rank's
    # row, to name the culprits. The sums are the same on every rank, so all take one branch.
    sums = comm.allreduce_array(row, ReduceOp.SUM, group)
    bad_weights = weights_wrong(sums[1:4], group_size(group), WEIGHT_TOLERANCE)
    if not bad_weights and sums[4] == 0:
        return Agreement(int(round(sums[0])), [])
    table = comm.allgather_array(row, group)
    if bad_weights:
        raise SyncError(weight_message(table[:, 1:4], WEIGHT_TOLERANCE))
    return Agreement(int(round(sums[0])), [int(r) for r in np.flatnonzero(table[:, 4])])


def weight_row(weight: float | None) -> list[float]:
    """This rank's part of a weight check: ``[weight or 0, no weight, invalid weight]``."""
    ok = check_weight(weight)
    return [float(weight) if weight is not None and ok else 0.0, float(weight is None),
            float(not ok)]  # fmt: skip


def weights_wrong(sums: Sequence[float] | np.ndarray, size: int, tolerance: float) -> bool:
    """Whether the summed :func:`weight_row` of ``size`` ranks shows a problem."""
    some_without = 0 < sums[1] < size
    off_total = sums[1] == 0 and abs(sums[0] - 1.0) > tolerance
    return bool(sums[2] > 0 or some_without or off_total)


def weight_message(table: np.ndarray, tolerance: float) -> str:
    """What is wrong with the ranks' weights, from every rank's :func:`weight_row`."""
    fix = "pass weight = b_k / B on every rank, with sum(b_k) == B (or no weight on any rank)"
    bad = [r for r in range(len(table)) if table[r, 2]]
    if bad:
        return f"rank(s) {bad} passed a weight outside (0, 1] or non-finite; {fix}"
    without = [r for r in range(len(table)) if table[r, 1]]
    if without:
        return f"rank(s) {without} passed no weight while the others did; {fix}"
    total = float(table[:, 0].sum())
    shares = ", ".join(f"rank {r}: {w:.6g}" for r, w in enumerate(table[:, 0]))
    return f"weights sum to {total:.6g}, not 1 within {tolerance:.1g} ({shares}); {fix}"
