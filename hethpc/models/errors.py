"""Errors raised by hethpc.models."""

from __future__ import annotations


class ImportSpecError(ValueError):
    """An import path (``module:name``) does not name something that can be loaded."""


class ModelError(ValueError):
    """A user's model factory failed or returned something that is not a model."""
