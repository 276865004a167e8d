"""open_dataset_shared on real ranks: each shard hashed once in the job, damage reported by all."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hethpc import comm
from hethpc.data import DatasetError, ShardError, write_dataset
from hethpc.data.shards import verify as verify_module
from hethpc.data.shards.shared import open_dataset_shared


def _shared_dir(factory: pytest.TempPathFactory, r: int) -> Path:
    tmp = str(factory.mktemp("shared")) if r == 0 else None
    return Path(comm.broadcast_object(tmp))


def _write(root: Path, r: int) -> np.ndarray:
    x = np.arange(700 * 3, dtype=np.float32).reshape(700, 3)
    if r == 0:
        write_dataset(root, [(x, np.arange(700) % 4)], num_classes=4, shard_samples=100,
                      chunk_samples=16)
    comm.barrier()
    return x


def test_each_shard_is_hashed_by_one_rank_and_reads_are_raw(
    world: tuple[int, int], tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    r, n = world
    root = _shared_dir(tmp_path_factory, r) / "ds"
    x = _write(root, r)
    hashed: list[str] = []
    real = verify_module.sha256_file
    monkeypatch.setattr(verify_module, "sha256_file", lambda p: hashed.append(Path(p).name)
                        or real(p))
    ds = open_dataset_shared(root)
    every = comm.allgather_object(hashed)
    names = [name for mine in every for name in mine]
    assert sorted(names) == sorted(s.file for s in ds.manifest.shards)  # each once in the job
    assert all(len(mine) in (7 // n, 7 // n + 1) for mine in every)
    assert not ds.chunk_checksums
    idx = np.random.default_rng(r).permutation(700)
    np.testing.assert_array_equal(ds.read_window(idx)[0], x[idx])


def test_damage_found_by_one_rank_fails_every_rank_naming_the_shard(
    world: tuple[int, int], tmp_path_factory: pytest.TempPathFactory
) -> None:
    r, n = world
    root = _shared_dir(tmp_path_factory, r) / "ds"
    x = _write(root, r)
    if r == 0:  # a flipped sample byte: only the sha256 check reads samples at open
        shard = root / "shard-00005.h5"
        raw = bytearray(shard.read_bytes())
        raw[bytes(raw).find(x[500:516].tobytes()) + 7] ^= 0xFF
        shard.write_bytes(bytes(raw))
    comm.barrier()
    with pytest.raises(ShardError, match="shard-00005.h5 fails its sha256"):
        open_dataset_shared(root)
    comm.barrier()


def test_missing_dataset_fails_every_rank(
    world: tuple[int, int], tmp_path_factory: pytest.TempPathFactory
) -> None:
    r, _ = world
    root = _shared_dir(tmp_path_factory, r)
    with pytest.raises(DatasetError, match="not a dataset directory"):
        open_dataset_shared(root / "nothing-here")


def test_a_subgroup_opens_it_alone(
    world: tuple[int, int], tmp_path_factory: pytest.TempPathFactory
) -> None:
    r, n = world
    if n < 2:
        pytest.skip("needs 2 ranks or more")
    root = _shared_dir(tmp_path_factory, r) / "ds"
    x = _write(root, r)
    first = comm.new_group([0, 1])
    if first.is_member:
        ds = open_dataset_shared(root, group=first)
        np.testing.assert_array_equal(ds.read_window(np.arange(700))[0], x)
    else:
        with pytest.raises(comm.CommError, match="not in the group"):
            open_dataset_shared(root, group=first)
    comm.barrier()
