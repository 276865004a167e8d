"""``--partition site`` on real ranks: each rank's loader holds whole sites, disjoint, all of
them in the job, and its batches are next-byte windows of its own sites only."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from hethpc import comm
from hethpc.cli import convert
from hethpc.data import open_dataset
from hethpc.data.partition.site import assign_sites
from hethpc.train import TrainConfig
from hethpc.train.parts.capabilities import make_loader

CONTEXT = 8
# Six sites of unequal size (windows of 9 bytes, one every 8): 37, 24, 18, 12, 12 and 6.
SITES = {"email": 300, "json": 200, "asyncio": 150, "typing": 100, "abc": 100, "enum": 50}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    comm.init()
    root = None
    if comm.rank() == 0:
        src = tmp_path_factory.mktemp("src")
        for i, (site, n) in enumerate(SITES.items()):
            (src / site).mkdir()
            (src / site / "m.py").write_bytes(bytes((i * 7 + j * 31) % 90 + 32 for j in range(n)))
        root = tmp_path_factory.mktemp("text") / "out"
        argv = ["text", str(src), "--context", str(CONTEXT), "--out", str(root),
                "--val-fraction", "0", "--test-fraction", "0"]  # fmt: skip
        assert convert.main(argv) == 0
    return Path(comm.broadcast_object(str(root) if root is not None else None))


def test_each_rank_holds_whole_sites_and_reads_only_them(data: Path) -> None:
    r, n = comm.rank(), comm.size()
    train = open_dataset(data / "train")
    sites = train.sites
    cfg = TrainConfig(data=str(data), partition="site", seed=3)
    loader = make_loader(cfg, train, rank=r, world_size=n)
    mine = np.sort(loader._base)
    held = np.unique(sites[mine])
    # whole sites: every sample of a site this rank holds is in its share
    np.testing.assert_array_equal(mine, np.flatnonzero(np.isin(sites, held)))
    every = comm.allgather_object(held.tolist())
    flat = [s for h in every for s in h]
    assert sorted(flat) == list(range(len(SITES)))  # disjoint, and all of them in the job
    expected = assign_sites(np.bincount(sites), n, 3)
    assert [sorted(h) for h in every] == [h.tolist() for h in expected]
    sizes = np.full(n, 4)
    x, y = loader.next_batch(sizes)
    assert x.shape == y.shape == (4, CONTEXT) and x.dtype == y.dtype == torch.int64
    windows = np.asarray(train.read(mine)[0], dtype=np.int64)
    got = np.concatenate([x.numpy(), y.numpy()[:, -1:]], axis=1)
    # each row is a window of this rank's own sites, split into inputs and next bytes
    assert all((windows == row).all(axis=1).any() for row in got)
    torch.testing.assert_close(x[:, 1:], y[:, :-1])
