"""The HDF5 shard format: its manifest, the writer, the reader with its read paths and caches,
verification, and opening a dataset on many ranks at once (docs/datasets.md)."""
