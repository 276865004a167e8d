"""The shard format's ``manifest.json``: a typed, validated view of it, and safe shard paths."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hethpc.data.errors import DatasetError

FORMAT = "hethpc-shards"
FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"


@dataclass(frozen=True)
class ShardInfo:
    """One HDF5 shard file, as recorded in the manifest.

    Attributes:
        file: file name relative to the dataset directory (no directories, no ``..``).
        num_samples: rows of ``x`` and ``y``.
        label_counts: histogram of ``y``, one count per class.
        sha256: hex digest of the whole file.
        num_bytes: file size in bytes (a truncated file is caught without hashing).
        site_counts: histogram of the ``site`` column, one count per name of
            :attr:`Manifest.sites`; None in a dataset without sites.
    """

    file: str
    num_samples: int
    label_counts: list[int]
    sha256: str
    num_bytes: int
    site_counts: list[int] | None = None


@dataclass(frozen=True)
class Manifest:
    """The dataset directory's description (``manifest.json``).

    Attributes:
        name: dataset name (free text).
        split: which split this directory holds (``train``, ``test``, ...).
        sample_shape: shape of one sample of ``x``.
        dtype: numpy dtype name of ``x``.
        label_dtype: numpy dtype name of ``y``.
        num_classes: labels are ``0 .. num_classes - 1``.
        chunk_samples: samples per HDF5 chunk of ``x`` and ``y``.
        compression: ``None``, ``"gzip"`` or ``"lzf"``.
        shards: the shard files, in sample order.
        format: always ``"hethpc-shards"``.
        version: format version (1).
        meta: free-form provenance (source, converter arguments).
        sites: names of the sites (where each sample comes from: a text window's package or
            module) that the shards' ``site`` column indexes; None: the shards have no
            ``site`` column. Left out of the JSON when None, as in manifests before it.
    """

    name: str
    split: str
    sample_shape: tuple[int, ...]
    dtype: str
    label_dtype: str
    num_classes: int
    chunk_samples: int
    compression: str | None
    shards: list[ShardInfo]
    format: str = FORMAT
    version: int = FORMAT_VERSION
    meta: dict[str, Any] = field(default_factory=dict)
    sites: list[str] | None = None

    @property
    def num_samples(self) -> int:
        """Samples in all shards."""
        return sum(s.num_samples for s in self.shards)

    def to_json(self) -> str:
        """The manifest as indented JSON text."""
        d = asdict(self)
        d["sample_shape"] = list(self.sample_shape)
        if self.sites is None:
            del d["sites"]
            for s in d["shards"]:
                s.pop("site_counts", None)
        return json.dumps(d, indent=1)

    @classmethod
    def from_json(cls, text: str, *, where: str = MANIFEST_NAME) -> Manifest:
        """Parse and validate manifest text.

        Raises:
            DatasetError: not JSON, wrong format or version, missing or ill-typed fields.
        """
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise DatasetError(f"{where} is not valid JSON ({e}); rewrite the dataset") from e
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise DatasetError(f"{where} is not a {FORMAT} manifest (format field missing/wrong)")
        if d.get("version") != FORMAT_VERSION:
            raise DatasetError(
                f"{where} has format version {d.get('version')}, this hethpc reads version "
                f"{FORMAT_VERSION}; convert the data again with data_tools/convert.py"
            )
        try:
            shards = [ShardInfo(**s) for s in d["shards"]]
            sites = d.get("sites")
            if sites is not None and not isinstance(sites, list):
                raise TypeError(f"sites is a {type(sites).__name__}, not a list of names")
            m = cls(
                name=str(d["name"]),
                split=str(d["split"]),
                sample_shape=tuple(int(v) for v in d["sample_shape"]),
                dtype=str(d["dtype"]),
                label_dtype=str(d["label_dtype"]),
                num_classes=int(d["num_classes"]),
                chunk_samples=int(d["chunk_samples"]),
                compression=d["compression"],
                shards=shards,
                meta=dict(d.get("meta", {})),
                sites=sites,
            )
        except (KeyError, TypeError, ValueError) as e:
            raise DatasetError(
                f"{where} is missing or has a malformed field: {e!r}; convert the dataset again"
            ) from e
        _check_fields(m, where)
        if not m.shards:
            raise DatasetError(f"{where} lists no shards")
        names = [s.file for s in m.shards]
        if len(set(names)) != len(names):
            raise DatasetError(f"{where} lists a shard file twice: {names}")
        for s in m.shards:
            if len(s.label_counts) != m.num_classes or sum(s.label_counts) != s.num_samples:
                raise DatasetError(
                    f"{where}: shard {s.file} has a label histogram that does not match its "
                    f"{s.num_samples} samples and {m.num_classes} classes; restore the manifest "
                    "or convert the dataset again"
                )
        _check_sites(m, where)
        return m


def _check_sites(m: Manifest, where: str) -> None:
    """Refuse site names and per-shard site histograms that do not fit together."""
    if m.sites is None:
        return
    names = m.sites
    if not all(isinstance(v, str) and v for v in names) or len(set(names)) != len(names):
        raise DatasetError(
            f"{where}: sites = {names!r}: expected distinct non-empty names; restore the "
            "manifest or convert the dataset again"
        )
    for s in m.shards:
        counts = s.site_counts
        if (
            not isinstance(counts, list)
            or len(counts) != len(names)
            or not all(isinstance(c, int) and c >= 0 for c in counts)
            or sum(counts) != s.num_samples
        ):
            raise DatasetError(
                f"{where}: shard {s.file} has site_counts {counts!r}, which do not match its "
                f"{s.num_samples} samples and {len(names)} sites; restore the manifest or "
                "convert the dataset again"
            )


def _check_fields(m: Manifest, where: str) -> None:
    """Refuse field values that parse but cannot describe a dataset (a hand-edited manifest)."""

    def bad(field: str, value: object, expected: str) -> DatasetError:
        return DatasetError(
            f"{where}: {field} = {value!r}: expected {expected}; restore the manifest or "
            "convert the dataset again"
        )

    for name in ("dtype", "label_dtype"):
        value = getattr(m, name)
        try:
            dt = np.dtype(value)
        except TypeError:
            raise bad(name, value, "a numpy dtype name such as 'float32'") from None
        if dt.kind not in "biufc":
            raise bad(name, value, "a numeric numpy dtype name such as 'float32'")
    if np.dtype(m.label_dtype).kind not in "iu":
        raise bad("label_dtype", m.label_dtype, "an integer dtype name such as 'int64'")
    if any(v < 1 for v in m.sample_shape):
        raise bad("sample_shape", list(m.sample_shape), "positive sizes")
    if m.num_classes < 1:
        raise bad("num_classes", m.num_classes, "an integer >= 1")
    if m.chunk_samples < 1:
        raise bad("chunk_samples", m.chunk_samples, "an integer >= 1")
    if m.compression not in (None, "gzip", "lzf"):
        raise bad("compression", m.compression, "null, 'gzip' or 'lzf'")
    for s in m.shards:
        if not isinstance(s.num_samples, int) or s.num_samples < 0:
            raise bad(f"shard {s.file!r} num_samples", s.num_samples, "an integer >= 0")
        if not isinstance(s.num_bytes, int) or s.num_bytes < 1:
            raise bad(f"shard {s.file!r} num_bytes", s.num_bytes, "an integer >= 1")
        counts = s.label_counts
        if not isinstance(counts, list) or not all(isinstance(c, int) and c >= 0 for c in counts):
            raise bad(f"shard {s.file!r} label_counts", counts, "a list of counts >= 0")


def shard_path(root: Path, file: str) -> Path:
    """The path of shard ``file`` inside dataset directory ``root``, refusing any escape.

    Raises:
        DatasetError: ``file`` is absolute, has a directory part or ``..``, or is a symlink
            that resolves outside ``root``.
    """
    if (
        not file
        or os.path.isabs(file)
        or Path(file).name != file
        or file in (".", "..")
        or "\\" in file
    ):
        raise DatasetError(
            f"manifest in {root} names shard {file!r}, which is not a plain file name inside the "
            "dataset directory; shards must live directly in it (no paths, no '..')"
        )
    p = root / file
    real_root = root.resolve()
    if p.resolve().parent != real_root:
        raise DatasetError(
            f"shard {file!r} in {root} resolves to {p.resolve()}, outside the dataset directory "
            "(a symlink out); copy the file into the directory instead"
        )
    return p
