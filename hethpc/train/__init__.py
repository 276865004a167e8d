"""The training loop and what keeps it safe: config checks, checkpoints, metrics, guards."""

from __future__ import annotations

from hethpc.train.checkpoint import CheckpointError, CheckpointManager, CheckpointWarning
from hethpc.train.config import (
    ConfigError,
    TrainConfig,
    config_fields,
    config_sections,
    config_tables,
)
from hethpc.train.config_compare import check_same_config, resume_differences
from hethpc.train.config_doc import settings_markdown
from hethpc.train.config_sources import load_toml, make_config, toml_sources
from hethpc.train.coordinator import Coordinator
from hethpc.train.device import pick_device, this_device
from hethpc.train.errors import ModelMismatchError, NonFiniteError, TrainingInterrupted
from hethpc.train.evaluation import accuracy, evaluate
from hethpc.train.faults import Fault
from hethpc.train.fit import fit
from hethpc.train.guards import (
    check_same_model,
    local_nonfinite,
    model_signature,
    nonfinite_ranks,
)
from hethpc.train.loop import RunResult, train
from hethpc.train.losses import LOSSES, make_loss
from hethpc.train.metrics import MetricsWriter, read_metrics
from hethpc.train.rng import get_rng_state, seed_rank, set_rng_state
from hethpc.train.rundir import RunDirError, is_run_dir, next_run_dir
from hethpc.train.summary import format_summary, time_to_target
from hethpc.train.watchdog import Watchdog

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
