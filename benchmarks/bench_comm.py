"""Cost of hethpc.comm's collectives on 2 ranks: small control messages and large tensors.

    .venv/bin/python benchmarks/bench_comm.py [--quick]

Started as a plain process it relaunches itself on 2 ranks. It times, side by side in one run:
a one-element allreduce through Horovod (tensor path) and through mpi4py (the control path that
votes, counts and batch sizes use), and a 64 MB Horovod allreduce. The last line is one JSON
object.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import torch
from _launch import relaunch, under_mpi

from hethpc import comm


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer repetitions (seconds)")
    p.add_argument("--ranks", type=int, default=2, help="ranks when relaunching")
    p.add_argument("--big-mb", type=float, default=64.0, help="size of the large allreduce")
    return p.parse_args(argv)


def median_s(fn, reps: int) -> float:  # type: ignore[no-untyped-def]
    """Median wall time of ``fn()`` over ``reps`` calls, after a barrier each."""
    times = []
    for _ in range(reps):
        comm.barrier()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def worker(args: argparse.Namespace) -> dict[str, float]:
    reps = 50 if args.quick else 400
    one = torch.ones(1)
    vote = np.ones(1, dtype=np.int64)
    big = torch.ones(int(args.big_mb * 2**20 / 4))
    for _ in range(20):  # warm-up: Horovod's first collectives negotiate and fill its caches
        comm.allreduce(one)
        comm.allreduce_array(vote)
    comm.allreduce(big)
    hvd_small = median_s(lambda: comm.allreduce(one, comm.ReduceOp.SUM), reps)
    mpi_small = median_s(lambda: comm.allreduce_array(vote), reps)
    hvd_big = median_s(lambda: comm.allreduce(big, comm.ReduceOp.SUM), max(5, reps // 40))
    return {
        "ranks": comm.size(),
        "horovod_1elem_allreduce_us": round(hvd_small * 1e6, 1),
        "mpi4py_1elem_allreduce_us": round(mpi_small * 1e6, 1),
        "horovod_over_mpi4py_small": round(hvd_small / mpi_small, 1),
        "big_mb": args.big_mb,
        "horovod_big_allreduce_ms": round(hvd_big * 1e3, 2),
        "horovod_big_allreduce_gb_per_s": round(args.big_mb / 1024 / hvd_big, 3),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not under_mpi():
        return relaunch(__file__, args.ranks, argv)
    comm.abort_on_exception()
    comm.init()
    torch.set_num_threads(1)
    result = worker(args)
    if comm.rank() == 0:
        for k, v in result.items():
            print(f"{k:34s} {v}", flush=True)
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
