"""Injection and the IID loader on real ranks: samples move by MPI, slices tile global batches."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from hethpc import comm
from hethpc.data import ArrayDataset, Injector, Loader, open_dataset, write_dataset
from hethpc.data.balance import Rebalancer, proportional_shares, transfer_plan
from hethpc.data.injection import senders, share_size
from hethpc.data.partition import LabelSkewPartitioner


def _one_label_per_rank(n: int) -> ArrayDataset:
    y = np.arange(40 * n) % n
    x = np.stack([y, np.arange(len(y))], axis=1).astype(np.float32)
    return ArrayDataset(x, y, n)


@pytest.mark.parametrize(("alpha", "beta"), [(0.5, 0.25), (1.0, 0.5), (0.0, 0.5)],
                         ids=["some-senders", "all-senders", "off"])
def test_foreign_labels_arrive_at_the_expected_rate(
    world: tuple[int, int], alpha: float, beta: float
) -> None:
    r, n = world
    data = _one_label_per_rank(n)
    mine = LabelSkewPartitioner(labels_per_rank=1).indices(data.y, n, r, seed=0)
    loader = Loader(data, rank=r, world_size=n, mode="partition", indices=mine, seed=0)
    inj = Injector(alpha, beta, seed=7)
    b = inj.local_batch(16)
    foreign = total = expected_foreign = 0
    for step in range(20):
        x, y = loader.next_batch(np.full(n, b))
        x2, y2 = inj.exchange(x, y, step)
        torch.testing.assert_close(x2[:b], x)  # own samples first, untouched
        assert (y2 == x2[:, 0].long()).all(), "samples travel with their labels"
        foreign += int((y2 != r).sum())
        total += len(y2)
        who = senders(alpha, n, step, seed=7).tolist() if n > 1 and beta > 0 else []
        expected_foreign += share_size(b, beta) * len([s for s in who if s != r])
        # Each foreign sample came from the rank that holds its label, which sent that step.
        assert set(y2[b:].tolist()) == {s for s in who if s != r and share_size(b, beta) > 0}
    assert foreign == expected_foreign
    if n > 1 and alpha > 0:
        assert foreign > 0
    else:
        assert foreign == 0
    rates = comm.allgather_object(foreign / total)
    assert len(rates) == n


def test_iid_slices_tile_every_global_batch(
    world: tuple[int, int], tmp_path_factory: pytest.TempPathFactory
) -> None:
    r, n = world
    tmp = str(tmp_path_factory.mktemp("inj")) if r == 0 else None
    root = Path(comm.broadcast_object(tmp))
    x = np.arange(300, dtype=np.float32)[:, None]
    if r == 0:
        write_dataset(root / "ds", [(x, np.zeros(300, int))], num_classes=1, chunk_samples=16)
    comm.barrier()
    ds = open_dataset(root / "ds", verify=True)
    loader = Loader(ds, rank=r, world_size=n, seed=1)
    # The same global stream read by one process, one global batch at a time.
    whole = Loader(ds, rank=0, world_size=1, seed=1, prefetch=False)
    stream: list[int] = []
    for step in range(40):
        sizes = np.array([(step + k) % 5 + 3 for k in range(n)])
        xb, _ = loader.next_batch(sizes)
        assert len(xb) == sizes[r]
        parts = comm.allgather_object(xb[:, 0].long().tolist())
        want = whole.next_batch([sizes.sum()])[0][:, 0].long().tolist()
        assert sorted(v for p in parts for v in p) == sorted(want), f"step {step}: no tiling"
        stream.extend(want)
    first = min(len(stream), 300)
    assert len(set(stream[:first])) == first, "no sample twice within an epoch"


@pytest.mark.parametrize("sizes_of", ["fast_first", "fast_last", "equal"])
def test_rebalancer_draws_each_partition_in_proportion(world: tuple[int, int],
                                                       sizes_of: str) -> None:  # fmt: skip
    """Every rank ends with its compute batch; the union holds each partition's share."""
    rank, n = world
    lengths = np.array([100 * (k + 1) for k in range(n)])
    big_b = 60
    if sizes_of == "equal":
        sizes = np.full(n, big_b // n)
    else:
        sizes = np.array([16] * (n - 1) + [big_b - 16 * (n - 1)])
        sizes = sizes[::-1].copy() if sizes_of == "fast_first" else sizes
    reb = Rebalancer(lengths)
    reads = reb.reads(sizes)
    assert reads.tolist() == proportional_shares(big_b, lengths).tolist()
    x = torch.stack([torch.full((reads[rank],), float(rank)),
                     torch.arange(reads[rank], dtype=torch.float32)], dim=1)  # fmt: skip
    y = torch.full((reads[rank],), rank, dtype=torch.int64)
    bx, by = reb.exchange(x, y, sizes)
    assert len(bx) == len(by) == sizes[rank]
    assert torch.equal(bx[:, 0].long(), by)  # rows and labels travel together
    kept = min(reads[rank], sizes[rank])
    assert torch.equal(bx[:kept], x[:kept])  # its own first rows stay, in order
    counts = comm.allreduce_array(np.bincount(by.numpy(), minlength=n))
    assert counts.tolist() == reads.tolist()
    moved = sum(c for s, d, c in transfer_plan(reads, sizes) if rank in (s, d))
    assert reb.moved == moved
