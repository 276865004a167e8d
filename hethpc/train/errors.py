"""Errors raised by hethpc.train."""

from __future__ import annotations


class ConfigError(ValueError):
    """A setting is invalid, unknown, or differs between ranks.

    Attributes:
        key: the setting at fault, when there is one (so the caller can say where it was set).
    """

    def __init__(self, message: str, *, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


class ModelMismatchError(ValueError):
    """The ranks' models differ in parameter names, shapes or dtypes."""


class NonFiniteError(FloatingPointError):
    """A loss or gradient was NaN or Inf and the run is set to stop."""


class RunDirError(ConfigError):
    """The run directory holds someone else's files, or a run that would be replaced."""


class CheckpointError(RuntimeError):
    """No valid checkpoint could be read, or one could not be written."""
