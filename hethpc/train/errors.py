"""Errors raised by hethpc.train."""

from __future__ import annotations

from pathlib import Path


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


class TrainingInterrupted(KeyboardInterrupt):
    """The training loop was stopped by a signal (Ctrl-C, SIGTERM), as this rank saw it.

    Everything here is known on this rank alone: a stopped rank starts no collective to learn
    more, since its peers may never join it.

    Attributes:
        signal: what stopped it (``"SIGINT"``, ``"SIGTERM"``).
        step: the steps this rank had completed.
        total: the run's steps.
        checkpoint: the latest complete checkpoint this rank wrote or resumed from, or None.
        run_dir: the run directory (``--resume`` continues there).
    """

    def __init__(
        self, signal: str, *, step: int, total: int, checkpoint: Path | None, run_dir: Path
    ) -> None:
        kept = f"checkpoint kept: {checkpoint}" if checkpoint is not None else "no checkpoint"
        super().__init__(f"{signal} after step {step} of {total}; {kept}")
        self.signal, self.step, self.total = signal, step, total
        self.checkpoint, self.run_dir = checkpoint, run_dir
