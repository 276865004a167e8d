"""What a testbed enforces, measured: a fixed loop's time under a CPU quota, a message's time
over a shaped link, and the bytes that crossed it (used by its tests and ``bench_testbed``)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass

from hethpc.testbed.bed import Testbed
from hethpc.testbed.errors import TestbedError

# A fixed amount of arithmetic (iterations of a pure-Python loop): its wall time on a node
# against the same loop on the head says how much CPU the node really gets.
_LOOP = """
import json, sys, time
n = int(sys.argv[1]); t = time.perf_counter(); c = time.process_time(); x = 0
for i in range(n):
    x += i & 7
print(json.dumps({"wall": time.perf_counter() - t, "cpu": time.process_time() - c}))
"""

# Rank 0 sends one message of n bytes to rank 1 after a warm-up and a barrier; rank 1 times it.
_SEND = """
import json, sys, time
import numpy as np
from mpi4py import MPI
comm = MPI.COMM_WORLD; n = int(sys.argv[1])
buf = np.ones(n, dtype=np.uint8)
small = np.ones(1 << 16, dtype=np.uint8)
if comm.rank == 0:
    comm.Send(small, dest=1); comm.Barrier(); comm.Send(buf, dest=1)
else:
    comm.Recv(small, source=0); comm.Barrier(); t = time.perf_counter(); comm.Recv(buf, source=0)
    print(json.dumps({"seconds": time.perf_counter() - t, "bytes": n}))
"""


@dataclass(frozen=True)
class CpuCheck:
    """A fixed loop on a node against the same loop on the uncapped head.

    Attributes:
        node: the node. cpu: its cap in cores (None: none).
        head_s, node_s: the loop's wall seconds on the head and on the node.
        node_cpu_s: the CPU seconds it took on the node.
    """

    node: int
    cpu: float | None
    head_s: float
    node_s: float
    node_cpu_s: float

    @property
    def slowdown(self) -> float:
        """``node_s / head_s``: 1/cpu when the quota is enforced and the host is otherwise idle."""
        return self.node_s / self.head_s

    @property
    def stretch(self) -> float:
        """``node_s / node_cpu_s``: the node's wall seconds per second of CPU it got, 1/cpu when
        the quota is enforced (unaffected by other load on the host while a core is free)."""
        return self.node_s / self.node_cpu_s


@dataclass(frozen=True)
class LinkCheck:
    """One message between two nodes.

    Attributes:
        src, dst: the nodes. nbytes: its size. seconds: its time at the receiver.
        expected_s: ``8 * nbytes / rate`` at the slower of the two links (None: unshaped).
        sent, received: bytes that left ``src``'s link and entered ``dst``'s while it ran.
    """

    src: int
    dst: int
    nbytes: int
    seconds: float
    expected_s: float | None
    sent: int
    received: int


def _json_line(proc: subprocess.CompletedProcess[str], what: str) -> dict[str, float]:
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            return dict(json.loads(line))
    raise TestbedError(f"{what} printed no result (exit {proc.returncode}): {proc.stderr[-800:]}")


def measure_cpu(
    bed: Testbed, node: int, *, seconds: float = 1.0, python: str = sys.executable
) -> CpuCheck:
    """Time a loop of about ``seconds`` of CPU on the head (uncapped) and on ``node``."""
    calib = bed.run([python, "-c", _LOOP, "2000000"], capture_output=True, text=True, timeout=60)
    rate = 2_000_000 / _json_line(calib, "the calibration loop")["cpu"]
    n = str(int(rate * seconds))
    head = bed.run([python, "-c", _LOOP, n], capture_output=True, text=True, timeout=120)
    proc = subprocess.run(
        bed.node_argv(node, [python, "-c", _LOOP, n]), capture_output=True, text=True,
        timeout=30 + 40 * seconds, env=bed.env(),
    )  # fmt: skip
    on_node = _json_line(proc, f"the loop on node {node}")
    return CpuCheck(
        node, bed.nodes[node].cpu, _json_line(head, "the loop on the head")["wall"],
        on_node["wall"], on_node["cpu"],
    )  # fmt: skip


def measure_link(
    bed: Testbed,
    src: int,
    dst: int,
    *,
    nbytes: int = 50_000_000,
    python: str = sys.executable,
    mpirun: tuple[str, ...] = ("mpirun",),
) -> LinkCheck:
    """Send one ``nbytes`` message from node ``src`` to node ``dst`` with Open MPI over TCP
    (one rank on each, placed by a hostfile of the two) and count the bytes on their links."""
    hosts = bed.state_dir / f"hosts-{src}-{dst}"
    hosts.write_text(f"{bed.address(src)} slots=1\n{bed.address(dst)} slots=1\n")
    before = bed.counters(src)[1], bed.counters(dst)[0]
    proc = bed.run(
        [*mpirun, "-np", "2", "--hostfile", str(hosts), python, "-c", _SEND, str(nbytes)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    after = bed.counters(src)[1], bed.counters(dst)[0]
    got = _json_line(proc, "the message between nodes")
    rates = [bed.nodes[k].link for k in (src, dst)]
    slow = min((r for r in rates if r is not None), default=None)
    return LinkCheck(
        src, dst, nbytes, got["seconds"], None if slow is None else 8 * nbytes / slow,
        after[0] - before[0], after[1] - before[1],
    )  # fmt: skip
