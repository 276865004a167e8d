"""A cluster on one host: nodes as network namespaces on a bridge, shaped links, CPU quotas.

Every node is a network namespace holding ``eth0``, one end of a veth whose other end is a port
of a bridge in the testbed's switch namespace; ``tc``'s token bucket limits each end's egress to
the node's link rate, so a node sends and receives at that rate. Each node has a cgroup whose
CFS quota caps the CPU time of all its processes together. Commands run in the switch namespace
(the "head", like a login node, uncapped) with Open MPI set to launch ranks on the nodes through
an rsh agent that enters a node's namespace and cgroup and gives it its own hostname; ranks on
different nodes talk over TCP through the shaped links, ranks of one node over shared memory.

Nothing outside the namespaces it creates is touched, apart from its cgroups and its state
directory. A testbed is removed by :meth:`Testbed.down`, when its ``with`` block ends (also on
an exception, Ctrl-C or SIGTERM), and, after its owner was killed, by the next testbed that
comes up (:func:`reap_stale`, which finds them by the name prefix).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

from hethpc.testbed import kernel
from hethpc.testbed.errors import TestbedError
from hethpc.testbed.spec import NAME, NodeSpec, format_cores, format_rate, load_nodes, parse_rate

PREFIX = "hethpc-tb-"
STATE_ROOT = Path("/run/hethpc-testbed")
CGROUP_ROOT = kernel.CPU_ROOT / "hethpc-testbed"
SUBNET = "10.77.0"  # every testbed has its own switch namespace, so subnets never meet
HEAD_ADDRESS = f"{SUBNET}.254"
BRIDGE = "br0"
# A node's command: join its cgroup (before ``ip netns exec``, which remounts /sys without the
# cgroups), enter its network namespace and a UTS namespace, take its hostname, run.
_JOIN = 'echo $$ > "$1/cgroup.procs" && shift && exec "$@"'
_NAME = 'hostname "$1" && shift && exec "$@"'


def _start_time(pid: int) -> str | None:
    """A process's start time in clock ticks (tells a reused pid apart); None if it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


class Testbed:
    """Nodes of unequal CPU and link speed on this host, enforced by the kernel.

    Args:
        nodes: the nodes, as :class:`NodeSpec`, mappings (``{"cpu": 0.5, "link": "200mbit"}``),
            or a TOML/JSON source for :func:`load_nodes`.
        name: the testbed's name (lowercase letters and digits, at most 12): its namespaces are
            ``hethpc-tb-<name>-sw`` and ``-n0``, ``-n1``, ..., its hostnames ``<name>-node0``, ...
        period_ms: the CFS period of the CPU quotas (100: the kernel's and Kubernetes' default;
            a node with ``cpu`` q runs ``q * period`` in every period, then waits).
        persistent: keep it after this process exits (the command line's ``up``); otherwise
            the next testbed to come up removes it once this process is gone.

    Raises:
        SpecError: a node is invalid. TestbedError: the name is invalid.
    """

    __test__ = False  # not a pytest test class

    def __init__(
        self,
        nodes: Sequence[NodeSpec | Mapping[str, Any]] | str | Path,
        *,
        name: str = "tb",
        period_ms: float = 100.0,
        persistent: bool = False,
    ) -> None:
        if not NAME.match(name):
            raise TestbedError(
                f"testbed name {name!r} must be 1-12 lowercase letters and digits, starting "
                "with a letter"
            )
        if isinstance(nodes, (str, Path)):
            self.nodes = load_nodes(nodes)
        else:
            raw = [n for n in nodes if not isinstance(n, NodeSpec)]
            parsed = iter(load_nodes(raw)) if raw else iter(())
            self.nodes = [n if isinstance(n, NodeSpec) else next(parsed) for n in nodes]
        if not 1 <= len(self.nodes) <= 200:
            raise TestbedError(f"a testbed has 1 to 200 nodes, got {len(self.nodes)}")
        if not 1 <= period_ms <= 1000:
            raise TestbedError(f"period_ms must be 1 to 1000, got {period_ms:g}")
        self.name = name
        self.period_us = int(period_ms * 1000)
        self.persistent = persistent
        self.switch = f"{PREFIX}{name}-sw"
        self.state_dir = STATE_ROOT / name
        self.is_up = False
        self._old_handlers: dict[int, Any] = {}
        self._children: list[subprocess.Popen[Any]] = []  # reaped at down(), or they pin cgroups

    # --- names and paths -------------------------------------------------------------------
    def namespace(self, node: int) -> str:
        """Node ``node``'s network namespace."""
        return f"{PREFIX}{self.name}-n{self._index(node)}"

    def hostname(self, node: int) -> str:
        """Node ``node``'s hostname (inside its UTS namespace)."""
        return f"{self.name}-node{self._index(node)}"

    def address(self, node: int) -> str:
        """Node ``node``'s IPv4 address."""
        return f"{SUBNET}.{self._index(node) + 1}"

    def cgroup(self, node: int) -> Path:
        """Node ``node``'s CPU cgroup."""
        return CGROUP_ROOT / self.name / f"node{self._index(node)}"

    def port(self, node: int) -> str:
        """The switch's end of node ``node``'s link."""
        return f"n{self._index(node)}"

    @property
    def hostfile(self) -> Path:
        """Open MPI's hostfile: one line per node, its address and slots."""
        return self.state_dir / "hostfile"

    @property
    def agent(self) -> Path:
        """The rsh agent Open MPI launches through: ``agent HOST COMMAND`` runs COMMAND on the
        node whose address or hostname is HOST."""
        return self.state_dir / "agent"

    def _index(self, node: int) -> int:
        if isinstance(node, bool) or not 0 <= int(node) < len(self.nodes):
            raise TestbedError(
                f"testbed {self.name} has nodes 0..{len(self.nodes) - 1}, not {node!r}"
            )
        return int(node)

    # --- up and down -----------------------------------------------------------------------
    def up(self) -> Testbed:
        """Create the namespaces, links, quotas, hostfile and agent (a few seconds).

        Raises:
            TestbedError: the host lacks something (named), or a testbed of this name is up.
        """
        lack = kernel.missing()
        if any(n.cores is not None for n in self.nodes) and shutil.which("taskset") is None:
            lack.append("taskset (util-linux), which pins a node with cores to them")
        if lack:
            raise TestbedError("this host cannot run a testbed; it lacks " + "; ".join(lack))
        reap_stale()
        if self.switch in kernel.namespaces() or self.state_dir.exists():
            raise TestbedError(
                f"a testbed named {self.name!r} is already up; take it down first "
                f"(hethpc-testbed --name {self.name} down) or choose another --name"
            )
        self.state_dir.mkdir(parents=True)
        self._write_state()
        try:
            kernel.add_namespace(self.switch)
            kernel.add_bridge(self.switch, BRIDGE, f"{HEAD_ADDRESS}/24")
            for i, spec in enumerate(self.nodes):
                ns = self.namespace(i)
                kernel.add_namespace(ns)
                kernel.add_port(self.switch, BRIDGE, self.port(i), ns, f"{self.address(i)}/24")
                kernel.shape(ns, "eth0", spec.link)  # the node's upload
                kernel.shape(self.switch, self.port(i), spec.link)  # its download
                kernel.add_cgroup(self.cgroup(i), spec.cpu, self.period_us)
            self._write_launch_files()
        except BaseException:
            self.down()
            raise
        self.is_up = True
        return self

    def down(self) -> None:
        """End every process on the testbed, remove its cgroups, namespaces (with their links
        and qdiscs) and state. Safe to call more than once."""
        _teardown(self.name, self._children)
        self._children.clear()
        self.is_up = False

    def __enter__(self) -> Testbed:
        self.up()
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGHUP):
                self._old_handlers[sig] = signal.signal(sig, _raise_interrupt)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            self.down()
        finally:
            for sig, handler in self._old_handlers.items():
                signal.signal(sig, handler)
            self._old_handlers.clear()

    def _write_state(self) -> None:
        pid = os.getpid()
        state = {
            "name": self.name,
            "nodes": [
                {
                    "cpu": n.cpu,
                    "cores": None if n.cores is None else format_cores(n.cores),
                    "link": None if n.link is None else format_rate(n.link),
                    "slots": n.slots,
                }  # fmt: skip
                for n in self.nodes
            ],
            "period_ms": self.period_us / 1000,
            "persistent": self.persistent,
            "owner": {"pid": pid, "start": _start_time(pid)},
        }
        (self.state_dir / "state.json").write_text(json.dumps(state, indent=1) + "\n")

    def _write_launch_files(self) -> None:
        self.hostfile.write_text(
            "".join(f"{self.address(i)} slots={n.slots}\n" for i, n in enumerate(self.nodes))
        )
        cases = "".join(
            f"  {self.address(i)}|{self.hostname(i)}) set -- {shlex.quote(self.namespace(i))} "
            f"{shlex.quote(str(self.cgroup(i)))} {shlex.quote(self.hostname(i))} "
            f'{shlex.quote(" ".join(self._pin(i)))} "$@";;\n'
            for i in range(len(self.nodes))
        )
        self.agent.write_text(
            "#!/bin/sh\n"
            f"# rsh agent of testbed {self.name}: 'agent [options] HOST COMMAND' runs COMMAND on\n"
            "# HOST's node: in its network namespace, its cgroup, on its cores and with its own\n"
            "# hostname.\n"
            'while [ $# -gt 0 ]; do case "$1" in -*) shift;; *) break;; esac; done\n'
            "host=$1; shift\n"
            'case "$host" in\n'
            f"{cases}"
            f'  *) echo "testbed {self.name}: no node named $host" >&2; exit 255;;\n'
            "esac\n"
            "ns=$1; cg=$2; hn=$3; pin=$4; shift 4  # pin: 'taskset -c LIST', or empty\n"
            f'exec sh -c {shlex.quote(_JOIN)} sh "$cg" $pin ip netns exec "$ns" unshare --uts '
            f'sh -c {shlex.quote(_NAME)} sh "$hn" sh -c "$*"\n'
        )
        self.agent.chmod(0o755)

    # --- running ---------------------------------------------------------------------------
    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment of a command on the head: Open MPI launches on the nodes through the
        agent, TCP between nodes on the testbed's subnet (its own settings win)."""
        env = dict(os.environ if base is None else base)
        subnet = f"{SUBNET}.0/24"
        for key, value in {
            "plm_rsh_agent": str(self.agent),
            "plm_rsh_no_tree_spawn": "1",
            "orte_default_hostfile": str(self.hostfile),
            "btl": "tcp,vader,self",
            "btl_tcp_if_include": subnet,
            "oob_tcp_if_include": subnet,
        }.items():
            env.setdefault(f"OMPI_MCA_{key}", value)
        env["HETHPC_TESTBED"] = self.name
        return env

    def head_argv(self, cmd: Sequence[str]) -> list[str]:
        """``cmd`` run on the head: the switch's network namespace, the host's mounts (its
        agent must see the cgroups, which ``ip netns exec``'s fresh /sys hides)."""
        return ["nsenter", f"--net={kernel.NETNS_DIR / self.switch}", *cmd]

    def _pin(self, node: int) -> list[str]:
        """``taskset -c LIST`` for a node with ``cores`` (its processes run on them), else []."""
        cores = self.nodes[node].cores
        return [] if cores is None else ["taskset", "-c", ",".join(map(str, cores))]

    def node_argv(self, node: int, cmd: Sequence[str]) -> list[str]:
        """``cmd`` run on node ``node``: its namespace, cgroup, cores and hostname."""
        return [
            "sh", "-c", _JOIN, "sh", str(self.cgroup(node)), *self._pin(node),
            "ip", "netns", "exec", self.namespace(node), "unshare", "--uts",
            "sh", "-c", _NAME, "sh", self.hostname(node), *cmd,
        ]  # fmt: skip

    def run(self, cmd: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[Any]:
        """Run ``cmd`` on the head with :meth:`env` (``mpirun`` there spans the nodes); keyword
        arguments go to :func:`subprocess.run`."""
        kwargs["env"] = self.env(kwargs.get("env"))
        return subprocess.run(self.head_argv(cmd), **kwargs)

    def popen(self, node: int | None, cmd: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start ``cmd`` on node ``node`` (None: the head)."""
        kwargs["env"] = self.env(kwargs.get("env"))
        argv = self.head_argv(cmd) if node is None else self.node_argv(node, cmd)
        child = subprocess.Popen(argv, **kwargs)
        self._children.append(child)
        return child

    # --- changing it while it runs (faults) ----------------------------------------------
    def set_link(self, node: int, rate: str | int | None) -> None:
        """Change node ``node``'s link rate (both directions; None: unshaped)."""
        bits = None if rate is None else parse_rate(rate)
        kernel.shape(self.namespace(node), "eth0", bits)
        kernel.shape(self.switch, self.port(node), bits)

    def set_link_up(self, node: int, up: bool) -> None:
        """Pull (False) or plug back (True) node ``node``'s cable."""
        kernel.set_link_state(self.switch, self.port(node), up)

    def set_cpu(self, node: int, cpu: float | None) -> None:
        """Change node ``node``'s CPU cap in cores (None: none)."""
        kernel.set_quota(self.cgroup(node), cpu)

    def kill(self, node: int) -> None:
        """End every process on node ``node`` at once (SIGKILL), as a crashed node would."""
        for pid in kernel.cgroup_pids(self.cgroup(node)):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def counters(self, node: int) -> tuple[int, int]:
        """Bytes ``(received, sent)`` by node ``node`` over its link."""
        return kernel.counters(self.namespace(node), "eth0")

    def cpu_stat(self, node: int) -> dict[str, int]:
        """Node ``node``'s cgroup ``cpu.stat`` (periods, periods throttled, ns throttled)."""
        return kernel.cpu_stat(self.cgroup(node))

    def status(self) -> dict[str, Any]:
        """The nodes with their address, namespace, CPU cap, link, processes and bytes moved."""
        nodes = []
        for i, spec in enumerate(self.nodes):
            row: dict[str, Any] = {
                "node": i, "hostname": self.hostname(i), "address": self.address(i),
                "namespace": self.namespace(i), "spec": spec.describe(),
            }  # fmt: skip
            if self.is_up:
                rx, tx = self.counters(i)
                row |= {"processes": len(kernel.cgroup_pids(self.cgroup(i))), "rx": rx, "tx": tx}
            nodes.append(row)
        return {"name": self.name, "up": self.is_up, "head": HEAD_ADDRESS, "nodes": nodes}

    @classmethod
    def attach(cls, name: str = "tb") -> Testbed:
        """The testbed ``name`` that is up (brought up by another process).

        Raises:
            TestbedError: no testbed of that name is up.
        """
        path = STATE_ROOT / name / "state.json"
        if not path.is_file() or f"{PREFIX}{name}-sw" not in kernel.namespaces():
            up = sorted(running())
            raise TestbedError(
                f"no testbed named {name!r} is up "
                + (
                    f"(up: {', '.join(up)})"
                    if up
                    else "(none is; start one with hethpc-testbed up)"
                )
            )
        state = json.loads(path.read_text())
        bed = cls(state["nodes"], name=name, period_ms=state["period_ms"],
                  persistent=state["persistent"])  # fmt: skip
        bed.is_up = True
        return bed


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


def running() -> dict[str, dict[str, Any]]:
    """The testbeds whose namespaces exist, by name, with their state (empty when unknown)."""
    names = {
        ns[len(PREFIX) :].rsplit("-", 1)[0] for ns in kernel.namespaces() if ns.startswith(PREFIX)
    }
    if STATE_ROOT.is_dir():
        names |= {p.name for p in STATE_ROOT.iterdir() if p.is_dir()}
    if CGROUP_ROOT.is_dir():
        names |= {p.name for p in CGROUP_ROOT.iterdir() if p.is_dir()}
    out = {}
    for name in names:
        try:
            out[name] = json.loads((STATE_ROOT / name / "state.json").read_text())
        except (OSError, ValueError):
            out[name] = {}
    return out


def _owner_alive(state: Mapping[str, Any]) -> bool:
    owner = state.get("owner") or {}
    pid = owner.get("pid")
    return (
        isinstance(pid, int)
        and _start_time(pid) is not None
        and _start_time(pid) == owner.get("start")
    )


def reap_stale() -> list[str]:
    """Remove the testbeds whose owner is gone (killed before it could clean up); a testbed
    brought up to persist (``hethpc-testbed up``) stays. Returns the names removed."""
    removed = []
    for name, state in running().items():
        if state.get("persistent") or _owner_alive(state):
            continue
        _teardown(name)
        removed.append(name)
    return removed


def _remove_session_dirs(name: str) -> None:
    """Open MPI's session directories of testbed ``name``'s nodes (``ompi.HOSTNAME.UID`` in the
    temporary folder, named by the nodes' hostnames, which are the testbed's own): a daemon
    that was killed (a node cut, a job ended by force) leaves its own behind."""
    mine = re.compile(rf"ompi\.{re.escape(name)}-node\d+\.{os.getuid()}")
    for d in Path(tempfile.gettempdir()).glob("ompi.*"):
        if mine.fullmatch(d.name) and d.is_dir() and not d.is_symlink():
            shutil.rmtree(d, ignore_errors=True)


def _teardown(name: str, children: Sequence[subprocess.Popen[Any]] = ()) -> None:
    """Everything of testbed ``name``, found by its names (whether or not its state is known);
    ``children``: this process's own processes on it, waited for (a zombie pins its cgroup)."""
    nss = [ns for ns in kernel.namespaces() if ns.startswith(f"{PREFIX}{name}-")]
    group = CGROUP_ROOT / name
    kernel.end_processes([group, *nss])
    for child in children:
        child.kill()
        child.wait()
    kernel.remove_cgroup(group)
    if CGROUP_ROOT.is_dir() and not any(p.is_dir() for p in CGROUP_ROOT.iterdir()):
        CGROUP_ROOT.rmdir()
    _remove_session_dirs(name)
    for ns in nss:
        kernel.delete_namespace(ns)
    state = STATE_ROOT / name
    if state.is_dir():
        for f in state.iterdir():
            f.unlink()
        state.rmdir()
    deadline = time.monotonic() + 5
    while any(ns.startswith(f"{PREFIX}{name}-") for ns in kernel.namespaces()):
        if time.monotonic() > deadline:
            raise TestbedError(f"the namespaces of testbed {name} would not go away")
        time.sleep(0.05)
