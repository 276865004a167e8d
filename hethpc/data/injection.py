"""Data injection for non-IID training: a few samples of each batch really move between ranks."""

from __future__ import annotations

import math

import numpy as np
import torch

from hethpc import comm
from hethpc.comm import Group


def local_batch_size(b: int, alpha: float, beta: float, world_size: int) -> int:
    """``b' = round(b / (1 + alpha * beta * N))``, at least 1; ``b`` in a world of one rank.

    The rank trains on its ``b'`` own samples plus those it receives, about
    ``alpha * beta * N * b'`` per step, so the effective batch stays about ``b``.
    """
    if world_size <= 1 or alpha == 0 or beta == 0 or b == 0:
        return int(b)
    return max(1, int(math.floor(b / (1.0 + alpha * beta * world_size) + 0.5)))


def share_size(b_local: int, beta: float) -> int:
    """Samples a sender shares with each other rank: ``round(beta * b')``."""
    return min(int(b_local), int(math.floor(beta * b_local + 0.5)))


def senders(alpha: float, world_size: int, step: int, seed: int) -> np.ndarray:
    """The ``ceil(alpha * N)`` sender ranks of ``step``, sorted; the same on every rank."""
    k = min(world_size, math.ceil(alpha * world_size - 1e-9))
    if k <= 0:
        return np.empty(0, dtype=np.int64)
    rng = np.random.default_rng([int(seed), int(step)])
    return np.sort(rng.choice(world_size, size=k, replace=False)).astype(np.int64)


class Injector:
    """Each step, ``ceil(alpha * N)`` seeded sender ranks each send a ``beta`` fraction of
    their batch to every other rank (mpi4py point-to-point); receivers append what they get.

    Construct it on every rank (it makes its own communicator, so its messages never mix with
    other traffic). Call :meth:`exchange` on every rank every step, with the same ``step``.

    Args:
        alpha: fraction of ranks that send each step, in ``[0, 1]``.
        beta: fraction of a sender's batch sent to each other rank, in ``[0, 1]``.
        seed: the same on every rank.
        group: the ranks that exchange (default: the world).

    Raises:
        ValueError: alpha or beta outside ``[0, 1]``.
    """

    def __init__(
        self, alpha: float, beta: float, *, seed: int = 0, group: Group | None = None
    ) -> None:
        if not (0.0 <= alpha <= 1.0 and 0.0 <= beta <= 1.0):
            raise ValueError(f"alpha and beta must lie in [0, 1], got alpha={alpha}, beta={beta}")
        self.alpha, self.beta, self.seed = float(alpha), float(beta), int(seed)
        g = group if group is not None else comm.world()
        # A private communicator over the same ranks keeps these tags apart from other traffic.
        self.group = comm.new_group(g.ranks) if g.size > 1 else g
        self.received = 0  # samples received in the last exchange

    @property
    def world_size(self) -> int:
        """Ranks taking part."""
        return self.group.size

    def local_batch(self, b: int) -> int:
        """The rank's own samples per step for an effective batch ``b``."""
        return local_batch_size(b, self.alpha, self.beta, self.world_size)

    def exchange(
        self, x: torch.Tensor, y: torch.Tensor, step: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Send this rank's share if it is a sender; append the shares of the other senders.

        Args:
            x: this rank's batch, shape ``[b', ...]``.
            y: its labels, shape ``[b']``.
            step: the training step (the same on every rank).

        Returns:
            ``(x, y)`` followed by the samples received, in sender-rank order.
        """
        self.received = 0
        n, me = self.world_size, self.group.rank
        if n == 1 or self.alpha == 0 or self.beta == 0:
            return x, y
        who = senders(self.alpha, n, step, self.seed)
        requests = []
        if me in who:
            s = share_size(len(y), self.beta)
            rng = np.random.default_rng([self.seed, int(step), me])
            pick = rng.choice(len(y), s, replace=False)
            sel = torch.from_numpy(np.sort(pick))
            xs, ys = x[sel].contiguous(), y[sel].contiguous()
            for dest in range(n):
                if dest != me:
                    requests.append(comm.isend_tensor(xs, dest, tag=0, group=self.group))
                    requests.append(comm.isend_tensor(ys, dest, tag=1, group=self.group))
        xs_in, ys_in = [x], [y]
        for src in who.tolist():
            if src != me:
                xs_in.append(comm.recv_tensor(src, tag=0, device=x.device, group=self.group))
                ys_in.append(comm.recv_tensor(src, tag=1, device=y.device, group=self.group))
        for r in requests:
            r.wait()
        self.received = sum(len(t) for t in ys_in[1:])
        if len(ys_in) == 1:
            return x, y
        return torch.cat(xs_in), torch.cat(ys_in)
