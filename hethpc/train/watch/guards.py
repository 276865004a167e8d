"""Start-up and per-step checks that every rank agrees: model layout and finite values."""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import torch
from torch import nn

from hethpc import comm
from hethpc.comm import Group, ReduceOp
from hethpc.train.errors import ModelMismatchError


def model_signature(model: nn.Module) -> list[tuple[str, tuple[int, ...], str]]:
    """``(name, shape, dtype)`` of every parameter and buffer, in registration order."""
    return [(n, tuple(t.shape), str(t.dtype)) for n, t in model.state_dict().items()]


def describe_mismatch(signatures: list[list[tuple[str, tuple[int, ...], str]]]) -> str:
    """Human-readable differences between rank 0's signature and the others' ('' if none)."""
    ref = signatures[0]
    lines = []
    for r, sig in enumerate(signatures[1:], start=1):
        if sig == ref:
            continue
        a, b = dict((n, (s, d)) for n, s, d in ref), dict((n, (s, d)) for n, s, d in sig)
        only0, onlyr = sorted(set(a) - set(b)), sorted(set(b) - set(a))
        if only0:
            lines.append(f"rank {r} lacks {only0[:5]}")
        if onlyr:
            lines.append(f"rank {r} has extra {onlyr[:5]}")
        for n in a.keys() & b.keys():
            if a[n] != b[n]:
                lines.append(
                    f"{n}: rank 0 has shape {a[n][0]} {a[n][1]}, rank {r} has {b[n][0]} {b[n][1]}"
                )
        if not lines or (not only0 and not onlyr and [n for n, *_ in ref] != [n for n, *_ in sig]):
            lines.append(f"rank {r} registers the parameters in a different order")
    return "; ".join(lines)


def describe_layers(layouts: list[list[tuple[str, str]]]) -> str:
    """The first module whose class differs from rank 0's, per rank ('' if none).

    Catches models with the same parameters but other layers (an activation, a wrapper).
    """
    lines = []
    for r, lay in enumerate(layouts[1:], start=1):
        for (n0, t0), (nr, tr) in zip(layouts[0], lay, strict=False):
            if (n0, t0) != (nr, tr):
                lines.append(f"module {n0} is {t0} on rank 0, module {nr} is {tr} on rank {r}")
                break
        else:
            if len(lay) != len(layouts[0]):
                lines.append(f"rank {r} has {len(lay)} modules, rank 0 {len(layouts[0])}")
    return "; ".join(lines)


def check_same_model(model: nn.Module, group: Group | None = None) -> None:
    """Refuse to train when the ranks' models differ (checked before any allreduce).

    Raises:
        ModelMismatchError: on every rank, naming the differing parameters and ranks.
    """
    layout = [(name or "(root)", type(m).__qualname__) for name, m in model.named_modules()]
    gathered = comm.allgather_object((model_signature(model), layout), group)
    detail = describe_mismatch([sig for sig, _ in gathered]) or describe_layers(
        [lay for _, lay in gathered]
    )
    if detail:
        raise ModelMismatchError(
            f"the ranks built different models: {detail}. "
            "Build the same model on every rank (the same --model and data)."
        )


def local_nonfinite(loss: torch.Tensor | float, grads: Iterable[torch.Tensor | None]) -> bool:
    """Whether this rank's loss or any gradient holds a NaN or Inf."""
    if not math.isfinite(float(loss.detach() if isinstance(loss, torch.Tensor) else loss)):
        return True
    return not all_finite([g for g in grads if g is not None])


def nonfinite_ranks(flag: bool, group: Group | None = None) -> list[int]:
    """Every rank's vote, agreed collectively: the ranks whose values were not finite.

    One tiny allreduce decides; only when some rank is bad are the votes gathered, to name it.
    """
    mine = np.array([1 if flag else 0], dtype=np.int32)
    if int(comm.allreduce_array(mine, ReduceOp.SUM, group)[0]) == 0:
        return []
    votes = comm.allgather_array(mine, group)
    return [int(r) for r in np.flatnonzero(votes[:, 0])]


def poison_if_nonfinite_(loss: torch.Tensor, grads: Iterable[torch.Tensor | None]) -> None:
    """Make the first gradient NaN when ``loss`` is not finite, without a host sync.

    A non-finite gradient already turns the averaged gradient non-finite on every rank; this
    makes a non-finite loss do the same, so :class:`AveragedGradientGuard` sees both.
    """
    first = next((g for g in grads if g is not None), None)
    if first is not None:
        first.add_(loss.detach().to(first.dtype) * 0)  # 0 when finite, NaN otherwise


def all_finite(tensors: list[torch.Tensor]) -> bool:
    """Whether every element of ``tensors`` is finite (one fused norm, one host sync)."""
    if not tensors:
        return True
    return bool(torch.isfinite(torch.stack(torch._foreach_norm(tensors))).all())


class AveragedGradientGuard:
    """Skips every optimizer step whose gradients are not finite (a step pre-hook).

    Under BSP every rank applies the same averaged gradient, and a NaN or Inf on any rank
    (with :func:`poison_if_nonfinite_` for the loss) makes that average non-finite everywhere:
    all ranks skip the same steps without a vote. The gradients are dropped (set to None), so
    the optimizer leaves parameters, momentum and step counts as they were.

    Args:
        optimizer: the optimizer to guard.
    """

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.tripped = False  # whether the last step was skipped
        self._handle = optimizer.register_step_pre_hook(self._check)

    def _check(self, optimizer: torch.optim.Optimizer, *_: object) -> None:
        params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        self.tripped = not all_finite([p.grad for p in params])
        if self.tripped:
            for p in params:
                p.grad = None

    def remove(self) -> None:
        """Detach the hook."""
        self._handle.remove()
