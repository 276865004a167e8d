"""The watchdog's monitor process: it watches one rank from outside and ends it when all stall.

Run by :class:`hethpc.train.watch.watchdog.Watchdog` as ``python stall_monitor.py ...`` (standard
library only, so it starts in milliseconds and imports nothing of hethpc). A separate process
keeps watching when the rank cannot run Python at all: stopped by a signal, or inside C code
that holds the interpreter lock (an MPI or Horovod call waiting for a peer that never comes).
The rank publishes its progress in a small shared file (:data:`LAYOUT`); the monitor writes the
rank's heartbeat for the others, reads theirs, and when neither this rank nor any it can see
made progress for the limit, prints which rank stalled, asks the rank to dump its stacks and
kills it, which makes the launcher (mpirun, srun) end every rank.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import signal
import struct
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The shared progress record: step, phase index, monotonic time of the last progress, slowest
# gap between two progress points (s), and a stop flag (1: the rank ended the watchdog).
LAYOUT = struct.Struct("<qqddq")
PHASES = ("start", "step", "data", "compute", "sync", "barrier", "checkpoint", "evaluate")
# Phases that may last long by nature (rank 0 saving a checkpoint, evaluating): a rank in one
# of them is allowed the ceiling, and so are the peers waiting for it.
PATIENT = frozenset({"checkpoint", "evaluate"})
# Phases in which a rank waits for the others (a collective): a rank stuck there is a victim.
WAITING = frozenset({"sync", "barrier"})


def stall_limit(floor_s: float, ceiling_s: float, slowest_s: float, *, scale: float) -> float:
    """The seconds without progress after which a rank counts as stalled.

    ``scale`` times the slowest gap between two progress points seen so far, but at least
    ``floor_s`` and at most ``ceiling_s``.
    """
    return min(max(floor_s, scale * slowest_s), ceiling_s)


@dataclass
class Peer:
    """What is known of one rank from its heartbeat."""

    rank: int
    step: int
    phase: str
    idle_s: float  # seconds without progress when the heartbeat was written
    beat: int  # increases at every write: a heartbeat that stands still is not being written
    pid: int
    host: str
    seen_change: float  # the observer's monotonic time at which ``beat`` last changed
    stopped: bool = False  # the process is stopped (SIGSTOP, a debugger)


def culprits(mine: Peer, peers: list[Peer], *, now: float, frozen_s: float) -> list[Peer]:
    """The ranks to blame for a job-wide stall, from what every rank last reported.

    Ranks that stopped running (stopped, or their heartbeat stands still) first; otherwise the
    ranks not waiting in a collective; otherwise the ranks at the lowest step.
    """
    everyone = [mine, *peers]
    frozen = [p for p in everyone if p.stopped] + [
        p for p in peers if not p.stopped and now - p.seen_change >= frozen_s
    ]
    if frozen:
        return frozen
    working = [p for p in everyone if p.phase not in WAITING]
    if working and len(working) < len(everyone):
        return working
    low = min(p.step for p in everyone)
    return [p for p in everyone if p.step == low]


def _stopped(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] in ("T", "t")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Monitor:
    """The monitor's state and decisions (see the module docstring)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.a = args
        self.dir = Path(args.dir) if args.dir else None
        self.peers: dict[int, Peer] = {}
        self.beat = 0
        self.host = os.uname().nodename
        fd = os.open(args.state, os.O_RDONLY)
        self.state = mmap.mmap(fd, LAYOUT.size, prot=mmap.PROT_READ)
        os.close(fd)

    def me(self, now: float) -> tuple[Peer, float, float, bool]:
        """This rank as a peer, its limit, the ceiling, and whether it ended the watchdog."""
        # The rank may be writing the record: take it when two reads in a row agree.
        raw = self.state[: LAYOUT.size]
        for _ in range(100):
            again = self.state[: LAYOUT.size]
            if again == raw:
                break
            raw = again
        step, phase_i, last, slowest, stop = LAYOUT.unpack(raw)
        phase = PHASES[phase_i] if 0 <= phase_i < len(PHASES) else "step"
        a = self.a
        limit = a.max_s if phase in PATIENT else stall_limit(a.floor_s, a.max_s, slowest,
                                                             scale=a.scale)  # fmt: skip
        peer = Peer(
            rank=a.rank, step=step, phase=phase, idle_s=now - last, beat=self.beat, pid=a.pid,
            host=self.host, seen_change=now, stopped=_stopped(a.pid),
        )  # fmt: skip
        return peer, limit, a.max_s, bool(stop)

    def write_beat(self, me: Peer) -> None:
        if self.dir is None:
            return
        self.beat += 1
        record = {**me.__dict__, "beat": self.beat}
        del record["seen_change"]
        path = self.dir / f"rank{self.a.rank}.json"
        tmp = path.with_name(f".{path.name}.tmp")
        try:
            tmp.write_text(json.dumps(record))
            os.replace(tmp, path)
        except OSError:
            pass  # a full or vanished disk must not end a healthy run; the limit still holds

    def read_peers(self, now: float) -> None:
        if self.dir is None:
            return
        for r in range(self.a.size):
            if r == self.a.rank:
                continue
            try:
                d: dict[str, Any] = json.loads((self.dir / f"rank{r}.json").read_text())
            except (OSError, ValueError):
                continue  # not written yet, or not visible from this node
            old = self.peers.get(r)
            changed = old is None or old.beat != d["beat"]
            self.peers[r] = Peer(
                rank=r, step=int(d["step"]), phase=str(d["phase"]), idle_s=float(d["idle_s"]),
                beat=int(d["beat"]), pid=int(d["pid"]), host=str(d["host"]),
                seen_change=now if changed or old is None else old.seen_change,
                stopped=bool(d.get("stopped", False)),
            )  # fmt: skip

    def run(self) -> int:
        a = self.a
        while True:
            time.sleep(a.tick_s)
            if not _alive(a.pid) or os.getppid() != a.pid:
                Path(a.state).unlink(missing_ok=True)  # the rank could not remove it
                return 0  # the rank ended: nothing to watch
            now = time.monotonic()
            me, limit, ceiling, stop = self.me(now)
            if stop:
                return 0
            self.write_beat(me)
            if me.idle_s <= limit / 2:
                self.peers.clear()
                continue
            self.read_peers(now)  # observed from half the limit on: stopped peers show
            if me.idle_s <= limit:
                continue
            frozen_s = min(limit / 2, 10.0)
            busy = [
                p
                for p in self.peers.values()
                if not p.stopped
                and now - p.seen_change < frozen_s
                and p.idle_s < (ceiling if p.phase in PATIENT else limit)
            ]
            if busy and not me.stopped and me.idle_s < ceiling:
                continue  # another rank is working (evaluating, saving): wait for it
            self.fire(me, now, limit, frozen_s)
            return 3

    def fire(self, me: Peer, now: float, limit: float, frozen_s: float) -> None:
        a = self.a
        peers = sorted(self.peers.values(), key=lambda p: p.rank)
        blamed = culprits(me, peers, now=now, frozen_s=frozen_s)

        def why(p: Peer) -> str:
            if p.stopped:
                return "stopped (SIGSTOP or a debugger)"
            if p.rank != a.rank and now - p.seen_change >= frozen_s:
                return f"not answering for {now - p.seen_change:.0f} s"
            return f"idle {p.idle_s:.0f} s"

        who = "; ".join(
            f"rank {p.rank} (pid {p.pid} on {p.host}) at step {p.step}, {p.phase}, {why(p)}"
            for p in blamed
        )
        unseen = a.size - 1 - len(peers)
        stacks = Path(a.stacks) if a.stacks and not me.stopped else None  # a stopped rank cannot
        lines = [
            f"hethpc watchdog (rank {a.rank}): no progress for {me.idle_s:.0f} s "
            f"(limit {limit:.0f} s, --watchdog-s) at step {me.step}, {me.phase}.",
            f"Stalled: {who}." if peers or a.size == 1 else "",
            f"{unseen} rank(s) wrote no heartbeat visible here." if unseen > 0 else "",
            f"Ending the job (rank {a.rank} is killed; its stacks: {stacks})."
            if stacks
            else f"Ending the job (rank {a.rank} is killed).",
        ]
        sys.stderr.write(" ".join(line for line in lines if line) + "\n")
        sys.stderr.flush()
        if not me.stopped and stacks is not None:
            os.kill(a.pid, signal.SIGUSR1)  # faulthandler in the rank dumps its stacks
            time.sleep(0.5)
        os.kill(a.pid, signal.SIGKILL)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--pid", type=int, required=True, help="the rank's process")
    ap.add_argument("--state", required=True, help="the shared progress file")
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--size", type=int, default=1)
    ap.add_argument("--dir", default="", help="the heartbeat directory ('' for none)")
    ap.add_argument("--stacks", default="", help="where the rank dumps its stacks on SIGUSR1")
    ap.add_argument("--floor-s", type=float, required=True)
    ap.add_argument("--max-s", type=float, required=True)
    ap.add_argument("--scale", type=float, default=20.0)
    ap.add_argument("--tick-s", type=float, default=1.0)
    return Monitor(ap.parse_args(argv)).run()


if __name__ == "__main__":
    sys.exit(main())
