"""Background read of the next batch: when it pays, and the one-slot thread that does it."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

T = TypeVar("T")

# "auto" prefetches when the caller spends at least this share of a batch's load time between
# calls: then reading the next batch in the background hides it. Below that there is little
# to overlap and a thread hand-off per batch costs more than it hides (on a busy machine a
# woken thread can wait milliseconds for a core).
_AUTO_MIN_GAP = 0.25
_EWMA = 0.2  # weight of the newest gap / load time in their running means


def worth_prefetching(gap_s: float | None, load_s: float | None) -> bool:
    """Whether a background read of the next batch can hide anything (``prefetch="auto"``).

    Args:
        gap_s: mean seconds the caller spends between batches (its compute); None: unknown.
        load_s: mean seconds one batch takes to load; None: unknown.

    Returns:
        True until both are known, then whether ``gap_s >= 0.25 * load_s``.
    """
    if gap_s is None or load_s is None:
        return True
    return gap_s >= _AUTO_MIN_GAP * load_s


def running_mean(old: float | None, new: float) -> float:
    """The EWMA of gap and load times: ``new`` at first, then weight 0.2 on the newest."""
    return new if old is None else (1 - _EWMA) * old + _EWMA * new


class Prefetcher(Generic[T]):
    """One background read at a time, claimed by the key it was started for.

    A read started for one key and asked for under another (the guess was wrong) is
    cancelled; the caller then reads in line.
    """

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = ThreadPoolExecutor(
            1, thread_name_prefix="hethpc-prefetch"
        )
        self._pending: tuple[Hashable, Future[T]] | None = None

    @property
    def pending(self) -> bool:
        """Whether a read is under way (or done, unclaimed)."""
        return self._pending is not None

    def start(self, key: Hashable, fn: Callable[..., T], *args: object) -> None:
        """Run ``fn(*args)`` in the background, for :meth:`take` under ``key``."""
        if self._pool is not None:
            self._pending = (key, self._pool.submit(fn, *args))

    def take(self, key: Hashable) -> T | None:
        """The result of the pending read if it was started for ``key``; otherwise None (and
        the pending read, if any, is cancelled)."""
        if self._pending is None:
            return None
        got, fut = self._pending
        self._pending = None
        if got == key:
            return fut.result()
        fut.cancel()
        return None

    def cancel(self) -> None:
        """Drop the pending read, if any."""
        if self._pending is not None:
            self._pending[1].cancel()
            self._pending = None

    def close(self, *, wait: bool = True) -> None:
        """Stop the thread (``wait``: for a read under way to end)."""
        if self._pool is not None:
            self._pool.shutdown(wait=wait, cancel_futures=True)
            self._pool = None
            self._pending = None
