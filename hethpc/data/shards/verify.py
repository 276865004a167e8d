"""Verification of HDF5-sharded datasets: file hashes, shard files present, shard contents."""

from __future__ import annotations

import hashlib
import mmap
import os
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from hethpc.data.errors import ShardError
from hethpc.data.shards.manifest import MANIFEST_NAME, Manifest, ShardInfo, shard_path

SHARD_SUFFIXES = (".h5", ".hdf5")


def sha256_file(path: str | os.PathLike[str], *, block: int = 1 << 22) -> str:
    """Hex sha256 digest of a file, read in blocks through a read-only memory map.

    The map is advised ``MADV_HUGEPAGE`` where the platform has it, so the pages this reads
    into the page cache come in 2 MiB folios, not readahead's ramp of small ones over each
    file's first window (40 MiB with 8 MiB readahead): a dataset's shards are read first by
    this check, and the mapped gathers of :class:`~hethpc.data.ShardedDataset` then take one
    page fault per 2 MiB of them (``benchmarks/NOTES.md``). Files that cannot be mapped are
    read with ``read``.
    """
    h = hashlib.sha256()
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        try:
            m = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) if size else None
        except (OSError, ValueError):
            m = None
        if m is None:
            while chunk := f.read(block):
                h.update(chunk)
            return h.hexdigest()
        with m:
            if hasattr(mmap, "MADV_HUGEPAGE"):
                m.madvise(mmap.MADV_HUGEPAGE)
            with memoryview(m) as view:
                for a in range(0, size, block):
                    h.update(view[a : a + block])
    return h.hexdigest()


def hash_problems(root: Path, manifest: Manifest, shards: list[int]) -> list[str]:
    """A message for each of the shards (indices into ``manifest.shards``) whose file's sha256
    differs from the manifest's."""
    problems = []
    for i in shards:
        s = manifest.shards[i]
        p = shard_path(root, s.file)
        if sha256_file(p) != s.sha256:
            problems.append(
                f"shard {p} fails its sha256 checksum (corrupt or modified; restore it or "
                "convert the dataset again)"
            )
    return problems


def file_problems(root: Path, manifest: Manifest) -> list[str]:
    """A message for each missing, extra or wrongly sized shard file of the dataset at ``root``
    (cheap: no byte is read)."""
    problems = []
    listed = {s.file for s in manifest.shards}
    for s in manifest.shards:
        p = shard_path(root, s.file)
        if not p.is_file():
            problems.append(f"missing shard file {p} (restore it or convert the dataset again)")
        elif p.stat().st_size != s.num_bytes:
            problems.append(
                f"shard {p} is {p.stat().st_size} bytes, the manifest says {s.num_bytes} "
                "(truncated or replaced; restore it or convert the dataset again)"
            )
    for p in sorted(root.iterdir()):
        if p.suffix in SHARD_SUFFIXES and p.name not in listed:
            problems.append(
                f"extra shard file {p} is not in {MANIFEST_NAME} (remove it, or convert again "
                "so that the manifest lists it)"
            )
    return problems


def check_shard(p: Path, s: ShardInfo, m: Manifest, locking: bool | None) -> np.ndarray:
    """The labels of shard file ``p``, after checking its datasets' shapes and dtypes and its
    label histogram against the manifest (``locking``: see :func:`~hethpc.data.open_dataset`).

    Raises:
        ShardError: the file is unreadable or disagrees with the manifest.
    """
    kw: dict[str, Any] = {} if locking is None else {"locking": locking}
    try:
        with h5py.File(p, "r", **kw) as f:
            if "x" not in f or "y" not in f:
                raise ShardError(f"shard {p} lacks dataset 'x' or 'y'; convert the data again")
            x, y = f["x"], f["y"]
            want = (s.num_samples, *m.sample_shape)
            if x.shape != want or y.shape != (s.num_samples,):
                raise ShardError(
                    f"shard {p} holds x{x.shape}, y{y.shape}; the manifest says x{want}, "
                    f"y({s.num_samples},); shards disagree: convert the dataset again"
                )
            if x.dtype != np.dtype(m.dtype) or y.dtype != np.dtype(m.label_dtype):
                raise ShardError(
                    f"shard {p} has dtypes x {x.dtype}, y {y.dtype}; the manifest says "
                    f"{m.dtype}, {m.label_dtype}; convert the dataset again"
                )
            labels = y[:].astype(np.int64)
            if m.sites is not None:
                check_sites(p, f, s, len(m.sites))
    except OSError as e:
        raise ShardError(f"shard {p} is not a readable HDF5 file ({e}); restore it") from e
    if len(labels) and (labels.min() < 0 or labels.max() >= m.num_classes):
        raise ShardError(f"shard {p} has labels outside 0..{m.num_classes - 1}")
    hist = np.bincount(labels, minlength=m.num_classes).tolist()
    if hist != list(s.label_counts):
        raise ShardError(f"shard {p}: label histogram {hist} differs from the manifest's")
    return labels


def check_sites(p: Path, f: h5py.File, s: ShardInfo, num_sites: int) -> np.ndarray:
    """The ``site`` column of shard ``p`` (open as ``f``), after checking its shape, range and
    histogram against the manifest's ``num_sites`` names and the shard's ``site_counts``.

    Raises:
        ShardError: the column is missing or disagrees with the manifest.
    """
    if "site" not in f or f["site"].shape != (s.num_samples,) or f["site"].dtype.kind not in "iu":
        raise ShardError(
            f"shard {p} lacks an integer 'site' column of {s.num_samples} rows, which its "
            "manifest's sites promise; convert the data again"
        )
    sites = f["site"][:].astype(np.int64)
    if len(sites) and (sites.min() < 0 or sites.max() >= num_sites):
        raise ShardError(f"shard {p} has site indices outside 0..{num_sites - 1}")
    if np.bincount(sites, minlength=num_sites).tolist() != list(s.site_counts or ()):
        raise ShardError(f"shard {p}: site histogram differs from the manifest's site_counts")
    return sites


def check_dataset(
    root: Path, manifest: Manifest, *, hashes: bool, locking: bool | None
) -> np.ndarray:
    """Every label of the dataset at ``root``, after :func:`file_problems`, each shard's
    :func:`check_shard` and, with ``hashes``, its sha256 (:func:`hash_problems`).

    Raises:
        ShardError: naming every damaged file.
    """
    problems = file_problems(root, manifest)
    labels: list[np.ndarray] = []
    if not problems:
        for i, s in enumerate(manifest.shards):
            p = shard_path(root, s.file)
            bad = hash_problems(root, manifest, [i]) if hashes else []
            if bad:
                problems += bad
                continue
            try:
                labels.append(check_shard(p, s, manifest, locking))
            except ShardError as e:
                problems.append(str(e))
    if problems:
        raise ShardError(f"dataset {root} is damaged:\n  " + "\n  ".join(problems))
    return np.concatenate(labels)
