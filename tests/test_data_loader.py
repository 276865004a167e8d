"""The loader, single process: epoch semantics for any per-rank sizes, resume, prefetch, errors."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import torch

from hethpc.data import (
    ArrayDataset,
    Loader,
    LoaderError,
    ShardedDataset,
    open_dataset,
    write_dataset,
)
from hethpc.data.loader import worth_prefetching
from hethpc.data.partition import IIDPartitioner
from hethpc.data.shards.order import block_shuffle, block_shuffle_windows, segment_bounds

N = 600


def _arrays() -> tuple[np.ndarray, np.ndarray]:
    # Sample i holds the value i, so a batch tells which samples it holds.
    x = np.repeat(np.arange(N, dtype=np.float32)[:, None], 3, axis=1)
    return x, np.arange(N) % 6


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> ShardedDataset:
    x, y = _arrays()
    path = tmp_path_factory.mktemp("loader") / "ds"
    write_dataset(path, [(x, y)], num_classes=6, shard_samples=250, chunk_samples=20)
    return open_dataset(path)


@pytest.fixture(params=["memory", "hdf5"])
def dataset(
    request: pytest.FixtureRequest, sharded: ShardedDataset
) -> ArrayDataset | ShardedDataset:
    if request.param == "memory":
        return ArrayDataset(*_arrays(), 6)
    return sharded


SIZES = [
    ("uniform", [[32, 32, 32]]),
    ("uneven", [[10, 50, 4]]),
    ("changing", [[32, 32, 32], [60, 30, 6], [1, 1, 94]]),
]


@pytest.mark.parametrize("schedule", [s[1] for s in SIZES], ids=[s[0] for s in SIZES])
def test_iid_each_sample_once_per_epoch_whatever_the_sizes(
    dataset: ArrayDataset | ShardedDataset, schedule: list[list[int]]
) -> None:
    loaders = [Loader(dataset, rank=r, world_size=3, seed=4) for r in range(3)]
    chunk = loaders[0]._chunk
    # The global stream: epoch permutations back to back (each a permutation: tested below).
    stream = np.concatenate([block_shuffle(np.arange(N), chunk=chunk, window=16, seed=4, epoch=e)
                             for e in range(3)])
    pos = step = 0
    while pos < 2 * N:
        sizes = schedule[step % len(schedule)]
        batches = [ld.next_batch(sizes) for ld in loaders]
        for r, (x, y) in enumerate(batches):
            assert x.shape == (sizes[r], 3) and x.dtype == torch.float32
            np.testing.assert_array_equal(y.numpy(), x[:, 0].numpy().astype(int) % 6)
            a = pos + sum(sizes[:r])
            np.testing.assert_array_equal(  # rank r's slice of the global batch
                np.sort(x[:, 0].numpy().astype(int)), np.sort(stream[a : a + sizes[r]]))
        pos += sum(sizes)
        step += 1
    assert loaders[0].epoch == pos // N
    for e in range(2):
        np.testing.assert_array_equal(np.sort(stream[e * N : (e + 1) * N]), np.arange(N))
    assert not np.array_equal(stream[:N], stream[N : 2 * N]), "a new order each epoch"


def test_epoch_and_step_counters(dataset: ArrayDataset | ShardedDataset) -> None:
    ld = Loader(dataset, rank=0, world_size=1, prefetch=False)
    assert ld.steps_per_epoch(100) == 6
    for _ in range(6):
        ld.next_batch([100])
    assert (ld.epoch, ld.step_in_epoch) == (1, 0)
    ld.next_batch([100])
    assert (ld.epoch, ld.step_in_epoch) == (1, 1)


def test_block_shuffle_is_a_permutation_that_keeps_chunks_together() -> None:
    idx = np.arange(1000)
    o = block_shuffle(idx, chunk=50, window=2, seed=0, epoch=0)
    np.testing.assert_array_equal(np.sort(o), idx)
    # Any 100 consecutive positions from a window boundary touch exactly 2 chunks.
    assert all(len(np.unique(o[a : a + 100] // 50)) == 2 for a in range(0, 1000, 100))
    assert not np.array_equal(o, block_shuffle(idx, chunk=50, window=2, seed=0, epoch=1))


def test_window_bounds_follow_the_block_shuffle() -> None:
    idx = np.arange(1000)
    o, w = block_shuffle_windows(idx, chunk=50, window=3, seed=2, epoch=0)
    np.testing.assert_array_equal(o, block_shuffle(idx, chunk=50, window=3, seed=2, epoch=0))
    bounds = segment_bounds(w)
    assert bounds[0] == 0 and bounds[-1] == 1000
    sizes = np.diff(bounds)
    assert (sizes == 150).sum() == 6 and sizes[-1] == 100  # 20 chunks in windows of 3
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):  # each window: 3 whole chunks
        assert len(np.unique(o[a:b] // 50)) == (b - a) // 50
    np.testing.assert_array_equal(segment_bounds(np.array([4, 4, 1, 1, 1, 4])), [0, 2, 5, 6])


def test_sharded_batches_across_windows_and_epochs(sharded: ShardedDataset) -> None:
    """Batches that start, end or cross shuffle windows and epochs, and empty ones."""
    ld = Loader(sharded, rank=0, world_size=1, seed=5, shuffle_window=2, prefetch=False)
    order = np.concatenate([block_shuffle(np.arange(N), chunk=sharded.chunk_samples, window=2,
                                          seed=5, epoch=e) for e in range(3)])
    pos = 0
    for b in [1, 0, 37, sharded.chunk_samples * 2, 250, 0, 599, 3, 500]:
        x, y = ld.next_batch([b])
        assert x.shape[0] == b
        np.testing.assert_array_equal(x[:, 0].numpy().astype(int), order[pos : pos + b])
        pos += b


@pytest.mark.parametrize("mode", ["seldp", "partition"])
def test_partitioned_modes_cycle_through_the_rank_share(
    dataset: ArrayDataset | ShardedDataset, mode: str
) -> None:
    parts = IIDPartitioner().all_indices(dataset_labels(dataset), 2, 0)
    ld = Loader(dataset, rank=1, world_size=2, mode=mode, seed=0,
                indices=parts[1] if mode == "partition" else None)
    share = set(parts[1].tolist()) if mode == "partition" else set(range(N))
    got = np.concatenate([ld.next_batch([7, 25])[0][:, 0].numpy().astype(int)
                          for _ in range(len(share) // 25)])
    assert len(got) == len(set(got.tolist())), "no repeat inside an epoch"
    assert set(got.tolist()) <= share
    if mode == "seldp":  # rank 1 starts at chunk 1 of the epoch order
        order = block_shuffle(np.arange(N), chunk=ld._chunk, window=16, seed=0, epoch=0)
        np.testing.assert_array_equal(np.sort(got[:25]), np.sort(np.array_split(order, 2)[1][:25]))


def dataset_labels(d: ArrayDataset | ShardedDataset) -> np.ndarray:
    return d.y if isinstance(d, ArrayDataset) else d.labels


def test_worth_prefetching_needs_caller_time_to_overlap() -> None:
    assert worth_prefetching(None, 0.01) and worth_prefetching(0.001, None)  # not yet known
    assert worth_prefetching(0.0025, 0.01)  # a quarter of the load time: hides it in part
    assert not worth_prefetching(0.002, 0.01)
    assert not worth_prefetching(0.0, 1e-6)


def test_auto_prefetch_follows_the_callers_pace(dataset: ArrayDataset | ShardedDataset) -> None:
    ld = Loader(dataset, rank=0, world_size=1, seed=0)  # prefetch="auto" by default
    ld.load_s = 0.004  # as if a batch took 4 ms to read
    for _ in range(3):  # the caller computes 20 ms per batch: worth overlapping
        ld.next_batch([10])
        time.sleep(0.02)
    assert ld.gap_s is not None and ld.gap_s > 0.01
    ld.next_batch([10])
    assert ld.prefetching
    ld.gap_s, ld.load_s = 0.0, 1.0  # a caller that only reads: nothing to overlap
    ld.next_batch([10])
    assert not ld.prefetching
    ld.close()


def test_prefetch_setting_is_checked(dataset: ArrayDataset | ShardedDataset) -> None:
    with pytest.raises(LoaderError, match="prefetch must be True, False or 'auto'"):
        Loader(dataset, rank=0, world_size=1, prefetch="yes")


@pytest.mark.parametrize("prefetch", [False, True, "auto"], ids=["inline", "prefetch", "auto"])
def test_resume_is_exact(
    dataset: ArrayDataset | ShardedDataset, prefetch: bool | str
) -> None:
    sched = [[40, 20], [40, 20], [10, 50], [30, 30]]
    ref = Loader(dataset, rank=1, world_size=2, seed=9, prefetch=False)
    want = [ref.next_batch(sched[i % 4])[0] for i in range(30)]
    a = Loader(dataset, rank=1, world_size=2, seed=9, prefetch=prefetch)
    for i in range(13):
        torch.testing.assert_close(a.next_batch(sched[i % 4])[0], want[i])
    state = a.state_dict()
    b = Loader(dataset, rank=1, world_size=2, seed=9, prefetch=prefetch)
    b.load_state_dict(state)
    for i in range(13, 30):
        torch.testing.assert_close(b.next_batch(sched[i % 4])[0], want[i])
    a.close()
    b.close()


def test_uint8_samples_are_scaled(tmp_path: Path) -> None:
    x = np.full((10, 2), 255, np.uint8)
    write_dataset(tmp_path / "u8", [(x, np.zeros(10, int))], num_classes=1)
    got, _ = Loader(open_dataset(tmp_path / "u8"), rank=0, world_size=1).next_batch([4])
    torch.testing.assert_close(got, torch.ones(4, 2))


BAD = [
    ("partition-needs-indices", dict(mode="partition"), None, "needs indices"),
    ("unknown-mode", dict(mode="random"), None, "mode must be one of"),
    ("wrong-sizes", {}, [5], "must hold 2 non-negative batch sizes"),
    ("global-too-large", {}, [400, 201], "global batch 601 is larger than the 600 samples"),
    ("batch-above-share", dict(mode="partition", indices=np.arange(20)), [5, 21],
     "rank 1: batch size 21 is larger than its partition share of 20"),
    ("empty-share", dict(mode="partition", indices=np.arange(0)), None, "rank 1 was given no"),
]


@pytest.mark.parametrize(("name", "kw", "sizes", "match"), BAD, ids=[b[0] for b in BAD])
def test_bad_input(name: str, kw: dict[str, object], sizes: list[int] | None, match: str) -> None:
    ds = ArrayDataset(*_arrays(), 6)
    with pytest.raises(LoaderError, match=match):
        ld = Loader(ds, rank=1, world_size=2, **kw)  # type: ignore[arg-type]
        ld.next_batch(sizes)


def test_state_from_another_setup_is_refused() -> None:
    ds = ArrayDataset(*_arrays(), 6)
    state = Loader(ds, rank=0, world_size=2, seed=1).state_dict()
    with pytest.raises(LoaderError, match="seed=1.*same data, mode, seed"):
        Loader(ds, rank=0, world_size=2, seed=2).load_state_dict(state)


def test_direct_reads_match_window_reads_and_survive_close(sharded: ShardedDataset) -> None:
    """A verified dataset is read a batch at a time from its mapped files, the same batches
    as through HDF5's windows."""
    assert sharded.direct_reads
    checked = open_dataset(sharded.root, verify=False)
    assert not checked.direct_reads
    a = Loader(sharded, rank=0, world_size=1, seed=3, prefetch=False)
    b = Loader(checked, rank=0, world_size=1, seed=3, prefetch=False)
    for i, size in enumerate([50, 0, 333, 600, 7]):
        if i == 2:
            sharded.close()  # unmapped: the next read maps the files again
        torch.testing.assert_close(a.next_batch([size]), b.next_batch([size]))
    assert a._direct and not b._direct


def test_page_sized_samples_are_gathered_as_whole_rows(tmp_path: Path) -> None:
    """Samples of a page each in page-aligned chunks (the writer's layout for chunks of 64 KiB
    and more) are gathered by ``np.take`` over a typed view of the mapped files: the same
    batches as through HDF5's windows, and as the byte-offset gather of unaligned layouts."""
    n = 64
    x = np.repeat(np.arange(n, dtype=np.float32)[:, None], 1024, axis=1)
    write_dataset(tmp_path / "p", [(x, np.arange(n) % 4)], num_classes=4, shard_samples=40,
                  chunk_samples=16)
    direct = open_dataset(tmp_path / "p")
    checked = open_dataset(tmp_path / "p", verify=False)
    a = Loader(direct, rank=0, world_size=1, seed=5, prefetch=False)
    b = Loader(checked, rank=0, world_size=1, seed=5, prefetch=False)
    for size in [16, 5, 64, 1, 30]:
        torch.testing.assert_close(a.next_batch([size]), b.next_batch([size]))
    assert a._direct and direct._mapped._typed is not None
    xs = a.next_batch([8])[0]
    assert (xs == xs[:, :1]).all()  # every row one whole sample, none straddling two


def test_sizes_checked_again_after_a_change(dataset: ArrayDataset | ShardedDataset) -> None:
    """The loader reuses the plan of unchanged sizes; new sizes are checked and served anew."""
    ld = Loader(dataset, rank=1, world_size=2, seed=0, prefetch=False)
    ld2 = Loader(dataset, rank=1, world_size=2, seed=0, prefetch=False)
    for sizes in ([10, 20], [10, 20], np.array([5, 7]), [5, 7], (30, 1)):
        x, _ = ld.next_batch(sizes)
        assert len(x) == int(np.asarray(sizes)[1])
        ld2._planned = None  # a loader that plans every batch from scratch
        torch.testing.assert_close(x, ld2.next_batch(sizes)[0])
    with pytest.raises(LoaderError, match="must hold 2 non-negative"):
        ld.next_batch([30])
    with pytest.raises(LoaderError, match="must hold 2 non-negative"):
        ld.next_batch([30, -1])
    with pytest.raises(LoaderError, match="global batch 700 is larger"):
        ld.next_batch([350, 350])
