"""A rank's share of one step: its weight in the averaged update, the batches of its local steps.

Plain functions of the batch sizes the controller gives every rank alike; no communication.
"""

from __future__ import annotations

import numpy as np


def gradient_weight(
    partition: str,
    *,
    rank: int,
    batch_sizes: np.ndarray,
    partition_lengths: np.ndarray | None,
    rebalanced: bool = False,
) -> float:
    """This rank's weight in the averaged update (the weights of all ranks sum to 1).

    In IID modes (``iid``, ``seldp``) a rank's batch is its slice of one global batch, so the
    weight ``b_k / B`` makes the update the gradient of those ``B`` samples. In partitioned
    (non-IID) modes a rank's mean gradient stands for its own partition: weighting it by batch
    share would let the rank with the larger batch (the fast one, under dynamic batching) pull
    the model toward its own labels, so the weight is the partition's share of the data;
    unless the batches are rebalanced (:class:`~hethpc.data.balance.Rebalancer`): the global batch
    then draws from each partition in proportion, and ``b_k / B`` is exact again.

    Args:
        partition: the partition setting (``iid``, ``seldp``, ``labels``, ``dirichlet``,
            ``site``).
        rank: this rank.
        batch_sizes: every rank's batch size this step.
        partition_lengths: every rank's number of samples (partitioned modes).
        rebalanced: whether the batches were rebalanced.
    """
    if partition in ("iid", "seldp") or partition_lengths is None or rebalanced:
        return float(batch_sizes[rank]) / float(np.sum(batch_sizes))
    lengths = np.asarray(partition_lengths, dtype=np.float64)
    return float(lengths[rank] / lengths.sum())


def inner_step_sizes(sizes: np.ndarray, replica: int, *, rows: int | None = None) -> list[int]:
    """With ``--inner-steps speed``: the batches of this replica's local steps within one step.

    Replica ``k`` takes ``round(b_k / min_j b_j)`` steps (at least one, at most one per row),
    its ``rows`` (default ``b_k``) split as evenly as possible among them: every replica's local
    steps are of about the smallest batch, and their number follows the batch controller's
    estimate of its speed.
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    b = int(sizes[replica]) if rows is None else int(rows)
    m = max(1, min(b, int(round(int(sizes[replica]) / int(max(sizes.min(), 1))))))
    return [len(part) for part in np.array_split(np.arange(b), m)]
