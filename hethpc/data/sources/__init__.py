"""Readers of source formats for the converters; each yields pieces of samples, never writes.

Sources are opened read-only, and large arrays are read a piece at a time (``.npy`` through a
memory map), so converting never needs the whole dataset in memory. Source files come from the
internet, so nothing in them is trusted: pickles may name only the globals a CIFAR batch needs,
``.npy``/``.npz`` files are read without pickle, and IDX headers are checked against the file's
length before anything is allocated.
"""

from __future__ import annotations

from hethpc.data.errors import SourceError
from hethpc.data.sources.pieces import pieces_of

__all__ = ["SourceError", "pieces_of"]

# Not public: the readers the converters (hethpc-convert) call as ``sources.<reader>``.
from hethpc.data.sources.cifar import cifar_pieces, read_cifar  # noqa: F401
from hethpc.data.sources.idx import idx_pieces, read_idx, read_idx_pair  # noqa: F401
from hethpc.data.sources.npy import npy_pieces, npz_pieces, read_npy, read_npy_pair, read_npz  # noqa: F401
from hethpc.data.sources.pieces import PIECE, Pieces, holdout  # noqa: F401
from hethpc.data.sources.synthetic import synthetic_pieces  # noqa: F401
from hethpc.data.sources.text import holdout_files, read_corpus, text_pieces  # noqa: F401
