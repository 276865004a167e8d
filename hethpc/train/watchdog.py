"""The job's watchdog: when no rank makes progress, name the stalled rank and end the job."""

from __future__ import annotations

import faulthandler
import json
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

# Phases that may last long by nature (rank 0 saving a checkpoint, evaluating): a rank in one
# of them is allowed the ceiling, and so are the peers waiting for it.
PATIENT = frozenset({"checkpoint", "evaluate"})
# Phases in which a rank waits for the others (a collective): a rank stuck there is a victim.
WAITING = frozenset({"sync", "barrier"})
EXIT_CODE = 3


def stall_limit(floor_s: float, ceiling_s: float, slowest_s: float, *, scale: float) -> float:
    """The seconds without progress after which a rank counts as stalled.

    ``scale`` times the slowest gap between two progress points seen so far, but at least
    ``floor_s`` and at most ``ceiling_s``.
    """
    return min(max(floor_s, scale * slowest_s), ceiling_s)


@dataclass
class Peer:
    """What this rank knows of another rank from its heartbeat file."""

    rank: int
    step: int
    phase: str
    idle_s: float  # seconds without progress when the peer last wrote
    beat: int  # increases at every write: a peer whose beat stands still is not running
    pid: int
    host: str
    seen_change: float  # this rank's monotonic time at which ``beat`` last changed


def culprits(mine: Peer, peers: list[Peer], *, now: float, frozen_s: float) -> list[Peer]:
    """The ranks to blame for a job-wide stall, from what every rank last reported.

    A rank that stopped running (its heartbeat stands still) first; otherwise the ranks not
    waiting in a collective; otherwise the ranks at the lowest step.
    """
    everyone = [mine, *peers]
    frozen = [p for p in peers if now - p.seen_change >= frozen_s]
    if frozen:
        return frozen
    working = [p for p in everyone if p.phase not in WAITING]
    if working and len(working) < len(everyone):
        return working
    low = min(p.step for p in everyone)
    return [p for p in everyone if p.step == low]


class Watchdog:
    """Ends the job when this rank, and every rank it can see, stopped making progress.

    The training loop calls :meth:`kick` at each progress point (``step``, ``phase``). A
    monitor thread writes this rank's heartbeat (step, phase, seconds idle) to
    ``heartbeat_dir/rank<k>.json`` every ``tick_s``. When this rank has been idle longer than
    the limit (:func:`stall_limit`: ``scale`` times the slowest gap between kicks, within
    ``[timeout_s, max_s]``), the monitor reads the others' heartbeats: if some rank still makes
    progress (rank 0 evaluating while the others wait), it waits on, up to ``max_s``;
    otherwise it prints which rank stalled, at which step and phase, writes this rank's stacks
    next to the heartbeats, and exits with code 3, which makes the launcher (mpirun, srun) end
    every rank. A rank stopped by a signal or hung in C code cannot report itself; a waiting
    peer names it. A ``faulthandler`` backstop ends this process should the monitor itself be
    unable to run.

    Args:
        timeout_s: the limit's floor in seconds; 0 disables the watchdog.
        max_s: the limit's ceiling (default: ``timeout_s``).
        scale: the limit as a multiple of the slowest gap between kicks.
        heartbeat_dir: where heartbeats go (shared by the ranks); None: this rank alone.
        rank: this process's rank.
        size: the number of ranks.
        stream: where the message goes (default: stderr).
    """

    def __init__(
        self,
        timeout_s: float,
        *,
        max_s: float | None = None,
        scale: float = 20.0,
        heartbeat_dir: str | os.PathLike[str] | None = None,
        rank: int = 0,
        size: int = 1,
        stream: TextIO | None = None,
    ) -> None:
        if not timeout_s >= 0:
            raise ValueError(f"timeout_s must be a non-negative number, got {timeout_s}")
        self.timeout_s = float(timeout_s)
        self.max_s = max(float(max_s if max_s is not None else timeout_s), self.timeout_s)
        self.scale = scale
        self.dir = Path(heartbeat_dir) if heartbeat_dir is not None else None
        self.rank, self.size = rank, size
        self.stream = stream or sys.stderr
        self.tick_s = min(1.0, self.timeout_s / 10) if self.timeout_s else 1.0
        self._step, self._phase = -1, "start"
        self._last = time.monotonic()
        self._slowest = 0.0
        self._beat = 0
        self._peers: dict[int, Peer] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # Called by the training loop -------------------------------------------------------------

    def kick(self, step: int | None = None, phase: str = "step") -> None:
        """Record progress: this rank reached ``phase`` of ``step`` (cheap: no I/O)."""
        now = time.monotonic()
        if self._phase not in PATIENT:
            self._slowest = max(self._slowest, now - self._last)
        self._last = now
        if step is not None:
            self._step = step
        self._phase = phase

    def limit(self) -> float:
        """The current limit in seconds (the ceiling while in a patient phase)."""
        if self._phase in PATIENT:
            return self.max_s
        return stall_limit(self.timeout_s, self.max_s, self._slowest, scale=self.scale)

    def start(self) -> None:
        """Start the monitor thread (once)."""
        if self.timeout_s == 0 or self._thread is not None:
            return
        if self.dir is not None:
            self.dir.mkdir(parents=True, exist_ok=True)
        self._last = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="hethpc-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the monitor and its backstop."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        faulthandler.cancel_dump_traceback_later()

    def __enter__(self) -> Watchdog:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # The monitor thread ------------------------------------------------------------------------

    def _me(self, now: float) -> Peer:
        return Peer(
            rank=self.rank, step=self._step, phase=self._phase, idle_s=now - self._last,
            beat=self._beat, pid=os.getpid(), host=os.uname().nodename, seen_change=now,
        )  # fmt: skip

    def _write_beat(self, me: Peer) -> None:
        if self.dir is None:
            return
        self._beat += 1
        record = {**me.__dict__, "beat": self._beat}
        del record["seen_change"]
        path = self.dir / f"rank{self.rank}.json"
        tmp = path.with_name(f".{path.name}.tmp")
        try:
            tmp.write_text(json.dumps(record))
            os.replace(tmp, path)
        except OSError:
            pass  # a full or vanished disk must not end a healthy run; the limit still holds

    def _read_peers(self, now: float) -> None:
        if self.dir is None:
            return
        for r in range(self.size):
            if r == self.rank:
                continue
            try:
                d: dict[str, Any] = json.loads((self.dir / f"rank{r}.json").read_text())
            except (OSError, ValueError):
                continue  # not written yet, or not visible from this node
            old = self._peers.get(r)
            changed = old is None or old.beat != d["beat"]
            self._peers[r] = Peer(
                rank=r, step=int(d["step"]), phase=str(d["phase"]), idle_s=float(d["idle_s"]),
                beat=int(d["beat"]), pid=int(d["pid"]), host=str(d["host"]),
                seen_change=now if changed or old is None else old.seen_change,
            )  # fmt: skip

    def _run(self) -> None:
        while not self._stop.wait(self.tick_s):
            now = time.monotonic()
            limit = self.limit()
            # The backstop: should this thread stop running, the process still ends.
            faulthandler.dump_traceback_later(limit + 30, exit=True, file=self.stream)
            me = self._me(now)
            self._write_beat(me)
            if me.idle_s <= limit / 2:
                self._peers.clear()
                continue
            self._read_peers(now)  # observed from half the limit on: stopped peers show
            if me.idle_s <= limit:
                continue
            frozen_s = min(limit / 2, 10.0)
            busy = [
                p
                for p in self._peers.values()
                if now - p.seen_change < frozen_s
                and p.idle_s < (self.max_s if p.phase in PATIENT else limit)
            ]
            if busy and me.idle_s < self.max_s:
                continue  # another rank is working (evaluating, saving): wait for it
            self._fire(me, now, limit, frozen_s)

    def _fire(self, me: Peer, now: float, limit: float, frozen_s: float) -> None:
        peers = sorted(self._peers.values(), key=lambda p: p.rank)
        blamed = culprits(me, peers, now=now, frozen_s=frozen_s)
        who = "; ".join(
            f"rank {p.rank} (pid {p.pid} on {p.host}) at step {p.step}, {p.phase}"
            + (
                f", not answering for {now - p.seen_change:.0f} s"
                if p.rank != self.rank and now - p.seen_change >= frozen_s
                else f", idle {p.idle_s:.0f} s"
            )
            for p in blamed
        )
        unseen = self.size - 1 - len(peers)
        stacks = ""
        if self.dir is not None:
            path = self.dir / f"stacks-rank{self.rank}.txt"
            try:
                with path.open("w") as f:
                    faulthandler.dump_traceback(file=f, all_threads=True)
                stacks = f" This rank's stacks: {path}."
            except OSError:
                pass
        lines = [
            f"hethpc watchdog (rank {self.rank}): no progress for {me.idle_s:.0f} s "
            f"(limit {limit:.0f} s, --watchdog-s) at step {me.step}, {me.phase}.",
            f"Stalled: {who}." if peers or self.size == 1 else "",
            f"{unseen} rank(s) wrote no heartbeat visible here." if unseen > 0 else "",
            f"Ending the job (exit code {EXIT_CODE}).{stacks}",
        ]
        self.stream.write(" ".join(line for line in lines if line) + "\n")
        self.stream.flush()
        os._exit(EXIT_CODE)
