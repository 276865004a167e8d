"""ShardedDataset.read against numpy indexing: whole-chunk runs, cached and mapped gathers."""

from __future__ import annotations

import multiprocessing
import pickle
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

from hethpc.data import DatasetError, ShardedDataset, ShardError, open_dataset, write_dataset
from hethpc.data.shards.shared import open_dataset_shared, split_shards
from hethpc.train.parts.build import data_root

N, CHUNK, SHARD = 230, 8, 100  # shards of 100, 100, 30; each shard's last chunk is partial


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((N, 3, 2)).astype(np.float32)
    y = rng.integers(0, 4, N)
    path = tmp_path_factory.mktemp("read") / "ds"
    write_dataset(path, [(x, y)], num_classes=4, shard_samples=SHARD, chunk_samples=CHUNK)
    return path, x, y


def _random(seed: int, k: int) -> np.ndarray:
    return np.random.default_rng(seed).choice(N, k, replace=False)


CASES = {
    "everything": np.arange(N),
    "one_whole_chunk": np.arange(8, 16),
    "whole_chunks_across_shards": np.arange(88, 116),
    "partial_last_chunks": np.arange(96, 100),
    "run_inside_a_chunk": np.arange(3, 7),
    "runs_with_gaps": np.r_[0:5, 6:30, 31:40],
    "sorted_sparse": np.sort(_random(0, 40)),
    "unsorted": _random(1, 60),
    "duplicates": np.array([5, 5, 5, 200, 0, 200, 229, 229]),
    "reversed": np.arange(N)[::-1],
    "empty": np.array([], dtype=np.int64),
}


CHECKSUMS = pytest.mark.parametrize("checks", [True, False], ids=["hdf5_reads", "raw_chunks"])


@CHECKSUMS
@pytest.mark.parametrize("cache_bytes", [0, 1 << 20], ids=["no_cache", "cache"])
@pytest.mark.parametrize("name", list(CASES), ids=list(CASES))
def test_read_matches_numpy(
    data: tuple[Path, np.ndarray, np.ndarray], name: str, cache_bytes: int, checks: bool
) -> None:
    path, x, y = data
    ds = open_dataset(path, verify=False, cache_bytes=cache_bytes, chunk_checksums=checks)
    idx = CASES[name]
    for _ in range(2):  # the second read may hit the chunk cache
        got_x, got_y = ds.read(idx)
        np.testing.assert_array_equal(got_x, x[idx])
        np.testing.assert_array_equal(got_y, y[idx])


def test_recycled_chunk_buffers_never_leak_into_results(
    data: tuple[Path, np.ndarray, np.ndarray],
) -> None:
    """A tiny cache evicts and reuses chunk buffers; earlier results must stay intact."""
    path, x, _ = data
    ds: ShardedDataset = open_dataset(path, verify=False, cache_bytes=CHUNK * 6 * 4)
    reads = [_random(seed, 25) for seed in range(20)]
    got = [ds.read(idx)[0] for idx in reads]
    for idx, g in zip(reads, got, strict=True):
        np.testing.assert_array_equal(g, x[idx])


@CHECKSUMS
@pytest.mark.parametrize("name", list(CASES), ids=list(CASES))
def test_read_window_matches_numpy(
    data: tuple[Path, np.ndarray, np.ndarray], name: str, checks: bool
) -> None:
    path, x, y = data
    ds = open_dataset(path, verify=False, chunk_checksums=checks)
    idx = CASES[name]
    for _ in range(2):  # its one-chunk buffer is reused: results must not share it
        got_x, got_y = ds.read_window(idx)
        np.testing.assert_array_equal(got_x, x[idx])
        np.testing.assert_array_equal(got_y, y[idx])


@CHECKSUMS
def test_read_window_results_own_their_memory(
    data: tuple[Path, np.ndarray, np.ndarray], checks: bool
) -> None:
    path, x, _ = data
    ds = open_dataset(path, verify=False, chunk_checksums=checks)
    first = ds.read_window(np.arange(0, 8))[0]
    ds.read_window(np.arange(8, 16))  # same buffer, other chunk
    np.testing.assert_array_equal(first, x[0:8])
    with pytest.raises(IndexError, match="0..229"):
        ds.read_window(np.array([3, N]))


@pytest.mark.parametrize("compression", [None, "gzip"])
def test_raw_chunk_reads_only_after_sha256_and_only_for_uncompressed_chunks(
    tmp_path: Path, compression: str | None
) -> None:
    rng = np.random.default_rng(4)
    x = rng.standard_normal((50, 5)).astype(np.float32)
    y = rng.integers(0, 3, 50)
    path = tmp_path / "ds"
    write_dataset(path, [(x, y)], num_classes=3, chunk_samples=8, compression=compression)
    checked = open_dataset(path, verify=False)
    verified = open_dataset(path)
    assert checked.chunk_checksums and not verified.chunk_checksums
    idx = rng.permutation(50)
    for ds in (checked, verified):
        np.testing.assert_array_equal(ds.read_window(idx)[0], x[idx])
        np.testing.assert_array_equal(ds.read(idx)[0], x[idx])
    assert checked._raw == {0: False}
    assert verified._raw == {0: compression is None}


def test_raw_chunk_reads_skip_fletcher32_so_checked_reads_catch_later_damage(
    tmp_path: Path,
) -> None:
    """The trade-off, pinned: a byte damaged after the sha256 check is caught only by HDF5."""
    x = np.arange(64 * 4, dtype=np.float32).reshape(64, 4)
    path = tmp_path / "ds"
    write_dataset(path, [(x, np.zeros(64, dtype=np.int64))], num_classes=1, chunk_samples=8)
    verified = open_dataset(path)
    shard = path / verified.manifest.shards[0].file
    raw = bytearray(shard.read_bytes())
    at = bytes(raw).find(x[8:16].tobytes())
    raw[at + 5] ^= 0xFF
    shard.write_bytes(bytes(raw))
    assert not np.array_equal(verified.read_window(np.arange(8, 16))[0], x[8:16])
    with pytest.raises(ShardError, match="corrupt"):
        open_dataset(path, verify=False).read_window(np.arange(8, 16))


@pytest.mark.parametrize(
    ("sizes", "world", "expected"),
    [
        ([5, 5, 5, 5], 2, [[0, 2], [1, 3]]),
        ([10, 1, 1, 1], 2, [[0], [1, 2, 3]]),
        ([3, 9, 4], 3, [[1], [2], [0]]),
        ([1, 2], 4, [[1], [0], [], []]),
        ([], 2, [[], []]),
    ],
)
def test_split_shards_balances_bytes(
    sizes: list[int], world: int, expected: list[list[int]]
) -> None:
    assert split_shards(sizes, world) == expected


def test_open_dataset_shared_in_one_process_hashes_everything(
    data: tuple[Path, np.ndarray, np.ndarray], tmp_path: Path
) -> None:
    path, x, _ = data
    ds = open_dataset_shared(path)
    assert not ds.chunk_checksums
    np.testing.assert_array_equal(ds.read_window(np.arange(N))[0], x)
    with pytest.raises(DatasetError, match="not a dataset directory"):
        open_dataset_shared(tmp_path)


def _read_in_child(ds: ShardedDataset, idx: np.ndarray, q: Any) -> None:
    q.put(ds.read_window(idx)[0])


@pytest.mark.parametrize("compression", [None, "gzip"])
def test_direct_reads_only_for_verified_uncompressed_shards(
    tmp_path: Path, compression: str | None
) -> None:
    x = np.arange(40 * 3, dtype=np.float32).reshape(40, 3)
    path = tmp_path / "ds"
    write_dataset(path, [(x, np.zeros(40, dtype=np.int64))], num_classes=1, chunk_samples=8,
                  shard_samples=16, compression=compression)
    assert not open_dataset(path, verify=False).direct_reads
    ds = open_dataset(path)
    assert ds.direct_reads == (compression is None)
    idx = np.random.default_rng(0).permutation(40)
    np.testing.assert_array_equal(ds.read_window(idx)[0], x[idx])
    assert (ds._mapped.region is not None) == (compression is None)


def test_mapped_shards_start_on_2mib_boundaries(
    data: tuple[Path, np.ndarray, np.ndarray],
) -> None:
    # Each shard file lies at an address that agrees with its file offsets modulo 2 MiB, as
    # numpy.memmap's own mapping does, so the kernel may map a large cached folio per fault.
    path, x, _ = data
    ds = open_dataset(path)
    idx = np.arange(N)
    np.testing.assert_array_equal(ds.read_window(idx)[0], x[idx])
    region = ds._mapped.region
    assert region is not None and all(region.mapped)
    base = region.data.ctypes.data
    assert [(base + int(s)) % (2 << 20) for s in region.starts] == [0] * len(region.starts)
    assert all(int(b) - int(a) >= size for a, b, size in
               zip(region.starts[:-1], region.starts[1:], region.sizes, strict=True))


def test_direct_reads_after_fork_pickle_and_close_and_from_threads(
    data: tuple[Path, np.ndarray, np.ndarray],
) -> None:
    path, x, _ = data
    ds = open_dataset(path)
    idx = np.random.default_rng(5).permutation(N)
    np.testing.assert_array_equal(ds.read_window(idx)[0], x[idx])  # mapped in this process
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    child = ctx.Process(target=_read_in_child, args=(ds, idx[::-1], q))  # inherits the mapping
    child.start()
    np.testing.assert_array_equal(q.get(timeout=60), x[idx[::-1]])
    child.join(60)
    assert child.exitcode == 0
    clone = pickle.loads(pickle.dumps(ds))
    np.testing.assert_array_equal(clone.read(idx)[0], x[idx])
    ds.close()
    np.testing.assert_array_equal(ds.read(idx[:50])[0], x[idx[:50]])  # maps again

    def work(seed: int) -> bool:
        rng = np.random.default_rng(seed)
        for _ in range(50):
            i = rng.integers(0, N, 64)
            if not np.array_equal(ds.read_window(i)[0], x[i]):
                return False
        return True

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(work, range(8)))


def test_large_chunks_start_on_page_boundaries(tmp_path: Path) -> None:
    x = np.zeros((64, 1024), dtype=np.float32)  # 4 KiB samples, 64 KiB chunks of 16
    path = tmp_path / "ds"
    write_dataset(path, [(x, np.zeros(64, dtype=np.int64))], num_classes=1, chunk_samples=16)
    ds = open_dataset(path)
    with h5py.File(path / ds.manifest.shards[0].file) as f:
        offsets: list[int] = []
        f["x"].id.chunk_iter(lambda info: offsets.append(info.byte_offset))
    assert len(offsets) == 4 and all(o % 4096 == 0 for o in offsets)


def test_the_two_names_of_a_converted_dataset(tmp_path: Path) -> None:
    """``OUT`` (holding train/ and test/) and ``OUT/train``: each place takes its own form,
    ``--data`` takes both, and the dataset reader names the splits it was given instead."""
    x, y = np.zeros((6, 2), np.float32), np.arange(6) % 2
    for split in ("train", "test"):
        write_dataset(tmp_path / "out" / split, [(x, y)], num_classes=2)
    write_dataset(tmp_path / "alone" / "train", [(x, y)], num_classes=2)
    out = tmp_path / "out"
    with pytest.raises(DatasetError, match=f"^{out} is not one dataset: it holds train/ and "
                       f"test/; pass {out}/train or {out}/test$"):  # fmt: skip
        open_dataset(out)
    assert data_root(str(out)) == out
    assert data_root(str(out / "train")) == out
    assert data_root(str(out / "test")) == out
    with pytest.raises(DatasetError, match="alone/train is a single dataset; --data takes a "
                       "directory that holds train/ and test/"):  # fmt: skip
        data_root(str(tmp_path / "alone" / "train"))
    with pytest.raises(DatasetError, match="alone holds train/, but training needs train/ and "
                       "test/"):  # fmt: skip
        data_root(str(tmp_path / "alone"))
