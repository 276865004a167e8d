"""Stale-synchronous parallel (SSP): each rank steps at its own pace, at most S steps ahead.

Ho et al., "More effective distributed ML via a stale synchronous parallel parameter server",
NIPS 2013. The shared parameters live in one-sided MPI windows on the first rank
(:class:`hethpc.comm.rma.SharedState`, no server process): after its local optimizer step,
rank k adds its update, weighted by its share ``w_k = b_k / B``, to the shared parameters and
publishes its clock (the number of updates it has added); before its next step it waits until
every rank's clock is at least its own minus S, then reads the shared parameters, which hold
every update of the slowest rank's first clocks and whatever else has landed. Nothing else is
exchanged between steps: no collective, so a fast rank never waits for a slow one while it is
fewer than S steps ahead.

S = 0 is BSP: every rank waits for every update of the step before, and all read the same
parameters, ``theta + sum_k w_k * delta_k``; with SGD (momentum and weight decay included, as
they are linear in the gradients) this equals BSP's averaged-gradient step (tested).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from hethpc.comm.rma import SharedState
from hethpc.sync.averaging import average_buffers_
from hethpc.sync.policy import Outcome, StepInput, SyncPolicy

CLOCK, READS = 0, 1  # the counters of each rank: updates added, versions read
# Waiting for slower ranks polls their clocks, backing off from the first to the last delay.
POLL_FIRST_S = 50e-6
POLL_LAST_S = 2e-3


def _flat(model: torch.nn.Module) -> np.ndarray:
    return torch.cat([p.detach().reshape(-1).float().cpu() for p in model.parameters()]).numpy()


def _load_flat_(model: torch.nn.Module, flat: np.ndarray) -> None:
    offset = 0
    src = torch.from_numpy(flat)
    with torch.no_grad():
        for p in model.parameters():
            n = p.numel()
            p.copy_(src[offset : offset + n].reshape(p.shape).to(p.dtype))
            offset += n


class SSP(SyncPolicy):
    """Stale-synchronous parallel training over one-sided MPI.

    Args:
        staleness: S, how many steps a rank may run ahead of the slowest; ``>= 0`` (0 is BSP).
        group: the ranks that train together (default: the world).
        keep_records: keep every step's record.

    Attributes:
        max_clock_gap: the largest ``own clock - slowest clock`` seen when starting a step
            (at most S: the bound held).
        wait_s: seconds spent waiting for slower ranks.
        waits: steps on which this rank had to wait.

    Raises:
        ValueError: ``staleness`` is not an integer ``>= 0``.
    """

    name = "ssp"
    settings = ("staleness",)
    averages_parameters = False
    averages_while_training = False
    asynchronous = True
    exchange = "adds updates"
    compressions = ("none",)  # its updates go through one-sided windows of float32

    def __init__(self, *, staleness: int = 2, **kwargs: Any) -> None:
        if isinstance(staleness, bool) or int(staleness) != staleness or staleness < 0:
            raise ValueError(f"SSP staleness must be an integer >= 0 (steps), got {staleness!r}")
        super().__init__(**kwargs)
        self.staleness = int(staleness)
        self.max_clock_gap = 0
        self.wait_s = 0.0
        self.waits = 0
        self.gaps: list[int] = []  # per step, when keep_records: the clock gap at its start
        self.waited: list[bool] = []  # per step, when keep_records: whether it waited first
        self._shared: SharedState | None = None
        self._clock = 0
        self._buf: np.ndarray | None = None
        self._diverged = True  # replicas read the shared state at different times

    def prepare(self, model: torch.nn.Module) -> None:
        """Create the shared parameters from the first rank's ``model`` (collective; equal on
        every rank in a fresh run, a resumed run restarts from the first replica). Called by
        the first :meth:`step` when not before."""
        if self._shared is None:
            self._shared = SharedState(_flat(model), group=self.group, counters=2)
            self._shared.set_counter(CLOCK, self._clock)
            self._shared.set_counter(READS, self._clock)

    def _wait(self, which: int, need: int) -> tuple[int, bool]:
        """Wait until every rank's counter ``which`` is at least ``need``; (slowest, waited)."""
        assert self._shared is not None
        slowest = int(self._shared.counters()[which].min())
        if slowest >= need:
            return slowest, False
        t0 = time.perf_counter()
        delay = POLL_FIRST_S
        while slowest < need:
            time.sleep(delay)
            delay = min(delay * 2, POLL_LAST_S)
            slowest = int(self._shared.counters()[which].min())
        self.wait_s += time.perf_counter() - t0
        return slowest, True

    def _after_update(self, model: torch.nn.Module, delta: np.ndarray | None) -> float:
        """Add ``delta``, publish the clock, wait for the slowest, read; returns seconds."""
        shared = self._shared
        assert shared is not None
        t0 = time.perf_counter()
        waited = False
        if delta is not None:
            # Update number c may land once every rank has read version c - S: with S = 0
            # nobody's next update slips into a version another rank has yet to read.
            _, waited = self._wait(READS, self._clock - self.staleness)
            shared.add(delta)
        self._clock += 1
        shared.set_counter(CLOCK, self._clock)
        # The next step may start once the slowest rank has added clock - S updates.
        slowest, held = self._wait(CLOCK, self._clock - self.staleness)
        waited = waited or held
        self.waits += int(waited)
        gap = self._clock - slowest
        self.max_clock_gap = max(self.max_clock_gap, gap)
        if self.keep_records:
            self.gaps.append(gap)
            self.waited.append(waited)
        self._buf = shared.read(self._buf)
        shared.set_counter(READS, self._clock)
        _load_flat_(model, self._buf)
        return time.perf_counter() - t0

    def _step(self, s: StepInput) -> Outcome:
        model, optimizer, weight = s.model, s.optimizer, s.weight
        self.prepare(model)
        before = _flat(model)
        optimizer.step()
        share = 1.0 / self._size() if weight is None else float(weight)
        delta = (_flat(model) - before) * np.float32(share)
        seconds = self._after_update(model, delta)
        nbytes = 2 * delta.nbytes  # the update out, the parameters back
        return Outcome(synced=True, sync_s=seconds, bytes=nbytes)

    def skip(self, model: torch.nn.Module) -> None:
        """A step this rank skips (a non-finite gradient): no update, but the clock advances."""
        self.prepare(model)
        self._after_update(model, None)

    def _size(self) -> int:
        return self._shared.size if self._shared is not None else 1

    def finish(self, model: torch.nn.Module) -> bool:
        """Every rank reads the final shared parameters (after all have added their updates:
        one barrier) and averages its float buffers (BatchNorm statistics)."""
        if self._shared is None:
            return False
        self._shared.barrier()
        self._buf = self._shared.read(self._buf)
        _load_flat_(model, self._buf)
        self._bytes += average_buffers_(model, weight=self._last_weight, group=self.group)
        self._diverged = False
        return True

    def close(self) -> None:
        """Free the shared windows (collective)."""
        if self._shared is not None:
            self._shared.close()
            self._shared = None

    def summary_fields(self) -> dict[str, Any]:
        return {
            "staleness": self.staleness,
            "max_clock_gap": self.max_clock_gap,
            "wait_s": self.wait_s,
            "waits": self.waits,
        }

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "staleness": self.staleness, "clock": self._clock,
                "max_clock_gap": self.max_clock_gap}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("staleness") != self.staleness:
            raise ValueError(
                f"SSP state was saved with staleness {state.get('staleness')}, but this policy "
                f"has staleness {self.staleness}; build it with the saved setting"
            )
        super().load_state_dict(state)
        self._clock = int(state["clock"])
        self.max_clock_gap = int(state["max_clock_gap"])
