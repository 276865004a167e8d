"""The training loop and what keeps it safe: config checks, checkpoints, metrics, guards.

What users call is exported here; the rest (config plumbing, guards, RNG state, run
directories, summaries) is imported from its module, e.g. :mod:`hethpc.train.report.summary`.
"""

from __future__ import annotations

from hethpc.train.coordinator import Coordinator
from hethpc.train.errors import CheckpointError, ConfigError, NonFiniteError, TrainingInterrupted
from hethpc.train.fit import fit
from hethpc.train.parts.optim import lr_factor, param_groups
from hethpc.train.report.metrics import read_metrics
from hethpc.train.run.loop import RunResult, train
from hethpc.train.settings.config import TrainConfig

__all__ = [
    "CheckpointError",
    "ConfigError",
    "Coordinator",
    "NonFiniteError",
    "RunResult",
    "TrainConfig",
    "TrainingInterrupted",
    "fit",
    "lr_factor",
    "param_groups",
    "read_metrics",
    "train",
]

# Not public: the commands (hethpc-train, hethpc-report) import these from here.
from hethpc.train.parts.device import this_device  # noqa: F401
from hethpc.train.report.summary import format_summary, time_to_target  # noqa: F401
from hethpc.train.settings.config import config_fields, config_sections, config_tables  # noqa: F401
from hethpc.train.settings.sources import load_toml, make_config, toml_sources  # noqa: F401
from hethpc.train.watch.faults import Fault  # noqa: F401
