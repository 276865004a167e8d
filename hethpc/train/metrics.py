"""Per-rank metrics as JSON lines: one object per step, epoch or event."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import IO, Any


def _clean(value: Any) -> Any:
    # JSON has no NaN/Inf; write them as null so every reader can parse the file.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class MetricsWriter:
    """Appends records to ``<run_dir>/metrics/rank<k>.jsonl`` (append: a resumed run continues it).

    Args:
        run_dir: the run directory.
        rank: this process's rank (names the file).
    """

    def __init__(self, run_dir: str | os.PathLike[str], rank: int) -> None:
        self.path = Path(run_dir) / "metrics" / f"rank{rank}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] | None = self.path.open("a", buffering=1)

    def write(self, kind: str, **fields: Any) -> None:
        """Write one record ``{"kind": kind, **fields}``."""
        if self._file is None:
            raise ValueError(f"{self.path} is closed")
        record = {"kind": kind, **{k: _clean(v) for k, v in fields.items()}}
        self._file.write(json.dumps(record) + "\n")

    def close(self) -> None:
        """Flush and close the file."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_metrics(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """All records of one JSON-lines file; a torn last line (a killed writer) is ignored."""
    records = []
    with Path(path).open() as f:
        for line in f:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return records
