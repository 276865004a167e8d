"""The training loop and what keeps it safe: config checks, checkpoints, metrics, guards."""

from __future__ import annotations

from hethpc.train.coordinator import Coordinator
from hethpc.train.errors import ModelMismatchError, NonFiniteError, TrainingInterrupted
from hethpc.train.evaluation import accuracy, evaluate
from hethpc.train.fit import fit
from hethpc.train.keep.checkpoint import CheckpointError, CheckpointManager, CheckpointWarning
from hethpc.train.keep.rng import get_rng_state, seed_rank, set_rng_state
from hethpc.train.keep.rundir import RunDirError, is_run_dir, next_run_dir
from hethpc.train.losses import LOSSES, make_loss
from hethpc.train.parts.device import pick_device, this_device
from hethpc.train.report.metrics import MetricsWriter, read_metrics
from hethpc.train.report.summary import format_summary, time_to_target
from hethpc.train.run.loop import RunResult, train
from hethpc.train.settings.compare import check_same_config, resume_differences
from hethpc.train.settings.config import (
    ConfigError,
    TrainConfig,
    config_fields,
    config_sections,
    config_tables,
)
from hethpc.train.settings.doc import settings_markdown
from hethpc.train.settings.sources import load_toml, make_config, toml_sources
from hethpc.train.watch.faults import Fault
from hethpc.train.watch.guards import (
    check_same_model,
    local_nonfinite,
    model_signature,
    nonfinite_ranks,
)
from hethpc.train.watch.watchdog import Watchdog

__all__ = [
    "LOSSES",
    "CheckpointError",
    "CheckpointManager",
    "CheckpointWarning",
    "ConfigError",
    "Coordinator",
    "RunDirError",
    "Fault",
    "MetricsWriter",
    "ModelMismatchError",
    "NonFiniteError",
    "RunResult",
    "TrainConfig",
    "TrainingInterrupted",
    "Watchdog",
    "check_same_config",
    "check_same_model",
    "config_fields",
    "config_sections",
    "config_tables",
    "accuracy",
    "evaluate",
    "fit",
    "format_summary",
    "get_rng_state",
    "is_run_dir",
    "load_toml",
    "make_config",
    "make_loss",
    "next_run_dir",
    "pick_device",
    "resume_differences",
    "settings_markdown",
    "toml_sources",
    "local_nonfinite",
    "model_signature",
    "nonfinite_ranks",
    "read_metrics",
    "seed_rank",
    "set_rng_state",
    "this_device",
    "time_to_target",
    "train",
]
