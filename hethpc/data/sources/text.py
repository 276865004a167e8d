"""Text files as byte windows for next-byte prediction: the files, their sites, a by-file split.

A *site* is where a file lives: the first folder under the directory it was found in (``email``
for ``email/mime/text.py``, ``asyncio``, ``json``), or, for a file directly in that directory,
its own name without the suffix (``argparse`` for ``argparse.py``), so that every module of a
library is a site of its own, however it is laid out. Files of the same site name found under
two directories belong to one site.

Bytes are the vocabulary (256 symbols, no decoding). A window is ``context + 1`` consecutive
bytes of one file, starting every ``stride`` bytes: its first ``context`` bytes are the input,
its last ``context`` bytes the targets (each input byte's next byte). A file shorter than one
window gives none.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hethpc.data.errors import SourceError
from hethpc.data.sources.pieces import PIECE

#: Folders never read: installed third-party packages and byte-code caches.
SKIPPED_DIRS = frozenset({"site-packages", "__pycache__"})
#: Folders of tests, read only with ``tests=True``.
TEST_DIRS = frozenset({"test", "tests", "idle_test"})
#: Bytes of a file looked at to call it binary (a NUL byte among them).
SNIFF_BYTES = 8192
VOCAB = 256


@dataclass
class TextCorpus:
    """The text files read from some directories.

    Attributes:
        files: each file's path relative to its directory, in the order read (sorted).
        texts: each file's bytes.
        site_of: each file's index into ``sites``, int64 ``[len(files)]``.
        sites: the site names, sorted.
        binary: files skipped because they look binary (a NUL byte in their first 8 KiB).
        unreadable: files skipped because they could not be read, as ``path: reason``.
    """

    files: list[str]
    texts: list[bytes]
    site_of: np.ndarray
    sites: list[str]
    binary: list[str] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)

    @property
    def num_bytes(self) -> int:
        """Bytes of text read."""
        return sum(len(t) for t in self.texts)


def site_name(relative: str) -> str:
    """The site of a file at ``relative`` (a path under the directory it was found in)."""
    parts = Path(relative).parts
    return parts[0] if len(parts) > 1 else Path(parts[0]).stem


def _walk(root: Path, suffixes: tuple[str, ...], tests: bool) -> Iterator[Path]:
    """Files under ``root`` ending in one of ``suffixes``, in sorted order."""
    for here, dirs, files in os.walk(root):
        dirs[:] = sorted(
            d for d in dirs
            if d not in SKIPPED_DIRS and not d.startswith(".") and (tests or d not in TEST_DIRS)
        )
        for name in sorted(files):
            if name.endswith(suffixes):
                yield Path(here) / name


def read_corpus(
    roots: Sequence[str | os.PathLike[str]], *, suffixes: Sequence[str] = (".py",),
    tests: bool = False,
) -> TextCorpus:
    """Every file under ``roots`` whose name ends in one of ``suffixes``, read as bytes.

    Folders in :data:`SKIPPED_DIRS` and hidden ones are never entered; folders of tests
    (:data:`TEST_DIRS`) only with ``tests``. A file with a NUL byte in its first 8 KiB is
    skipped as binary, and a file that cannot be read (a permission error) is skipped as
    unreadable; both are listed in the result, so a summary can count them.

    Raises:
        SourceError: a directory is missing or not a directory, or no file was read.
    """
    found: list[tuple[str, Path]] = []
    for root in roots:
        r = Path(root)
        if not r.is_dir():
            what = "does not exist" if not r.exists() else "is not a directory"
            raise SourceError(f"{root} {what}; expected a directory of text files")
        found += [(p.relative_to(r).as_posix(), p) for p in _walk(r, tuple(suffixes), tests)]
    files, texts, binary, unreadable = [], [], [], []
    for rel, p in found:
        try:
            data = p.read_bytes()
        except OSError as e:
            unreadable.append(f"{p}: {e.strerror or e}")
            continue
        if b"\0" in data[:SNIFF_BYTES]:
            binary.append(str(p))
            continue
        files.append(rel)
        texts.append(data)
    if not files:
        skipped = f" ({len(binary)} binary, {len(unreadable)} unreadable skipped)" if found else ""
        raise SourceError(
            f"no text file ending in {' or '.join(suffixes)} under {', '.join(map(str, roots))}"
            f"{skipped}; pass directories that hold some, or other suffixes (--suffix)"
        )
    names = [site_name(f) for f in files]
    sites = sorted(set(names))
    index = {s: i for i, s in enumerate(sites)}
    site_of = np.array([index[n] for n in names], dtype=np.int64)
    return TextCorpus(files, texts, site_of, sites, binary, unreadable)


def num_windows(length: int, *, context: int, stride: int) -> int:
    """Windows of ``context + 1`` bytes, one every ``stride`` bytes, in ``length`` bytes."""
    return 0 if length < context + 1 else (length - context - 1) // stride + 1


def windows(data: bytes, *, context: int, stride: int) -> np.ndarray:
    """The windows of ``data``: uint8 ``[k, context + 1]``, window ``i`` starting at byte
    ``i * stride``."""
    k = num_windows(len(data), context=context, stride=stride)
    if not k:
        return np.empty((0, context + 1), dtype=np.uint8)
    a = np.frombuffer(data, dtype=np.uint8)
    view = np.lib.stride_tricks.sliding_window_view(a, context + 1)
    return np.ascontiguousarray(view[: (k - 1) * stride + 1 : stride])


def holdout_files(
    counts: np.ndarray, *, fractions: Sequence[float], seed: int = 0
) -> np.ndarray:
    """Which split each file belongs to: 0 for training, ``j + 1`` for held-out split ``j``.

    Files with windows are taken in a ``default_rng(seed)`` order; held-out split ``j`` gets
    files from the front of that order until it holds ``fractions[j]`` of all windows (at least
    one file when the fraction is above 0), and training keeps the rest. Files without windows
    stay in training (they add nothing). A function of ``(counts, fractions, seed)`` alone.

    Args:
        counts: each file's number of windows, ``[n]``.
        fractions: each held-out split's share of the windows, each in ``[0, 1)``.
        seed: the split's seed.

    Returns:
        int64 ``[n]``.

    Raises:
        ValueError: a fraction is out of range.
    """
    counts = np.asarray(counts, dtype=np.int64)
    split = np.zeros(len(counts), dtype=np.int64)
    for f in fractions:
        if not (math.isfinite(f) and 0 <= f < 1):
            raise ValueError(f"a held-out fraction must be finite and in [0, 1), got {f}")
    order = np.random.default_rng(seed).permutation(len(counts))
    order = order[counts[order] > 0]
    total, at = int(counts.sum()), 0
    for j, f in enumerate(fractions):
        held = 0
        while f > 0 and at < len(order) and (held == 0 or held < f * total):
            split[order[at]] = j + 1
            held += int(counts[order[at]])
            at += 1
    return split


def text_pieces(
    corpus: TextCorpus, files: np.ndarray, *, context: int, stride: int, piece: int = PIECE
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """The windows of ``corpus.files[files]``, file by file, in pieces of about ``piece``.

    Yields:
        ``(x, y, site)``: windows uint8 ``[k, context + 1]``, their last bytes uint8 ``[k]``
        (the final position's target) and their files' site indices int64 ``[k]``.
    """
    xs: list[np.ndarray] = []
    sites: list[np.ndarray] = []
    held = 0
    for i in files.tolist():
        w = windows(corpus.texts[i], context=context, stride=stride)
        if not len(w):
            continue
        xs.append(w)
        sites.append(np.full(len(w), corpus.site_of[i], dtype=np.int64))
        held += len(w)
        if held >= piece:
            x = np.concatenate(xs)
            yield x, x[:, -1].copy(), np.concatenate(sites)
            xs, sites, held = [], [], 0
    if xs:
        x = np.concatenate(xs)
        yield x, x[:, -1].copy(), np.concatenate(sites)
