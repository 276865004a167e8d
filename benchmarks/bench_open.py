"""Start-up cost of opening a dataset on every rank: each rank hashing every shard (what
``open_dataset(verify=True)`` does) against ``open_dataset_shared`` (each shard hashed by one
rank, the findings exchanged).

    flock /tmp/hethpc-bench.lock .venv/bin/python benchmarks/bench_open.py [--ranks 2] [--quick]

Started as a plain process it relaunches itself under ``scripts/mpirun.sh``. It uses
bench_loader's synthetic dataset (1 GB, written once under /tmp and reused), with the page cache
warm, so the figures are the hashing's CPU time; on a shared filesystem the bytes read from
it also drop from ranks x dataset to one dataset. The two ways alternate for --rounds rounds;
each figure is the slowest rank's wall time (the job waits for it), best round kept. The last
stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from _launch import relaunch, under_mpi
from bench_loader import ensure_dataset, shard_files, warm

from hethpc import comm
from hethpc.data import open_dataset
from hethpc.data.shards.shared import open_dataset_shared


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=2, help="MPI ranks")
    p.add_argument("--path", default="/tmp/hethpc-bench-loader/train",
                   help="dataset directory (bench_loader's; written if absent)")
    p.add_argument("--gigabytes", type=float, default=1.0, help="dataset size if written")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds")
    p.add_argument("--quick", action="store_true", help="one round")
    return p.parse_args(argv)


def timed(fn: object) -> float:
    comm.barrier()
    t0 = time.perf_counter()
    fn()  # type: ignore[operator]
    mine = time.perf_counter() - t0
    return max(comm.allgather_object(mine))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.quick:
        args.rounds = 1
    if not under_mpi():
        return relaunch(__file__, args.ranks, argv)
    comm.init()
    comm.abort_on_exception()
    path = Path(args.path)
    if comm.rank() == 0:
        n = int(math.ceil(args.gigabytes * 1e9 / 4096))  # as bench_loader sizes it
        warm(shard_files(ensure_dataset(path, n, 1024)), reread=False)
    comm.barrier()
    every, shared = [], []
    for _ in range(args.rounds):
        every.append(timed(lambda: open_dataset(path, verify=True)))
        shared.append(timed(lambda: open_dataset_shared(path)))
        if comm.rank() == 0:
            print(f"round: every rank hashes all {every[-1]:.2f} s, shared {shared[-1]:.2f} s",
                  flush=True)
    size = sum(s.num_bytes for s in open_dataset(path, verify=False).manifest.shards)
    if comm.rank() == 0:
        print(json.dumps({
            "ranks": comm.size(),
            "dataset_gb": round(size / 1e9, 3),
            "every_rank_verify_s": round(min(every), 3),
            "shared_verify_s": round(min(shared), 3),
            "speedup": round(min(every) / min(shared), 3),
            "rounds": args.rounds,
        }), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
