"""Many trainings in one process (a sweep, the evidence protocol): each leaves nothing behind.

Every sync method, dynamic batching, the emulated link and slowdown, overlap and compression,
run twice over on real ranks; the process's threads and open files after the second round are
those after the first.
"""

from __future__ import annotations

import gc
import os
from pathlib import Path

import pytest

from hethpc import comm
from hethpc.train import TrainConfig, train

RUNS = [
    {"sync": "bsp"},
    {"sync": "bsp", "overlap": True, "compression": "fp16"},
    {"sync": "bsp", "batching": "dynamic"},
    {"sync": "fedavg", "batching": "dynamic", "fedavg_period": 2},
    {"sync": "selsync", "batching": "dynamic", "threshold": 0.3},
    {"sync": "ssp", "staleness": 1},
]


def _held() -> tuple[int, int]:
    """This process's threads (native, Horovod's and MPI's included) and open files."""
    gc.collect()
    return len(os.listdir("/proc/self/task")), len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads in /proc")
@pytest.mark.timeout(240)
def test_runs_in_one_process_leave_no_threads_or_files(
    world: tuple[int, int], tmp_path_factory: pytest.TempPathFactory
) -> None:
    r, n = world
    root = Path(comm.broadcast_object(str(tmp_path_factory.mktemp("runs")) if r == 0 else ""))
    skew = {"partition": "labels", "labels_per_rank": 6, "slowdown": "1:2@0"} if n > 1 else {}
    base = {"model": "cnn1d", "samples": 1200, "epochs": 1, "batch_size": 64, "lr": 0.05,
            "link": "200mbit:50us", "progress": False, **skew}  # fmt: skip
    held = []
    for round_ in range(2):
        for i, settings in enumerate(RUNS):
            cfg = TrainConfig(**base, **settings, seed=i, run_dir=str(root / f"{round_}-{i}"))
            train(cfg, log=lambda _m: None)
        held.append(_held())
    assert held[1] == held[0], f"rank {r}: threads, files after a round {held[0]}, two {held[1]}"
