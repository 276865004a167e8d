"""Streaming, atomic writer of HDF5-sharded datasets (``manifest.json`` plus shard files)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import Any

import h5py
import numpy as np

from hethpc.data.errors import DatasetError
from hethpc.data.shards.manifest import MANIFEST_NAME, Manifest, ShardInfo
from hethpc.data.shards.verify import sha256_file

COMPRESSIONS = (None, "gzip", "lzf")
CHUNK_BYTES = 1 << 20  # default HDF5 chunk: about 1 MiB of samples
# Sample chunks of at least ALIGN_MIN_BYTES start on a page boundary (HDF5's alignment; the
# padding is under 4 KiB a chunk, 0.4 % of a default chunk), so samples whose size is a multiple
# of the page lie on whole pages: gathering them from the page cache touches one page per page
# of data, not two (the mapped reads of :class:`~hethpc.data.ShardedDataset`).
PAGE_BYTES = 4096
ALIGN_MIN_BYTES = 64 << 10


class DatasetWriter:
    """Write a dataset a piece at a time; it appears at ``path`` only when complete.

    Shards are written into a temporary directory next to ``path`` and the directory is renamed
    into place by :meth:`close` (``os.replace``), so a reader never sees half a dataset and a
    crash leaves the old one intact. Memory use is one piece plus one chunk, whatever the total.

    Use as a context manager; an exception inside the block discards everything written.

    Args:
        path: the dataset directory to create.
        sample_shape: shape of one sample.
        num_classes: labels must lie in ``0 .. num_classes - 1``.
        dtype: dtype of ``x`` (samples are cast to it).
        label_dtype: dtype of ``y``.
        name: dataset name for the manifest.
        split: split name for the manifest.
        shard_samples: samples per shard file (the last one may hold fewer).
        chunk_samples: samples per HDF5 chunk; default: about 1 MiB of samples.
        compression: None, ``"gzip"`` or ``"lzf"``.
        force: replace an existing dataset at ``path``; without it an existing path is refused.
        meta: provenance stored in the manifest.
        sites: names of the samples' sites (e.g. a text window's package); given, every
            :meth:`write` takes each sample's site index into them, stored as the shards'
            ``site`` column (int32) and counted per shard in the manifest.

    Raises:
        DatasetError: ``path`` exists and ``force`` is off, ``path`` exists but is not a dataset,
            or a setting is invalid.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        sample_shape: tuple[int, ...],
        num_classes: int,
        dtype: str | np.dtype[Any] = "float32",
        label_dtype: str | np.dtype[Any] = "int64",
        name: str = "dataset",
        split: str = "train",
        shard_samples: int = 65_536,
        chunk_samples: int | None = None,
        compression: str | None = None,
        force: bool = False,
        meta: dict[str, Any] | None = None,
        sites: list[str] | None = None,
    ) -> None:
        self.path = Path(path)
        if self.path.exists() or self.path.is_symlink():
            if not force:
                raise DatasetError(
                    f"{self.path} already exists; pass force=True (--force) to replace it"
                )
            if not (self.path / MANIFEST_NAME).is_file():
                raise DatasetError(
                    f"{self.path} exists and is not a hethpc dataset (no {MANIFEST_NAME}); "
                    "refusing to replace it even with force; choose another path"
                )
        if compression not in COMPRESSIONS:
            raise DatasetError(f"compression must be one of {COMPRESSIONS}, got {compression!r}")
        if num_classes < 1 or shard_samples < 1:
            raise DatasetError(
                f"num_classes and shard_samples must be >= 1, got {num_classes}, {shard_samples}"
            )
        self.sample_shape = tuple(int(s) for s in sample_shape)
        self.dtype = np.dtype(dtype)
        self.label_dtype = np.dtype(label_dtype)
        if self.label_dtype.kind not in "iu":
            raise DatasetError(f"label_dtype must be an integer type, got {self.label_dtype}")
        sample_bytes = max(1, int(np.prod(self.sample_shape)) * self.dtype.itemsize)
        self._sample_bytes = sample_bytes
        self.chunk_samples = int(chunk_samples or max(1, CHUNK_BYTES // sample_bytes))
        self.chunk_samples = min(self.chunk_samples, shard_samples)
        self.num_classes = int(num_classes)
        self.name, self.split = name, split
        self.shard_samples = int(shard_samples)
        self.compression = compression
        self.force = force
        self.meta = dict(meta or {})
        self.sites = None if sites is None else [str(v) for v in sites]
        if self.sites is not None and (not self.sites or len(set(self.sites)) != len(self.sites)):
            raise DatasetError(f"sites must be distinct names, at least one, got {sites!r}")
        self._site_counts = np.zeros(len(self.sites or ()), dtype=np.int64)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._tmp = Path(tempfile.mkdtemp(prefix=f".{self.path.name}.tmp-", dir=self.path.parent))
        self._shards: list[ShardInfo] = []
        self._file: h5py.File | None = None
        self._fill = 0
        self._counts = np.zeros(self.num_classes, dtype=np.int64)
        self._closed = False
        self.manifest: Manifest | None = None

    def __enter__(self) -> DatasetWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def _open_shard(self) -> h5py.File:
        name = f"shard-{len(self._shards):05d}.h5"
        chunk_bytes = self.chunk_samples * self._sample_bytes
        align: dict[str, int] = {}
        if chunk_bytes >= ALIGN_MIN_BYTES:
            align = {"alignment_threshold": chunk_bytes, "alignment_interval": PAGE_BYTES}
        f = h5py.File(self._tmp / name, "w", **align)
        common: dict[str, Any] = {"fletcher32": True, "compression": self.compression}
        f.create_dataset(
            "x",
            shape=(0, *self.sample_shape),
            maxshape=(None, *self.sample_shape),
            dtype=self.dtype,
            chunks=(self.chunk_samples, *self.sample_shape),
            **common,
        )
        f.create_dataset(
            "y", shape=(0,), maxshape=(None,), dtype=self.label_dtype,
            chunks=(self.chunk_samples,), **common,
        )
        if self.sites is not None:
            f.create_dataset(
                "site", shape=(0,), maxshape=(None,), dtype="int32",
                chunks=(self.chunk_samples,), **common,
            )
        self._fill = 0
        self._counts[:] = 0
        self._site_counts[:] = 0
        return f

    def _close_shard(self) -> None:
        f = self._file
        if f is None:
            return
        file = Path(f.filename).name
        f.close()
        self._file = None
        p = self._tmp / file
        self._shards.append(
            ShardInfo(
                file=file,
                num_samples=self._fill,
                label_counts=[int(c) for c in self._counts],
                sha256=sha256_file(p),
                num_bytes=p.stat().st_size,
                site_counts=None if self.sites is None else [int(c) for c in self._site_counts],
            )
        )

    def write(self, x: np.ndarray, y: np.ndarray, site: np.ndarray | None = None) -> None:
        """Append samples ``x`` (shape ``[n, *sample_shape]``) with labels ``y`` (shape ``[n]``)
        and, in a writer given ``sites``, their site indices ``site`` (shape ``[n]``).

        Raises:
            DatasetError: shapes disagree with the writer's, a label or site is out of range,
                or ``site`` is given to a writer without sites or missing from one with them.
        """
        if self._closed:
            raise DatasetError("write() after close()")
        x = np.asarray(x)
        y = np.asarray(y).reshape(-1)
        if x.shape[1:] != self.sample_shape or len(x) != len(y):
            raise DatasetError(
                f"write() got x of shape {x.shape} and y of shape {y.shape}; expected "
                f"[n, {', '.join(map(str, self.sample_shape))}] and [n]"
            )
        if len(y) and y.min() < 0:
            raise DatasetError(
                f"labels must lie in 0..{self.num_classes - 1}, got {int((y < 0).sum())} "
                f"negative (down to {y.min()}); class labels count from 0, and no num_classes "
                "covers a negative one: map the labels to 0, 1, 2, ... first"
            )
        if len(y) and y.max() >= self.num_classes:
            raise DatasetError(
                f"labels must lie in 0..{self.num_classes - 1}, got labels up to {y.max()}; "
                f"set num_classes to {int(y.max()) + 1} or more to cover every label"
            )
        columns = {"x": x, "y": y}
        if (site is None) != (self.sites is None):
            raise DatasetError(
                "write() got site indices for a writer without sites" if site is not None
                else "write() needs each sample's site index: the writer was given sites"
            )
        if site is not None and self.sites is not None:
            site = np.asarray(site).reshape(-1)
            if len(site) != len(y):
                raise DatasetError(f"write() got {len(site)} site indices for {len(y)} samples")
            if len(site) and (site.min() < 0 or site.max() >= len(self.sites)):
                raise DatasetError(
                    f"site indices must lie in 0..{len(self.sites) - 1} (one per name of "
                    f"sites), got {site.min()}..{site.max()}"
                )
            columns["site"] = site.astype(np.int32, copy=False)
        start = 0
        while start < len(y):
            if self._file is None:
                self._file = self._open_shard()
            take = min(len(y) - start, self.shard_samples - self._fill)
            xs = x[start : start + take].astype(self.dtype, copy=False)
            ys = y[start : start + take].astype(self.label_dtype, copy=False)
            n0 = self._fill
            for key, col in columns.items():
                arr = {"x": xs, "y": ys}.get(key, col[start : start + take])
                d = self._file[key]
                d.resize(n0 + take, axis=0)
                d[n0 : n0 + take] = arr
            self._counts += np.bincount(ys.astype(np.int64), minlength=self.num_classes)
            if "site" in columns:
                self._site_counts += np.bincount(
                    columns["site"][start : start + take], minlength=len(self._site_counts)
                )
            self._fill += take
            start += take
            if self._fill == self.shard_samples:
                self._close_shard()

    def close(self) -> Manifest:
        """Finish the last shard, write the manifest and move the dataset into place.

        Returns:
            The manifest written.

        Raises:
            DatasetError: nothing was written.
        """
        if self._closed:
            raise DatasetError("close() called twice")
        self._close_shard()
        if not self._shards:
            self.abort()
            raise DatasetError(f"no samples were written to {self.path}; nothing to save")
        manifest = Manifest(
            name=self.name,
            split=self.split,
            sample_shape=self.sample_shape,
            dtype=self.dtype.name,
            label_dtype=self.label_dtype.name,
            num_classes=self.num_classes,
            chunk_samples=self.chunk_samples,
            compression=self.compression,
            shards=self._shards,
            meta=self.meta,
            sites=self.sites,
        )
        tmp_manifest = self._tmp / (MANIFEST_NAME + ".tmp")
        tmp_manifest.write_text(manifest.to_json() + "\n")
        os.replace(tmp_manifest, self._tmp / MANIFEST_NAME)
        old: Path | None = None
        if self.path.exists() or self.path.is_symlink():
            # Move the old dataset aside first: a directory cannot be renamed over a full one.
            old = Path(tempfile.mkdtemp(prefix=f".{self.path.name}.old-", dir=self.path.parent))
            os.replace(self.path, old / "data")
        # mkdtemp makes the directory private (0700); give it the usual permissions.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(self._tmp, 0o777 & ~umask)
        os.replace(self._tmp, self.path)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        self._closed = True
        self.manifest = manifest
        return manifest

    def abort(self) -> None:
        """Discard everything written; ``path`` is left as it was."""
        if self._file is not None:
            self._file.close()
            self._file = None
        shutil.rmtree(self._tmp, ignore_errors=True)
        self._closed = True


def write_dataset(
    path: str | os.PathLike[str],
    pieces: Iterable[tuple[np.ndarray, np.ndarray]],
    *,
    num_classes: int,
    **kwargs: Any,
) -> Manifest:
    """Write ``(x, y)`` pieces (arrays or a generator of them) as a sharded dataset.

    The sample shape and dtype come from the first piece unless given in ``kwargs``, which
    are passed to :class:`DatasetWriter` (``shard_samples``, ``compression``, ``force``...).

    Example:
        ``write_dataset("data/train", [(x, y)], num_classes=10)``

    Raises:
        DatasetError: see :class:`DatasetWriter`; also when ``pieces`` is empty.
    """
    it = iter(pieces)
    first = next(it, None)
    if first is None:
        raise DatasetError(f"write_dataset({path}) got no data")
    x0 = np.asarray(first[0])
    kwargs.setdefault("sample_shape", x0.shape[1:])
    kwargs.setdefault("dtype", x0.dtype)
    with DatasetWriter(path, num_classes=num_classes, **kwargs) as w:
        w.write(first[0], first[1])
        for x, y in it:
            w.write(x, y)
    assert w.manifest is not None
    return w.manifest
