"""Checkpoints: atomic writes, sha256 sidecars, keep the last K, fall back past corrupt ones."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import re
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hethpc.train.errors import CheckpointError

_NAME = re.compile(r"^ckpt-(\d{9})\.pt$")


class CheckpointWarning(UserWarning):
    """A checkpoint on disk is corrupt or incomplete and was skipped."""


def encode(obj: Any) -> Any:
    """Make ``obj`` loadable with ``torch.load(weights_only=True)``.

    numpy arrays become ``{"__ndarray__": tensor}`` (object arrays are refused), numpy scalars
    become Python numbers, tuples stay tuples; everything else must already be plain.
    """
    if isinstance(obj, np.ndarray):
        if obj.dtype == object:
            raise CheckpointError("checkpoints cannot hold numpy object arrays")
        return {"__ndarray__": torch.from_numpy(np.ascontiguousarray(obj).copy())}
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, dict):
        return {k: encode(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [encode(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(encode(v) for v in obj)
    return obj


def decode(obj: Any) -> Any:
    """Inverse of :func:`encode`."""
    if isinstance(obj, dict):
        if set(obj) == {"__ndarray__"}:
            return obj["__ndarray__"].numpy()
        return {k: decode(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [decode(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(decode(v) for v in obj)
    return obj


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class CheckpointManager:
    """The checkpoints of one run directory: ``ckpt-<step>.pt`` plus ``ckpt-<step>.pt.sha256``.

    Only one process (rank 0) should call :meth:`save`. A file is complete only once its
    sidecar exists: the data is written and fsynced under a temporary name, renamed, and then
    the sidecar is written the same way, so a crash at any point leaves either the previous
    checkpoint or a complete new one.

    Args:
        directory: where checkpoints live (created on first save).
        keep: how many of the newest checkpoints to keep.
    """

    def __init__(self, directory: str | os.PathLike[str], *, keep: int = 3) -> None:
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        self.directory = Path(directory)
        self.keep = keep

    def path(self, step: int) -> Path:
        """Where the checkpoint of ``step`` lives."""
        return self.directory / f"ckpt-{step:09d}.pt"

    def steps(self) -> list[int]:
        """Steps of the checkpoint files present (complete or not), oldest first."""
        if not self.directory.is_dir():
            return []
        found = (_NAME.match(p.name) for p in self.directory.iterdir())
        return sorted(int(m.group(1)) for m in found if m)

    def save(self, state: dict[str, Any], step: int) -> Path:
        """Write ``state`` as checkpoint ``step``, then delete all but the newest ``keep``."""
        self.directory.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        torch.save(encode(state), buf)
        data = buf.getvalue()
        path = self.path(step)
        _write_atomic(path, data)
        _write_atomic(
            path.with_name(path.name + ".sha256"),
            f"{hashlib.sha256(data).hexdigest()}  {path.name}\n".encode(),
        )
        _fsync_dir(self.directory)
        for old in self.steps()[: -self.keep]:
            p = self.path(old)
            p.with_name(p.name + ".sha256").unlink(missing_ok=True)
            p.unlink(missing_ok=True)
        return path

    def read(self, step: int) -> dict[str, Any]:
        """Load and verify the checkpoint of ``step``; never runs code from the file.

        Raises:
            CheckpointError: the file or its sidecar is missing, or the sha256 does not match,
                or the file cannot be unpickled with ``weights_only=True``.
        """
        path = self.path(step)
        side = path.with_name(path.name + ".sha256")
        try:
            data = path.read_bytes()
            expected = side.read_text().split()[0]
        except (OSError, IndexError) as e:
            raise CheckpointError(f"{path}: missing file or sha256 sidecar ({e})") from e
        got = hashlib.sha256(data).hexdigest()
        if got != expected:
            raise CheckpointError(
                f"{path}: sha256 {got[:12]}... does not match {side.name} ({expected[:12]}...)"
            )
        try:
            state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 - any unpickling failure means an unusable file
            raise CheckpointError(f"{path}: cannot be loaded safely: {e}") from e
        return decode(state)

    def _set_aside(self, step: int) -> None:
        """Rename a checkpoint that failed to verify (and its sidecar) to ``*.corrupt``."""
        path = self.path(step)
        for p in (path, path.with_name(path.name + ".sha256")):
            with contextlib.suppress(OSError):  # missing, or a read-only directory: left as is
                p.rename(p.with_name(p.name + ".corrupt"))
        warnings.warn(
            f"{path.name} set aside as {path.name}.corrupt (resuming from an older checkpoint)",
            CheckpointWarning,
            stacklevel=3,
        )

    def load_latest(self) -> tuple[int, dict[str, Any]] | None:
        """The newest checkpoint that verifies, as ``(step, state)``; None if there is none.

        Corrupt or incomplete checkpoints are skipped with a :class:`CheckpointWarning`; when
        an older one verifies, the skipped ones are renamed ``*.corrupt`` (kept for a look,
        no longer counted by ``keep``, so they cannot push a valid checkpoint out).

        Raises:
            CheckpointError: checkpoint files exist but none of them verifies.
        """
        steps = self.steps()
        errors: list[str] = []
        skipped: list[int] = []
        for step in reversed(steps):
            try:
                state = self.read(step)
            except CheckpointError as e:
                errors.append(str(e))
                skipped.append(step)
                warnings.warn(
                    f"skipping checkpoint: {e}; trying the previous one",
                    CheckpointWarning,
                    stacklevel=2,
                )
                continue
            for bad in skipped:
                self._set_aside(bad)
            return step, state
        if steps:
            raise CheckpointError(
                f"no valid checkpoint in {self.directory}: "
                + "; ".join(errors)
                + ". Start afresh without --resume, or restore a checkpoint from a backup."
            )
        return None
