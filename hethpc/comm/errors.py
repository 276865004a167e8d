"""Errors raised by hethpc.comm."""

from __future__ import annotations


class CommError(RuntimeError):
    """MPI or Horovod cannot do what was asked (wrong launch, missing support, bad peer)."""


class LinkError(ValueError):
    """A link setting cannot be read."""
