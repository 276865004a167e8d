"""Link emulation without MPI: reading link settings, the transfer-time formulas, waiting."""

from __future__ import annotations

import time

import pytest

from hethpc.comm import Link, LinkError, link_stats, parse_link, set_link
from hethpc.comm.link import wait_out


@pytest.mark.parametrize(
    ("text", "bandwidth", "latency"),
    [
        ("1gbit", 1.25e8, 0.0),
        ("10gbit:20us", 1.25e9, 2e-5),
        ("100mbit:1ms", 1.25e7, 1e-3),
        ("500mb:0.5ms", 5e8, 5e-4),
        (" 5 Gbit : 2 us ", 6.25e8, 2e-6),
    ],
    ids=["gbit", "gbit-latency", "mbit-ms", "bytes", "spaces-case"],
)
def test_parse_link(text: str, bandwidth: float, latency: float) -> None:
    link = parse_link(text)
    assert link is not None
    assert link.bandwidth == pytest.approx(bandwidth) and link.latency == pytest.approx(latency)


@pytest.mark.parametrize("text", ["", "off", "none"], ids=["empty", "off", "none"])
def test_off(text: str) -> None:
    assert parse_link(text) is None


@pytest.mark.parametrize(
    "text",
    ["fast", "1gbps", "10gbit:20", "0gbit", "1gbit:5parsecs"],
    ids=["word", "unit", "no-latency-unit", "zero", "latency-unit"],
)
def test_bad_links_are_named(text: str) -> None:
    with pytest.raises(LinkError, match=text.split(":")[0] if text != "0gbit" else "positive"):
        parse_link(text)


def test_formulas() -> None:
    link = Link(bandwidth=1e6, latency=1e-3)
    # Ring allreduce: 2(N-1)/N * n / bw + 2(N-1) * lat.
    assert link.allreduce_s(1_000_000, 4) == pytest.approx(2 * 3 / 4 * 1.0 + 6e-3)
    assert link.allreduce_s(1_000_000, 1) == 0.0
    assert link.allgather_s(1000, 3) == pytest.approx(2 * (1e-3 + 1e-3))
    assert link.broadcast_s(1000, 5) == pytest.approx(3 * (1e-3 + 1e-3))
    assert link.p2p_s(2000) == pytest.approx(2e-3 + 1e-3)


@pytest.mark.parametrize("seconds", [0.0, 0.01, 0.05], ids=["none", "10ms", "50ms"])
def test_wait_out_lasts_the_emulated_time(seconds: float) -> None:
    set_link(Link(1e9))
    t0 = time.perf_counter()
    wait_out(t0, seconds, 100)
    took = time.perf_counter() - t0
    assert seconds <= took < seconds + 0.02
    stats = link_stats()
    assert stats.calls == 1 and stats.bytes == 100
    assert stats.waited_s == pytest.approx(max(seconds - stats.real_s, 0), abs=2e-3)
    set_link(None)
    assert link_stats().calls == 0
