"""Data: built-in data sets, HDF5 shards, partitioners, loaders, rebalancing and injection.

What users call is exported here; the rest (manifests, shard readers, orderings, rebalancing,
transforms) is imported from its module, e.g. :mod:`hethpc.data.balance`.
"""

from __future__ import annotations

from hethpc.data.adapt import as_dataset
from hethpc.data.arrays import ArrayDataset
from hethpc.data.errors import DatasetError, LoaderError, PartitionError, ShardError
from hethpc.data.injection import Injector
from hethpc.data.loader import Loader
from hethpc.data.mnist1d import load_mnist1d
from hethpc.data.partition import make_partitioner
from hethpc.data.shards.sharded import ShardedDataset, open_dataset
from hethpc.data.shards.writer import write_dataset

__all__ = [
    "ArrayDataset",
    "DatasetError",
    "Injector",
    "Loader",
    "LoaderError",
    "PartitionError",
    "ShardError",
    "ShardedDataset",
    "as_dataset",
    "load_mnist1d",
    "make_partitioner",
    "open_dataset",
    "write_dataset",
]

# Not public: the commands (hethpc-convert, hethpc-inspect) import these from here.
from hethpc.data.shards.manifest import Manifest  # noqa: F401
from hethpc.data.shards.writer import DatasetWriter  # noqa: F401
