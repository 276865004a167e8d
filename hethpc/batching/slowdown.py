"""Emulated heterogeneity: make a rank FACTOR times slower, on a schedule over steps."""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from hethpc.batching.errors import SlowdownError


@dataclass(frozen=True)
class Slowdown:
    """From step ``step`` on, rank ``rank`` computes ``factor`` times slower.

    Attributes:
        rank: the rank slowed (in the batching group).
        factor: >= 1; 1 restores full speed.
        step: the first step at which the factor applies (default 0).
    """

    rank: int
    factor: float
    step: int = 0

    def __post_init__(self) -> None:
        if self.rank < 0:
            raise SlowdownError(f"slowdown rank must be >= 0, got {self.rank}")
        if not math.isfinite(self.factor) or self.factor < 1:
            raise SlowdownError(
                f"slowdown factor must be a finite number >= 1 (1 = full speed), got {self.factor} "
                f"for rank {self.rank}"
            )
        if self.step < 0:
            raise SlowdownError(f"slowdown step must be >= 0, got {self.step} for rank {self.rank}")


@dataclass(frozen=True)
class SlowdownSchedule:
    """A list of :class:`Slowdown` entries; for each rank the latest started entry applies.

    Written as ``"rank:factor@step,..."``, e.g. ``"1:3@0,1:1@400"``: rank 1 is 3x slower from
    step 0 and back to full speed at step 400. ``@step`` may be left out (step 0).
    """

    entries: tuple[Slowdown, ...] = ()

    def __post_init__(self) -> None:
        seen = {(e.rank, e.step) for e in self.entries}
        if len(seen) != len(self.entries):
            raise SlowdownError(f"two slowdown entries give the same rank and step: {self.spec}")

    @classmethod
    def parse(cls, spec: str | None) -> SlowdownSchedule:
        """Parse ``"rank:factor@step,..."``; None or ``""`` gives no slowdown.

        Raises:
            SlowdownError: an entry does not read as ``rank:factor[@step]`` or is out of range.
        """
        if spec is None or not spec.strip():
            return cls()
        entries = []
        for item in spec.split(","):
            text = item.strip()
            try:
                head, sep, at = text.partition("@")
                r, f = head.split(":")
                entries.append(Slowdown(int(r), float(f), int(at) if sep else 0))
            except SlowdownError:
                raise
            except ValueError:
                raise SlowdownError(
                    f"cannot read slowdown entry {text!r} in {spec!r}; write rank:factor[@step], "
                    "e.g. '1:3@0,1:1@400'"
                ) from None
        return cls(tuple(entries))

    @classmethod
    def of(cls, value: SlowdownSchedule | str | Iterable[Slowdown] | None) -> SlowdownSchedule:
        """Coerce a schedule, a spec string, entries or None into a schedule."""
        if isinstance(value, SlowdownSchedule):
            return value
        if value is None or isinstance(value, str):
            return cls.parse(value)
        return cls(tuple(value))

    @property
    def spec(self) -> str:
        """The schedule in the ``rank:factor@step`` notation."""
        return ",".join(f"{e.rank}:{e.factor:g}@{e.step}" for e in self.entries)

    @property
    def max_rank(self) -> int:
        """The highest rank named, or -1 for an empty schedule."""
        return max((e.rank for e in self.entries), default=-1)

    def factor(self, rank: int, step: int) -> float:
        """The slowdown of ``rank`` at ``step`` (1.0 when no entry applies)."""
        started = [e for e in self.entries if e.rank == rank and e.step <= step]
        return max(started, key=lambda e: e.step).factor if started else 1.0

    def change_steps(self) -> list[int]:
        """The steps at which some rank's factor changes, sorted (step 0 excluded)."""
        return sorted({e.step for e in self.entries if e.step > 0})


STRETCH_MODES = ("busy", "sleep")
# Side of the busy loop's matrices: one product takes tens of microseconds on one core.
_BUSY_SIDE = 128


def stretch(elapsed_s: float, factor: float, *, mode: str = "sleep") -> None:
    """Make a computation of ``elapsed_s`` seconds take ``factor`` times as long.

    Args:
        elapsed_s: the computation's seconds so far.
        factor: the slowdown (1 or less: return at once).
        mode: ``"sleep"`` sleeps for the extra ``(factor - 1) * elapsed_s`` seconds, which
            frees the core (on a host shared by several ranks the others may compute faster
            while this one waits); ``"busy"`` keeps computing (small CPU matrix products), as
            a slower processor would stay busy, which with more ranks than cores takes time
            from the others.

    Raises:
        SlowdownError: ``mode`` is not one of :data:`STRETCH_MODES`.
    """
    if mode not in STRETCH_MODES:
        raise SlowdownError(f"slowdown mode must be one of {STRETCH_MODES}, got {mode!r}")
    if not (factor > 1 and elapsed_s > 0):
        return
    extra = (factor - 1) * elapsed_s
    if mode == "sleep":
        time.sleep(extra)
        return
    deadline = time.perf_counter() + extra
    a = torch.ones(_BUSY_SIDE, _BUSY_SIDE)
    while time.perf_counter() < deadline:
        torch.mm(a, a)  # tens of microseconds each: the deadline is met that closely


def pace(t0: float, seconds: float) -> bool:
    """Sleep until ``seconds`` after ``t0`` (a ``time.perf_counter()`` reading); False when
    that moment had already passed."""
    left = t0 + seconds - time.perf_counter()
    if left <= 0:
        return False
    time.sleep(left)
    return True
