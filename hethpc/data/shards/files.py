"""A process's HDF5 handles on a dataset's shard files, and reads of sample ranges through HDF5."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import h5py
import numpy as np
from h5py import h5s

from hethpc.data.errors import ShardError


class ShardFiles:
    """Shard files opened on first use, with the HDF5 dataspaces each read reuses.

    h5py handles do not survive a fork: the owner builds a new one in each process.

    Args:
        root: the dataset directory (named in error messages).
        paths: each shard's file.
        sample_shape: shape of one sample.
        locking: HDF5 file locking (None: HDF5's default).
    """

    def __init__(
        self, root: Path, paths: list[Path], sample_shape: tuple[int, ...], locking: bool | None
    ) -> None:
        self.root, self.paths, self.sample_shape, self.locking = root, paths, sample_shape, locking
        self.files: dict[int, h5py.File] = {}
        self.xs: dict[int, h5py.Dataset] = {}
        self.spaces: dict[int, h5s.SpaceID] = {}  # file dataspace per shard, reselected
        self.mspaces: dict[int, h5s.SpaceID] = {}  # memory dataspace per sample count

    def file(self, shard: int) -> h5py.File:
        """``shard``'s open file.

        Raises:
            ShardError: it cannot be opened.
        """
        f = self.files.get(shard)
        if f is None:
            kw: dict[str, Any] = {} if self.locking is None else {"locking": self.locking}
            try:
                f = h5py.File(self.paths[shard], "r", **kw)
            except OSError as e:
                raise ShardError(
                    f"cannot open shard {self.paths[shard]}: {e}; run "
                    f"'python data_tools/inspect_dataset.py {self.root} --verify'"
                ) from e
            self.files[shard] = f
        return f

    def x(self, shard: int) -> h5py.Dataset:
        """``shard``'s dataset of samples."""
        x = self.xs.get(shard)
        if x is None:
            x = self.xs[shard] = self.file(shard)["x"]
        return x

    def read_into(self, shard: int, a: int, b: int, dest: np.ndarray) -> None:
        """Samples ``a .. b-1`` of ``shard`` through HDF5 (its filters and checksums) straight
        into ``dest`` (C-contiguous).

        Raises:
            ShardError: the shard cannot be opened, or the samples fail their checksum.
        """
        try:
            # h5py's low-level read: read_direct's selection objects cost ~0.1 ms a call.
            did = self.x(shard).id
            fspace = self.spaces.get(shard)
            if fspace is None:
                fspace = self.spaces[shard] = did.get_space()
            rest = self.sample_shape
            fspace.select_hyperslab((a, *(0 for _ in rest)), (b - a, *rest))
            mspace = self.mspaces.get(b - a)
            if mspace is None:
                mspace = self.mspaces[b - a] = h5s.create_simple((b - a, *rest))
            did.read(mspace, fspace, dest)
        except OSError as e:
            raise ShardError(
                f"shard {self.paths[shard]} is corrupt (samples {a}..{b - 1} fail their HDF5 "
                f"checksum: {e}); restore or re-convert it, and verify the dataset "
                "(open_dataset(..., verify=True))"
            ) from e

    def close(self) -> None:
        """Close every open file (they reopen on the next read)."""
        for f in self.files.values():
            f.close()
        self.files.clear()
        self.xs.clear()
        self.spaces.clear()
