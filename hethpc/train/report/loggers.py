"""Extra outputs beside the JSON-lines metrics: a CSV file and TensorBoard event files.

Both take rank 0's records when the metrics are flushed (epoch ends, checkpoints, every 1,000
records), so training steps never wait on them. The layouts are those Lightning users know: a
``metrics.csv`` with one row per record and a blank where a record has no value (as Lightning's
``CSVLogger``), and event files for ``tensorboard --logdir <run_dir>/tensorboard`` with the
tags ``train/...``, ``batch/rank<k>``, ``time/...``, ``test/...`` and ``val/...``.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import IO, Any, Protocol

# The CSV columns, in order: every field a step or epoch record may carry (others are ignored;
# the JSON lines keep everything).
CSV_COLUMNS = (
    "kind", "step", "epoch", "time", "loss", "acc", "batch", "lr", "compute_s", "sync_s",
    "synced", "skipped", "local_steps", "link_real_s", "link_wait_s", "test_acc", "test_mse",
    "val_acc", "val_mse", "test_bpb", "val_bpb", "train_time", "grad_norm",
)  # fmt: skip


class Sink(Protocol):
    """Takes the records a :class:`~hethpc.train.report.metrics.MetricsWriter` flushes."""

    def write_many(self, records: list[dict[str, Any]]) -> None: ...

    def close(self) -> None: ...


class CSVSink:
    """``<directory>/metrics.csv``: a header, then one row per record (appends on a resume)."""

    def __init__(self, directory: str | Path) -> None:
        self.path = Path(directory) / "metrics.csv"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        new = not self.path.exists() or self.path.stat().st_size == 0
        self._file: IO[str] | None = self.path.open("a", newline="")
        self._writer = csv.DictWriter(self._file, CSV_COLUMNS, extrasaction="ignore")
        if new:
            self._writer.writeheader()

    def write_many(self, records: list[dict[str, Any]]) -> None:
        if self._file is None:
            return
        self._writer.writerows(
            {k: ("" if v is None else v) for k, v in r.items() if k in CSV_COLUMNS}
            for r in records
        )
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class TensorBoardSink:
    """TensorBoard event files in ``directory`` (``torch.utils.tensorboard``), x axis: step.

    Step records that carry ``batch_sizes`` (rank 0's: every rank's batch) draw one
    ``batch/rank<k>`` line per rank.
    """

    STEP_TAGS = {"loss": "train/loss", "acc": "train/acc", "lr": "train/lr",
                 "compute_s": "time/compute_s", "sync_s": "time/sync_s",
                 "synced": "sync/synced", "link_wait_s": "time/link_wait_s",
                 "grad_norm": "train/grad_norm"}  # fmt: skip

    def __init__(self, directory: str | Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.directory = Path(directory)
        self._writer: Any = SummaryWriter(log_dir=str(self.directory))

    def write_many(self, records: list[dict[str, Any]]) -> None:
        if self._writer is None:
            return
        for r in records:
            step = r.get("step")
            if step is None:
                continue
            if r.get("kind") == "step":
                for key, tag in self.STEP_TAGS.items():
                    if isinstance(r.get(key), (int, float)):
                        self._writer.add_scalar(tag, float(r[key]), step)
                for k, b in enumerate(r.get("batch_sizes") or [r.get("batch")]):
                    if isinstance(b, (int, float)):
                        self._writer.add_scalar(f"batch/rank{k}", b, step)
            elif r.get("kind") == "epoch":
                for key, value in r.items():
                    split, _, name = key.partition("_")
                    if split in ("test", "val") and name and isinstance(value, (int, float)):
                        self._writer.add_scalar(f"{split}/{name}", float(value), step)
        self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def make_sinks(run_dir: Path, *, csv_log: bool, tensorboard: bool) -> list[Sink]:
    """The sinks a run asked for (rank 0 calls it)."""
    sinks: list[Sink] = []
    if csv_log:
        sinks.append(CSVSink(run_dir / "csv"))
    if tensorboard:
        sinks.append(TensorBoardSink(run_dir / "tensorboard"))
    return sinks
