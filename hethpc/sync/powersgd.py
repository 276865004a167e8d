"""PowerSGD: low-rank gradients with error feedback (Vogels et al., NeurIPS 2019).

A matrix-shaped gradient ``M`` (``n x m``, its first dimension by the rest) is sent as two thin
factors: ``P = M Q`` (``n x r``), summed over ranks and orthonormalised, then ``Q = M^T P``
(``m x r``), summed; every rank rebuilds ``P Q^T``, the projection of the summed gradient on the
span of ``P``. One step of power iteration per training step, warm-started from the last
step's ``Q``, follows the gradient's leading subspace as it moves. What the projection drops is
kept per rank (error feedback) and added to the next step's gradient, so nothing is lost for
good, only late. Vectors (biases, norms) and matrices too small to gain
(``(n + m) r * min_compression_rate >= n m``) travel as they are, in the first of the two
allreduces. The first ``start_step`` steps are plain allreduces: early gradients change fast.

The math is :meth:`PowerSGD.reduce_`, a function of this rank's gradients and a summing
``allreduce`` it is given (tested without MPI); :func:`~hethpc.sync.averaging.average_gradients_`
passes hethpc's collectives. The state (error buffers, ``Q``, the step) is in
:meth:`PowerSGD.state_dict`, which a policy's checkpoint carries.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from hethpc.sync.compression import Codec

DEFAULT_RANK = 4
DEFAULT_START_STEP = 10
MIN_COMPRESSION_RATE = 2.0

# The summing allreduce PowerSGD is given: a flat tensor, summed over ranks in place, and the
# part of the step it carries ("first": P and the uncompressed tensors, "second": Q).
Allreduce = Callable[[torch.Tensor, str], None]


def matrix_shape(shape: Sequence[int]) -> tuple[int, int]:
    """The ``n x m`` view of a gradient: its first dimension by the product of the rest."""
    return int(shape[0]), math.prod(shape[1:])


def compressible(shape: Sequence[int], rank: int, min_rate: float = MIN_COMPRESSION_RATE) -> bool:
    """Whether a gradient of ``shape`` is sent as rank-``rank`` factors: at least 2-D, and
    ``min_rate`` times more elements than its factors."""
    if len(shape) < 2:
        return False
    n, m = matrix_shape(shape)
    return (n + m) * rank * min_rate < n * m


def orthonormalise(p: torch.Tensor) -> torch.Tensor:
    """Orthonormal columns spanning those of ``p`` (``n x r``, ``n >= r``), by a reduced QR on
    ``p``'s device; the same bits on every rank from the same ``p``."""
    return torch.linalg.qr(p, mode="reduced").Q


@dataclass
class Round:
    """One reduction in progress (:meth:`PowerSGD.begin_`): the tensors the first allreduce
    carries as they are (``rest``), the compressed gradients' keys, matrix views and ``P``s,
    and the flat buffers of each allreduce; ``nbytes`` is what it sends."""

    rest: list[torch.Tensor]
    index: list[int]
    ms: list[torch.Tensor]
    ps: list[torch.Tensor]
    first: torch.Tensor
    nbytes: int
    qs: list[torch.Tensor] = field(default_factory=list)
    second: torch.Tensor | None = None


class PowerSGD(Codec):
    """Rank-``rank`` PowerSGD of gradients, with error feedback and warm-started ``Q``.

    Args:
        rank: r, the rank of each compressed gradient; at least 1 (default 4).
        start_step: plain allreduces for this many first steps (default 10).
        min_compression_rate: compress a matrix only where its factors are this many times
            smaller (default 2).
        seed: of the first ``Q`` (the same on every rank).

    Raises:
        ValueError: ``rank`` or ``start_step`` out of range.
    """

    name: ClassVar[str] = "powersgd"

    def __init__(
        self,
        rank: int = DEFAULT_RANK,
        *,
        start_step: int = DEFAULT_START_STEP,
        min_compression_rate: float = MIN_COMPRESSION_RATE,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise ValueError(f"powersgd rank must be an integer >= 1, got {rank!r}")
        if isinstance(start_step, bool) or not isinstance(start_step, int) or start_step < 0:
            raise ValueError(f"powersgd start_step must be an integer >= 0, got {start_step!r}")
        self.rank = rank
        self.start_step = start_step
        self.min_compression_rate = float(min_compression_rate)
        self.seed = int(seed)
        self.step = 0  # reductions so far
        self.errors: dict[int, torch.Tensor] = {}  # by gradient index: what was not sent yet
        self.qs: dict[int, torch.Tensor] = {}  # by gradient index: the last Q (m x r)

    @property
    def compresses(self) -> bool:
        return True

    def spec(self) -> str:
        return f"{self.name}:{self.rank}"

    def plan(self, shapes: Sequence[Sequence[int]]) -> list[bool]:
        """Which of the gradients of ``shapes`` travel as factors."""
        return [compressible(s, self.rank, self.min_compression_rate) for s in shapes]

    def step_bytes(self, shapes: Sequence[Sequence[int]], itemsize: int) -> int:
        """Bytes a reduction of gradients of ``shapes`` sends at the current step."""
        if self.step < self.start_step:
            return sum(math.prod(s) for s in shapes) * itemsize
        total = 0
        for shape, low in zip(shapes, self.plan(shapes), strict=True):
            n, m = matrix_shape(shape) if low else (math.prod(shape), 0)
            total += (n + m) * self.rank if low else n
        return total * itemsize

    def skip_(self, grads: Sequence[torch.Tensor]) -> int:
        """A world of one rank: nothing to send, the gradients stay; the step counts, and the
        bytes it would have sent are returned (so a run's figures do not depend on its size)."""
        nbytes = self.step_bytes([tuple(g.shape) for g in grads], grads[0].element_size())
        self.step += 1
        return nbytes

    def _q(self, i: int, m: int, like: torch.Tensor) -> torch.Tensor:
        q = self.qs.get(i)
        if q is None:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
            q = torch.randn(m, self.rank, generator=g).to(like.device, like.dtype)
            self.qs[i] = q
        elif q.device != like.device:  # restored from a checkpoint on the CPU
            q = self.qs[i] = q.to(like.device)
        return q

    @torch.no_grad()
    def reduce_(self, grads: Sequence[torch.Tensor], allreduce: Allreduce, ranks: int = 1) -> int:
        """Replace ``grads`` (this rank's, weighted: their sum over ranks is the update) by
        their sum over ranks, low-rank where :meth:`plan` says; returns the bytes sent.

        Two calls of ``allreduce`` (one before ``start_step``), the same on every rank;
        ``ranks``: how many ranks it sums over. Each rank keeps ``1 / ranks`` of what the sum
        dropped (its part less that share of the projection), so the errors the ranks add to
        their next gradients sum to exactly what this step's update lacked.

        The same as :meth:`begin_`, :meth:`middle_`, :meth:`end_` and :meth:`advance` (how
        overlapped buckets run it, one round per bucket, their first sums during the backward
        pass).

        Raises:
            ValueError: the gradients are not of one floating-point dtype.
        """
        round_ = self.begin_(grads)
        allreduce(round_.first, "first")
        second = self.middle_(round_)
        if second is not None:
            allreduce(second, "second")
        self.end_(round_, ranks)
        self.advance()
        return round_.nbytes

    @torch.no_grad()
    def begin_(self, grads: Sequence[torch.Tensor], keys: Sequence[int] | None = None) -> Round:
        """The first part of one reduction of ``grads`` (some or all of a step's): adds the
        kept errors, projects on ``Q``; :attr:`Round.first` is what the first allreduce sums
        (``P`` and the uncompressed tensors; before ``start_step``, every gradient). ``keys``
        name each gradient's error and ``Q`` (default: its position), the same on every rank
        and every step. The step advances only at :meth:`advance`.

        Raises:
            ValueError: the gradients are not of one floating-point dtype.
        """
        if len({g.dtype for g in grads}) > 1 or not grads[0].is_floating_point():
            raise ValueError(
                f"powersgd needs gradients of one floating-point dtype, got "
                f"{sorted({str(g.dtype) for g in grads})}; use compression none, fp16 or bf16"
            )
        keys = list(range(len(grads))) if keys is None else list(keys)
        shapes = [tuple(g.shape) for g in grads]
        nbytes = self.step_bytes(shapes, grads[0].element_size())
        if self.step < self.start_step:
            flat = torch.cat([g.reshape(-1) for g in grads])
            return Round(list(grads), [], [], [], flat, nbytes)
        low = self.plan(shapes)
        rest = [g for g, lo in zip(grads, low, strict=True) if not lo]
        index = [keys[i] for i, lo in enumerate(low) if lo]
        ms = [g.reshape(matrix_shape(g.shape)) for g, lo in zip(grads, low, strict=True) if lo]
        for i, m in zip(index, ms, strict=True):  # views of the grads
            if i in self.errors:
                if self.errors[i].device != m.device:  # restored from a checkpoint on the CPU
                    self.errors[i] = self.errors[i].to(m.device)
                m.add_(self.errors[i])
        ps = [m @ self._q(i, m.shape[1], m) for i, m in zip(index, ms, strict=True)]
        first = torch.cat([t.reshape(-1) for t in (*rest, *ps)])
        return Round(rest, index, ms, ps, first, nbytes)

    @torch.no_grad()
    def middle_(self, round_: Round) -> torch.Tensor | None:
        """After the first allreduce: the uncompressed sums in place, ``P`` orthonormalised;
        what the second allreduce sums (``Q``), or None where there is none (before
        ``start_step``, or no matrix compressed)."""
        _unpack_(round_.first, [*round_.rest, *round_.ps])
        if not round_.ms:
            return None
        round_.ps = [orthonormalise(p) for p in round_.ps]
        round_.qs = [m.T @ p for m, p in zip(round_.ms, round_.ps, strict=True)]
        round_.second = torch.cat([q.reshape(-1) for q in round_.qs])
        return round_.second

    @torch.no_grad()
    def end_(self, round_: Round, ranks: int = 1) -> None:
        """After the second allreduce: each compressed gradient is the projection of the sum,
        and this rank keeps ``1 / ranks`` of what it dropped (see :meth:`reduce_`)."""
        if round_.second is None:
            return
        _unpack_(round_.second, round_.qs)
        for i, m, p, q in zip(round_.index, round_.ms, round_.ps, round_.qs, strict=True):
            approx = p @ q.T
            self.errors[i] = m - approx / ranks  # its share of what the sum did not carry
            m.copy_(approx)
            self.qs[i] = q

    def advance(self) -> None:
        """Count one step (every reduction of the step done)."""
        self.step += 1

    def state_dict(self) -> dict[str, Any]:
        return {
            "spec": self.spec(),
            "start_step": self.start_step,
            "step": self.step,
            "errors": dict(self.errors),
            "qs": dict(self.qs),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` saved with the same rank (another starts afresh)."""
        if state.get("spec") != self.spec():
            return
        self.step = int(state["step"])
        self.errors = dict(state["errors"])
        self.qs = dict(state["qs"])


def _unpack_(flat: torch.Tensor, tensors: list[torch.Tensor]) -> None:
    """Copy consecutive slices of ``flat`` back into ``tensors``."""
    offset = 0
    for t in tensors:
        n = t.numel()
        t.copy_(flat[offset : offset + n].view_as(t))
        offset += n
