"""Errors raised by hethpc.data: each names the file, rank or setting at fault and the fix."""

from __future__ import annotations


class DatasetError(ValueError):
    """A dataset directory or manifest is missing, malformed or inconsistent."""


class ShardError(DatasetError):
    """One shard file is missing, truncated, corrupt or disagrees with the manifest."""


class PartitionError(ValueError):
    """A partition cannot be made as asked (a rank would get no samples, too few retries...)."""


class LoaderError(ValueError):
    """The loader was asked for something its data cannot give (a batch larger than a partition)."""


class SourceError(DatasetError):
    """A source file is missing a part, malformed, truncated or not of the format asked for."""
