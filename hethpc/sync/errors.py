"""Errors raised by hethpc.sync."""

from __future__ import annotations


class SyncError(ValueError):
    """The ranks disagree on a sync setting (weights, policy), or a setting is invalid."""
