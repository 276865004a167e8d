"""Cost of hethpc.comm's collectives on 2 ranks: small control messages and large tensors.

    .venv/bin/python benchmarks/bench_comm.py [--quick]

Started as a plain process it relaunches itself on 2 ranks. It times, side by side in one run,
a one-element and a 64 MB allreduce through each tensor transport: hethpc's ``mpi`` transport
(mpi4py alone, the default on CPU ranks), then Horovod (started for that part and shut down
after it, as hethpc's ``horovod`` transport runs it); and the control path (mpi4py: votes,
counts and batch sizes) with and without Horovod's background thread beside it. The last line
is one JSON object.
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
    import horovod.torch as hvd  # the horovod transport's own calls, started here on purpose

    reps = 50 if args.quick else 400
    one = torch.ones(1)
    vote = np.ones(1, dtype=np.int64)
    big = torch.ones(int(args.big_mb * 2**20 / 4))

    def tensor_path(reduce) -> tuple[float, float]:  # type: ignore[no-untyped-def]
        for _ in range(20):  # warm-up: Horovod's first collectives negotiate and fill caches
            reduce(one)
        reduce(big)
        small = median_s(lambda: reduce(one), reps)
        return small, median_s(lambda: reduce(big), max(5, reps // 40))

    mpi_small, mpi_big = tensor_path(lambda t: comm.allreduce(t, comm.ReduceOp.SUM))
    ctl_alone = median_s(lambda: comm.allreduce_array(vote), reps)
    hvd.init(comm=comm.runtime.state().mpi.COMM_WORLD)
    try:
        hvd_small, hvd_big = tensor_path(lambda t: hvd.allreduce(t, op=hvd.Sum, name="bench"))
        ctl_beside = median_s(lambda: comm.allreduce_array(vote), reps)
    finally:
        hvd.shutdown()
    gb = args.big_mb / 1024
    return {
        "ranks": comm.size(),
        "mpi_1elem_allreduce_us": round(mpi_small * 1e6, 1),
        "horovod_1elem_allreduce_us": round(hvd_small * 1e6, 1),
        "horovod_over_mpi_small": round(hvd_small / mpi_small, 1),
        "mpi4py_1elem_allreduce_us": round(ctl_beside * 1e6, 1),
        "mpi4py_1elem_allreduce_us_without_horovod": round(ctl_alone * 1e6, 1),
        "horovod_over_mpi4py_small": round(hvd_small / ctl_beside, 1),
        "big_mb": args.big_mb,
        "mpi_big_allreduce_ms": round(mpi_big * 1e3, 2),
        "mpi_big_allreduce_gb_per_s": round(gb / mpi_big, 3),
        "horovod_big_allreduce_ms": round(hvd_big * 1e3, 2),
        "horovod_big_allreduce_gb_per_s": round(gb / hvd_big, 3),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not under_mpi():
        return relaunch(__file__, args.ranks, argv)
    comm.abort_on_exception()
    comm.init(transport="mpi")
    torch.set_num_threads(1)
    result = worker(args)
    if comm.rank() == 0:
        for k, v in result.items():
            print(f"{k:34s} {v}", flush=True)
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
