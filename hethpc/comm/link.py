"""Link emulation: every transfer lasts at least as long as on a given bandwidth and latency.

One machine cannot have slow links, so hethpc can emulate them, the network twin of
``--slowdown``: after a real collective or point-to-point transfer, the rank waits out the
difference between the time it took and the time it would take on the emulated link. Off by
default; a measurement device, documented as such, never a model of congestion or topology.

Times (seconds) on a link of bandwidth ``bw`` (bytes/s) and latency ``lat`` (s):

- ring allreduce of ``n`` bytes over ``N`` ranks: ``2(N-1)/N * n / bw + 2(N-1) * lat``;
- allgather of ``n`` bytes from each of ``N`` ranks (ring): ``(N-1) * n / bw + (N-1) * lat``;
- broadcast of ``n`` bytes (binomial tree): ``ceil(log2 N) * (n / bw + lat)``;
- point-to-point message of ``n`` bytes: ``n / bw + lat``, from the sender's send to the
  receiver's hand-over (the send time travels with the message; ranks of one machine share
  the clock).
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass

from hethpc.comm.errors import LinkError
from hethpc.comm.waiting import add_comm_seconds

_UNITS = {"bit": 1 / 8, "kbit": 1e3 / 8, "mbit": 1e6 / 8, "gbit": 1e9 / 8, "tbit": 1e12 / 8,
          "b": 1.0, "kb": 1e3, "mb": 1e6, "gb": 1e9}  # fmt: skip
_TIMES = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
_NUMBER = r"([0-9.]+(?:e[+-]?\d+)?)"
_SPEC = re.compile(rf"^\s*{_NUMBER}\s*([a-z]+)\s*(?::\s*{_NUMBER}\s*([a-z]+))?\s*$")


@dataclass(frozen=True)
class Link:
    """An emulated link.

    Attributes:
        bandwidth: bytes per second (per direction, per rank).
        latency: seconds per message.
        spec: the text it was read from (for records).
    """

    bandwidth: float
    latency: float = 0.0
    spec: str = ""

    def allreduce_s(self, nbytes: int, ranks: int) -> float:
        """Seconds of a ring allreduce of ``nbytes`` over ``ranks`` ranks."""
        if ranks < 2:
            return 0.0
        n = ranks
        return 2 * (n - 1) / n * nbytes / self.bandwidth + 2 * (n - 1) * self.latency

    def allgather_s(self, nbytes: int, ranks: int) -> float:
        """Seconds of a ring allgather of ``nbytes`` from each of ``ranks`` ranks."""
        if ranks < 2:
            return 0.0
        return (ranks - 1) * (nbytes / self.bandwidth + self.latency)

    def broadcast_s(self, nbytes: int, ranks: int) -> float:
        """Seconds of a binomial-tree broadcast of ``nbytes`` to ``ranks`` ranks."""
        if ranks < 2:
            return 0.0
        return math.ceil(math.log2(ranks)) * (nbytes / self.bandwidth + self.latency)

    def p2p_s(self, nbytes: int) -> float:
        """Seconds of one point-to-point message of ``nbytes``."""
        return nbytes / self.bandwidth + self.latency


def parse_link(text: str) -> Link | None:
    """A link from ``"1gbit"``, ``"10gbit:20us"``, ``"100mbit:1ms"``; ``""``/``"off"``: None.

    Bandwidth units: bit, kbit, mbit, gbit, tbit (bits per second) or b, kb, mb, gb (bytes per
    second); latency units: s, ms, us, ns (default latency 0).

    Raises:
        LinkError: the text is not of that form, or a value is not positive and finite.
    """
    t = text.strip().lower()
    if t in ("", "off", "none"):
        return None
    m = _SPEC.match(t)
    if not m or m.group(2) not in _UNITS or (m.group(4) and m.group(4) not in _TIMES):
        raise LinkError(
            f"link {text!r}: expected BANDWIDTH[:LATENCY] such as '1gbit', '10gbit:20us' or "
            f"'500mb:1ms' (bandwidth units {sorted(_UNITS)}, latency units {sorted(_TIMES)})"
        )
    bandwidth = float(m.group(1)) * _UNITS[m.group(2)]
    latency = float(m.group(3)) * _TIMES[m.group(4)] if m.group(3) else 0.0
    if not (math.isfinite(bandwidth) and bandwidth > 0 and math.isfinite(latency)):
        raise LinkError(f"link {text!r}: the bandwidth must be positive and finite")
    return Link(bandwidth, latency, text.strip())


@dataclass
class LinkStats:
    """What the emulation did on this rank since :func:`set_link` (or :func:`reset_stats`).

    Attributes:
        real_s: seconds the transfers really took.
        waited_s: seconds waited on top, to last as long as on the emulated link.
        bytes: payload bytes that went through emulated transfers.
        calls: emulated transfers.
    """

    real_s: float = 0.0
    waited_s: float = 0.0
    bytes: int = 0
    calls: int = 0


_link: Link | None = None
_stats = LinkStats()


def set_link(link: Link | None) -> None:
    """Emulate ``link`` on every transfer from now on (None: off); resets the stats."""
    global _link
    _link = link
    reset_stats()


def current_link() -> Link | None:
    """The emulated link, or None."""
    return _link


def link_stats() -> LinkStats:
    """This rank's emulation figures (a copy)."""
    return LinkStats(_stats.real_s, _stats.waited_s, _stats.bytes, _stats.calls)


def reset_stats() -> None:
    """Zero the emulation figures."""
    global _stats
    _stats = LinkStats()


def arrival(sent_at: float | None, nbytes: int) -> float | None:
    """When a message of ``nbytes`` sent at wall time ``sent_at`` arrives on the link (or None)."""
    if _link is None or sent_at is None:
        return None
    return sent_at + _link.p2p_s(nbytes)


def hold_until(arrives: float | None, nbytes: int) -> None:
    """A received message is handed over no earlier than its emulated ``arrives`` (wall time)."""
    if arrives is None:
        return
    extra = arrives - time.time()
    if extra > 0:
        time.sleep(extra)
    _stats.waited_s += max(extra, 0.0)
    _stats.bytes += int(nbytes)
    _stats.calls += 1


def wait_out(t0: float, emulated_s: float, nbytes: int) -> None:
    """After a real transfer started at ``t0`` (perf_counter), wait until ``emulated_s`` passed."""
    real = time.perf_counter() - t0
    extra = emulated_s - real
    if extra > 0:
        time.sleep(extra)
    _stats.real_s += real
    _stats.waited_s += max(extra, 0.0)
    _stats.bytes += int(nbytes)
    _stats.calls += 1


def emulate_collective(t0: float, kind: str, nbytes: int, size: int) -> None:
    """After a collective of ``kind`` (allreduce, allgather, broadcast) over ``size`` ranks,
    started at ``t0``, last as long as on the emulated link (nothing more when emulation is
    off); its whole time counts in :func:`~hethpc.comm.waiting.comm_seconds`."""
    if _link is not None and size >= 2:
        seconds = {
            "allreduce": _link.allreduce_s,
            "allgather": _link.allgather_s,
            "broadcast": _link.broadcast_s,
        }[kind](nbytes, size)
        wait_out(t0, seconds, nbytes)
    add_comm_seconds(time.perf_counter() - t0)
