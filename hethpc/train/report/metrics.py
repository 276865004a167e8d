"""Per-rank metrics as JSON lines: one object per step, epoch or event."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import IO, Any

import torch

from hethpc import comm
from hethpc.train.report.loggers import Sink, make_sinks


def _clean(value: Any) -> Any:
    if isinstance(value, torch.Tensor):  # kept as a tensor until written: no per-step host sync
        value = value.item()
    # JSON has no NaN/Inf; write them as null so every reader can parse the file.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class MetricsWriter:
    """Appends records to ``<run_dir>/metrics/rank<k>.jsonl`` (append: a resumed run continues it).

    Records are buffered in memory and written by :meth:`flush` (the loop flushes at epoch ends
    and checkpoints), by :meth:`close`, or when ``buffer`` records are waiting: a training step
    only appends to a list. Tensor values are converted to numbers when written.

    Args:
        run_dir: the run directory.
        rank: this process's rank (names the file).
        buffer: records held before an automatic flush.
        sinks: more outputs (CSV, TensorBoard: :mod:`hethpc.train.report.loggers`) that get the same
            records at every flush.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        rank: int,
        *,
        buffer: int = 1000,
        sinks: list[Sink] | None = None,
    ) -> None:
        self.path = Path(run_dir) / "metrics" / f"rank{rank}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] | None = self.path.open("a")
        self._buffer = max(1, int(buffer))
        self._pending: list[dict[str, Any]] = []
        self.sinks = list(sinks or [])

    def write(self, kind: str, **fields: Any) -> None:
        """Queue one record ``{"kind": kind, **fields}``."""
        if self._file is None:
            raise ValueError(f"{self.path} is closed")
        self._pending.append({"kind": kind, **fields})
        if len(self._pending) >= self._buffer:
            self.flush()

    def flush(self) -> None:
        """Write the queued records and flush the file."""
        if self._file is None or not self._pending:
            return
        records = [{k: _clean(v) for k, v in r.items()} for r in self._pending]
        self._pending.clear()
        self._file.write("\n".join(json.dumps(r) for r in records) + "\n")
        self._file.flush()
        for sink in self.sinks:
            sink.write_many(records)

    def close(self) -> None:
        """Write what is queued and close the file."""
        if self._file is not None:
            self.flush()
            self._file.close()
            self._file = None
            for sink in self.sinks:
                sink.close()

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


def open_run(
    run_dir: Path, config: dict[str, Any], *, csv_log: bool = False, tensorboard: bool = False
) -> MetricsWriter:
    """Start a run on every rank: rank 0 writes ``config.json``; returns this rank's writer.

    Rank 0's writer also feeds ``<run_dir>/csv/metrics.csv`` and ``<run_dir>/tensorboard/``
    when asked. A collective (a barrier), so no rank writes metrics into a directory not yet
    made.
    """
    sinks: list[Sink] = []
    if comm.rank() == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        sinks = make_sinks(run_dir, csv_log=csv_log, tensorboard=tensorboard)
    comm.barrier()
    return MetricsWriter(run_dir, comm.rank(), sinks=sinks)
