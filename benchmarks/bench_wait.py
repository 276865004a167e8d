"""How a rank waits inside an allreduce: time and CPU per allreduce of one gradient.

    flock /tmp/hethpc-bench.lock .venv/bin/python benchmarks/bench_wait.py [--quick]

Side by side in one run of 2 ranks, ``--reps`` allreduces of a ``--kb`` KB float32 tensor (423 KB:
the demo model's gradient), each after ``--gap-ms`` of busy work (a step's compute):

- ``MPI_Allreduce``: mpi4py's blocking call (Open MPI spins while it waits);
- ``hethpc sleep <= X us``: ``hethpc.comm.allreduce_`` (``mpi`` transport: a nonblocking
  barrier, then a nonblocking allreduce tested between sleeps that grow to X), for the sleep caps
  of ``--caps`` (the default cap is ``hethpc.comm.waiting.TRANSFER_POLL_MAX_S``);
- ``gloo``: ``torch.distributed.all_reduce`` over gloo (a peer's path: DDP's).

On shared memory (this host), then on hethpc's testbed when run as root on Linux (two nodes,
both links shaped to 200 Mbit/s, node1 capped at half a core: the demo's testbed) twice: with
Open MPI's own TCP settings (``OPEN_MPI_TCP``), and with those of ``scripts/mpirun.sh`` (1 MB
pieces through 4 MB socket buffers: MCA settings any Open MPI job can pass). Printed per rank:
the median and 90th percentile wall time and the CPU time per allreduce (the busy work's time
taken off). The last line is one JSON object: per contender the slower rank's median
(``*_ms``) and the larger CPU time (``*_cpu_ms``), and every rank's figures.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PY = str(ROOT / ".venv" / "bin" / "python")
MPIRUN = str(ROOT / "scripts" / "mpirun.sh")
# Open MPI's own TCP settings (64 KB eager, 128 KB fragments, the system's socket buffers), which
# scripts/mpirun.sh raises to 1 MB pieces and 4 MB buffers.
OPEN_MPI_TCP = {
    "OMPI_MCA_btl_tcp_eager_limit": "65536",
    "OMPI_MCA_btl_tcp_rndv_eager_limit": "65536",
    "OMPI_MCA_btl_tcp_max_send_size": "131072",
    "OMPI_MCA_btl_tcp_sndbuf": "0",
    "OMPI_MCA_btl_tcp_rcvbuf": "0",
}
DEMO_NODES = [{"cpu": 1.0, "link": "200mbit"}, {"cpu": 0.5, "link": "200mbit"}]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="30 allreduces each, shared memory only")
    p.add_argument("--reps", type=int, default=200, help="allreduces per contender")
    p.add_argument("--kb", type=float, default=423.0, help="size of the tensor, KB")
    p.add_argument("--gap-ms", type=float, default=3.7, help="busy work before each, ms")
    p.add_argument("--caps", default="500,50", help="sleep caps to try, microseconds")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.reps = 30
    return args


def _timed(fn: Any, reps: int, gap_s: float) -> dict[str, float]:
    import numpy as np

    walls = []
    c0 = resource.getrusage(resource.RUSAGE_SELF)
    for _ in range(reps):
        t = time.perf_counter()
        while time.perf_counter() - t < gap_s:
            pass
        t0 = time.perf_counter()
        fn()
        walls.append(time.perf_counter() - t0)
    c1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime
    ms = np.array(walls) * 1e3
    return {
        "median_ms": float(np.median(ms)),
        "p90_ms": float(np.percentile(ms, 90)),
        "cpu_ms": max(0.0, cpu / reps * 1e3 - gap_s * 1e3),
    }


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed
    from mpi4py import MPI

    from hethpc import comm
    from hethpc.comm import ReduceOp, waiting

    comm.init(transport="mpi")
    world = MPI.COMM_WORLD
    n = int(args.kb * 1000 / 4)
    x = torch.ones(n)
    y = torch.empty(n)
    gap = args.gap_ms / 1e3
    out: dict[str, dict[str, float]] = {}
    out["MPI_Allreduce"] = _timed(lambda: world.Allreduce(x.numpy(), y.numpy()), args.reps, gap)
    for cap in (float(c) for c in args.caps.split(",")):
        waiting.TRANSFER_POLL_MAX_S = cap / 1e6
        out[f"hethpc sleep <= {cap:g} us"] = _timed(
            lambda: comm.allreduce_(x, ReduceOp.SUM), args.reps, gap
        )
    import peer_ddp  # the DDP peer's own rendezvous: gloo joins as it does there

    peer_ddp.connect(peer_ddp.parse_args([]))
    out["gloo"] = _timed(lambda: torch.distributed.all_reduce(x), args.reps, gap)
    peer_ddp.close()
    rows = world.gather(out, root=0)
    if world.rank == 0:
        print(json.dumps(rows), flush=True)


def run(
    args: argparse.Namespace, bed: Any = None, extra_env: dict[str, str] | None = None
) -> list[dict[str, dict[str, float]]]:
    cmd = [MPIRUN, "-np", "2", PY, __file__, "--worker", "--reps", str(args.reps),
           "--kb", str(args.kb), "--gap-ms", str(args.gap_ms), "--caps", args.caps]  # fmt: skip
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "HETHPC_MPIRUN_TIMEOUT": "300",
        **(extra_env or {}),
    }
    runner = subprocess.run if bed is None else bed.run
    proc = runner(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("[")]
    if proc.returncode != 0 or not lines:
        tail = f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
        raise SystemExit(f"the allreduce probe failed:\n{tail}")
    rows: list[dict[str, dict[str, float]]] = json.loads(lines[-1])
    return rows


def figures(rows: list[dict[str, dict[str, float]]]) -> dict[str, float]:
    """Flat figures: per contender the slower rank's median wall ms and the larger CPU ms."""
    flat: dict[str, float] = {}
    for name in rows[0]:
        key = name.replace("hethpc sleep <= ", "hethpc_").replace(" us", "us").replace(" ", "_")
        flat[f"{key}_ms"] = round(max(r[name]["median_ms"] for r in rows), 3)
        flat[f"{key}_cpu_ms"] = round(max(r[name]["cpu_ms"] for r in rows), 3)
    return flat


def show(where: str, rows: list[dict[str, dict[str, float]]]) -> None:
    print(f"{where}: median / p90 wall ms, CPU ms per allreduce (rank 0 | rank 1)", flush=True)
    for name in rows[0]:
        cells = " | ".join(
            f"{r[name]['median_ms']:6.2f} / {r[name]['p90_ms']:6.2f}  cpu {r[name]['cpu_ms']:5.2f}"
            for r in rows
        )
        print(f"  {name:24} {cells}", flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    out: dict[str, Any] = {"kb": args.kb, "gap_ms": args.gap_ms, "reps": args.reps}
    rows = run(args)
    show("shared memory", rows)
    out["shm"], out["per_rank"] = figures(rows), {"shm": rows}
    if not args.quick:
        from hethpc.testbed import Testbed
        from hethpc.testbed.kernel import missing

        lacking = missing()
        if lacking:
            print(f"testbed skipped: {lacking}", flush=True)
        else:
            with Testbed(DEMO_NODES, name="bwait") as bed:
                rows = run(args, bed, OPEN_MPI_TCP)
            show("testbed (200 Mbit/s, node1 at half a core), Open MPI's TCP settings", rows)
            out["testbed_open_mpi_tcp"], out["per_rank"]["testbed_open_mpi_tcp"] = (
                figures(rows),
                rows,
            )
            with Testbed(DEMO_NODES, name="bwait") as bed:
                rows = run(args, bed)
            show("the same, scripts/mpirun.sh's TCP settings (1 MB pieces, 4 MB buffers)", rows)
            out["testbed"], out["per_rank"]["testbed"] = figures(rows), rows
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
