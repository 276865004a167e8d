"""Rebalancing for unequal batches on partitioned data: every partition feeds the global batch in
proportion to its size, whichever rank computes on its samples.

With dynamic batching a fast rank takes a large batch and a slow rank a small one. On IID data
that is harmless: every rank's samples come from the same distribution. On a label-skewed
partition it is not: the fast rank's labels would fill most of every step, or, weighted by data
share instead, the slow rank's few samples would stand for half the data and make the update
noisy. Here each rank reads its partition's share of the global batch, ``B * n_k / n``, and the
ranks that read more than they compute on (the slow ones) send the rest to those that compute
on more (the fast ones). The union of the batches is then drawn from every partition as with
uniform batches, and the exact update weights each rank by its batch, ``b_k / B``. The samples
moved are few (the difference of two batch sizes) and small beside a gradient.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from hethpc import comm
from hethpc.comm import Group


def proportional_shares(total: int, lengths: Sequence[int] | np.ndarray) -> np.ndarray:
    """``total`` split in proportion to ``lengths`` in integers (largest remainders; ties go to
    the lower rank); they sum to ``total``.

    Raises:
        ValueError: no lengths, a negative length, or all lengths zero.
    """
    n = np.asarray(lengths, dtype=np.float64)
    if n.size == 0 or (n < 0).any() or n.sum() <= 0:
        raise ValueError(f"partition lengths must be >= 0 with a positive sum, got {list(n)}")
    exact = total * n / n.sum()
    shares = np.floor(exact).astype(np.int64)
    left = int(total - shares.sum())
    order = sorted(range(len(n)), key=lambda k: (-(exact[k] - shares[k]), k))
    for k in order[:left]:
        shares[k] += 1
    return shares


def transfer_plan(
    reads: Sequence[int] | np.ndarray, sizes: Sequence[int] | np.ndarray
) -> list[tuple[int, int, int]]:
    """Who sends how many samples to whom so that rank ``k``, having read ``reads[k]``, ends with
    ``sizes[k]``: ``(source, dest, count)`` triples, in source order, then dest order.

    Ranks with a surplus fill the deficits of the others in rank order; the plan is the same on
    every rank (a pure function of the two vectors).

    Raises:
        ValueError: the vectors differ in length, hold a negative entry, or sum differently.
    """
    r, s = np.asarray(reads, dtype=np.int64), np.asarray(sizes, dtype=np.int64)
    if r.shape != s.shape or (r < 0).any() or (s < 0).any() or r.sum() != s.sum():
        raise ValueError(
            f"reads {r.tolist()} and sizes {s.tolist()} must be non-negative vectors of one "
            "length and one sum"
        )
    surplus = [[k, int(r[k] - s[k])] for k in range(len(r)) if r[k] > s[k]]
    deficit = [[k, int(s[k] - r[k])] for k in range(len(r)) if s[k] > r[k]]
    plan: list[tuple[int, int, int]] = []
    i = j = 0
    while i < len(surplus) and j < len(deficit):
        n = min(surplus[i][1], deficit[j][1])
        plan.append((surplus[i][0], deficit[j][0], n))
        surplus[i][1] -= n
        deficit[j][1] -= n
        i += surplus[i][1] == 0
        j += deficit[j][1] == 0
    return plan


class Rebalancer:
    """Moves the surplus of each partition's share of the global batch to the ranks that compute
    on more than their share (mpi4py point-to-point on a private communicator).

    Construct it on every rank of ``group``; call :meth:`reads` for what to load and
    :meth:`exchange` on every rank every step, with the same ``sizes``.

    Args:
        lengths: every rank's partition size (samples), the same vector on every rank.
        group: the ranks whose batches form the global batch (default: the world).

    Raises:
        ValueError: ``lengths`` does not have one entry per rank, or is not usable.
    """

    def __init__(self, lengths: Sequence[int] | np.ndarray, *, group: Group | None = None) -> None:
        g = group if group is not None else comm.world()
        self.lengths = np.asarray(lengths, dtype=np.int64)
        if self.lengths.shape != (g.size,):
            raise ValueError(f"need one partition length per rank ({g.size}), got {lengths!r}")
        proportional_shares(1, self.lengths)  # checks the lengths
        self.group = comm.new_group(g.ranks) if g.size > 1 else g
        self.moved = 0  # samples this rank sent or received in the last exchange

    def reads(self, sizes: Sequence[int] | np.ndarray) -> np.ndarray:
        """Samples each rank loads from its own partition for compute batches ``sizes``."""
        return proportional_shares(int(np.sum(sizes)), self.lengths)

    def exchange(
        self, x: torch.Tensor, y: torch.Tensor, sizes: Sequence[int] | np.ndarray
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Send this rank's surplus (the last rows it read) and append what it receives.

        Args:
            x: the rows this rank read, ``reads(sizes)[rank]`` of them.
            y: their labels.
            sizes: every rank's compute batch this step.

        Returns:
            ``sizes[rank]`` rows: those it kept, then those received, in source-rank order.
        """
        me = self.group.rank
        plan = transfer_plan(self.reads(sizes), sizes)
        self.moved = 0
        if not plan:
            return x, y
        requests, cut = [], len(y)
        for src, dest, n in plan:
            if src == me:
                sel = slice(cut - n, cut)
                cut -= n
                for tag, rows in enumerate((x[sel], y[sel])):
                    requests.append(
                        comm.isend_tensor(rows.contiguous(), dest, tag=tag, group=self.group)
                    )
                self.moved += n
        xs, ys = [x[:cut]], [y[:cut]]
        for src, dest, n in plan:
            if dest == me:
                xs.append(comm.recv_tensor(src, tag=0, device=x.device, group=self.group))
                ys.append(comm.recv_tensor(src, tag=1, device=y.device, group=self.group))
                self.moved += n
        for req in requests:
            req.wait()
        if len(xs) == 1:
            return xs[0], ys[0]
        return torch.cat(xs), torch.cat(ys)
