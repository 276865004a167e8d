"""The kernel's parts of a testbed: network namespaces, veths, a bridge, tc shaping, CPU cgroups.

Each function does one thing with ``ip``, ``tc`` or the cgroup v1 ``cpu`` hierarchy and raises
:class:`TestbedError` with the command and its message when the kernel refuses.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from hethpc.testbed.errors import TestbedError

CPU_ROOT = Path("/sys/fs/cgroup/cpu")
NETNS_DIR = Path("/run/netns")
# tbf's bucket must hold the largest packet the veth hands it (64 KiB with GSO) and a few ms of
# the rate, or it drops every large packet; its queue holds this long at the rate.
_TBF_MIN_BURST = 256 * 1024
_TBF_BURST_S = 0.004
_TBF_LATENCY = "200ms"


def run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a command; on failure raise :class:`TestbedError` naming it and its stderr."""
    proc = subprocess.run(list(cmd), capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise TestbedError(f"`{' '.join(cmd)}` failed: {proc.stderr.strip() or proc.returncode}")
    return proc


def missing() -> list[str]:
    """What this host lacks to run a testbed (empty: nothing)."""
    out = []
    if os.geteuid() != 0:
        out.append("root (namespaces, tc and cgroups need it)")
    for tool in ("ip", "tc", "unshare"):
        if shutil.which(tool) is None:
            out.append(f"the '{tool}' program (Debian: apt-get install iproute2 util-linux)")
    if not (CPU_ROOT / "cpu.cfs_quota_us").is_file():
        v2 = Path("/sys/fs/cgroup/cgroup.controllers").exists()
        out.append(
            f"the cgroup v1 cpu controller at {CPU_ROOT} (this host mounts "
            f"{'cgroup v2' if v2 else 'no cpu cgroup'})"
        )
    return out


def namespaces() -> list[str]:
    """Names of the network namespaces ``ip netns`` knows."""
    proc = run("ip", "netns", "list", check=False)
    return [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]


def add_namespace(name: str) -> None:
    """A new network namespace with its loopback up."""
    run("ip", "netns", "add", name)
    run("ip", "-n", name, "link", "set", "lo", "up")


def delete_namespace(name: str) -> None:
    """Remove a namespace (its interfaces, qdiscs and bridge go with it)."""
    if name in namespaces():
        run("ip", "netns", "delete", name)


def namespace_pids(name: str) -> list[int]:
    """Processes inside a network namespace."""
    proc = run("ip", "netns", "pids", name, check=False)
    return [int(p) for p in proc.stdout.split()]


def add_bridge(ns: str, bridge: str, address: str) -> None:
    """A bridge in ``ns`` with ``address`` (CIDR) on it, up."""
    run("ip", "-n", ns, "link", "add", bridge, "type", "bridge")
    run("ip", "-n", ns, "addr", "add", address, "dev", bridge)
    run("ip", "-n", ns, "link", "set", bridge, "up")


def add_port(switch: str, bridge: str, port: str, node: str, address: str) -> None:
    """A veth from the switch's ``bridge`` (end ``port``) to ``eth0`` in ``node`` at ``address``."""
    run("ip", "-n", switch, "link", "add", port, "type", "veth", "peer", "name", "eth0",
        "netns", node)  # fmt: skip
    run("ip", "-n", switch, "link", "set", port, "master", bridge)
    run("ip", "-n", switch, "link", "set", port, "up")
    run("ip", "-n", node, "addr", "add", address, "dev", "eth0")
    run("ip", "-n", node, "link", "set", "eth0", "up")


def shape(ns: str, dev: str, bits: int | None) -> None:
    """Limit ``dev``'s egress in ``ns`` to ``bits`` per second (a token bucket); None: no limit."""
    if bits is None:
        run("ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev, "root", check=False)
        return
    burst = max(_TBF_MIN_BURST, int(bits / 8 * _TBF_BURST_S))
    run("ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root", "tbf",
        "rate", f"{bits}bit", "burst", str(burst), "latency", _TBF_LATENCY)  # fmt: skip


def set_link_state(ns: str, dev: str, up: bool) -> None:
    """Bring an interface up or down (a cable pulled)."""
    run("ip", "-n", ns, "link", "set", dev, "up" if up else "down")


def counters(ns: str, dev: str) -> tuple[int, int]:
    """``(rx_bytes, tx_bytes)`` of an interface in ``ns``."""
    out = []
    for which in ("rx_bytes", "tx_bytes"):
        proc = run("ip", "netns", "exec", ns, "cat", f"/sys/class/net/{dev}/statistics/{which}")
        out.append(int(proc.stdout))
    return out[0], out[1]


def add_cgroup(path: Path, cpu: float | None, period_us: int) -> None:
    """A cgroup v1 ``cpu`` group capped at ``cpu`` cores per ``period_us`` (None: no cap)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "cpu.cfs_period_us").write_text(str(period_us))
    quota = -1 if cpu is None else max(1000, int(round(cpu * period_us)))
    (path / "cpu.cfs_quota_us").write_text(str(quota))


def set_quota(path: Path, cpu: float | None) -> None:
    """Change a cgroup's cap (None: none)."""
    period = int((path / "cpu.cfs_period_us").read_text())
    quota = -1 if cpu is None else max(1000, int(round(cpu * period)))
    (path / "cpu.cfs_quota_us").write_text(str(quota))


def cgroup_pids(path: Path) -> list[int]:
    """Processes in a cgroup and the cgroups below it."""
    pids: list[int] = []
    if not path.is_dir():
        return pids
    for procs in path.rglob("cgroup.procs"):
        try:
            pids += [int(p) for p in procs.read_text().split()]
        except OSError:
            pass
    return pids


def remove_cgroup(path: Path) -> None:
    """Remove a cgroup and those below it (they must hold no processes)."""
    if not path.is_dir():
        return
    for sub in sorted((p for p in path.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        sub.rmdir()
    path.rmdir()


def end_processes(find: list[Path | str], *, grace_s: float = 3.0) -> None:
    """SIGTERM every process in these cgroups (paths) and namespaces (names), SIGKILL after
    ``grace_s``, until none is left."""

    def pids() -> set[int]:
        found: set[int] = set()
        for f in find:
            found |= set(cgroup_pids(f) if isinstance(f, Path) else namespace_pids(f))
        found.discard(os.getpid())
        return found

    deadline = time.monotonic() + grace_s
    sig = signal.SIGTERM
    for _ in range(200):
        left = pids()
        if not left:
            return
        for pid in left:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        time.sleep(0.05)
        if time.monotonic() > deadline:
            sig = signal.SIGKILL
    raise TestbedError(f"processes {sorted(pids())} would not end")


def cpu_stat(path: Path) -> dict[str, int]:
    """A cgroup's ``cpu.stat`` (``nr_periods``, ``nr_throttled``, ``throttled_time`` in ns)."""
    stat = {}
    for line in (path / "cpu.stat").read_text().splitlines():
        key, _, value = line.partition(" ")
        stat[key] = int(value)
    return stat
