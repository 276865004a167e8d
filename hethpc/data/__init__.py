"""Data: built-in data sets, HDF5 shards, partitioners, loaders, rebalancing and injection."""

from __future__ import annotations

from hethpc.data import sources
from hethpc.data.adapt import as_dataset, from_arrays, from_torch
from hethpc.data.balance import Rebalancer, proportional_shares, transfer_plan
from hethpc.data.errors import DatasetError, LoaderError, PartitionError, ShardError
from hethpc.data.holdout import holdout, holdout_indices
from hethpc.data.injection import Injector, local_batch_size, senders, share_size
from hethpc.data.loader import Loader
from hethpc.data.manifest import Manifest, ShardInfo
from hethpc.data.mnist1d import ArrayDataset, load_mnist1d
from hethpc.data.order import block_shuffle, block_shuffle_windows, rotate_chunks, segment_bounds
from hethpc.data.partition import (
    PARTITIONERS,
    DirichletPartitioner,
    IIDPartitioner,
    LabelSkewPartitioner,
    Partitioner,
    SelDPPartitioner,
    SitePartitioner,
    make_partitioner,
)
from hethpc.data.sharded import ShardedDataset, open_dataset
from hethpc.data.shared import open_dataset_shared, split_shards
from hethpc.data.sources import SourceError
from hethpc.data.transform import to_inputs, to_targets
from hethpc.data.verify import sha256_file
from hethpc.data.writer import DatasetWriter, write_dataset

__all__ = [
    "PARTITIONERS",
    "ArrayDataset",
    "DatasetError",
    "DatasetWriter",
    "DirichletPartitioner",
    "IIDPartitioner",
    "Injector",
    "LabelSkewPartitioner",
    "Loader",
    "LoaderError",
    "Manifest",
    "PartitionError",
    "Partitioner",
    "Rebalancer",
    "SelDPPartitioner",
    "ShardError",
    "ShardInfo",
    "ShardedDataset",
    "SitePartitioner",
    "SourceError",
    "as_dataset",
    "block_shuffle",
    "block_shuffle_windows",
    "from_arrays",
    "from_torch",
    "holdout",
    "holdout_indices",
    "load_mnist1d",
    "local_batch_size",
    "make_partitioner",
    "open_dataset",
    "open_dataset_shared",
    "proportional_shares",
    "rotate_chunks",
    "segment_bounds",
    "split_shards",
    "senders",
    "share_size",
    "sources",
    "sha256_file",
    "to_inputs",
    "to_targets",
    "transfer_plan",
    "write_dataset",
]
