"""hethpc: train PyTorch models on heterogeneous HPC clusters.

The public API (imported on first use, so ``import hethpc.comm`` stays light):

- :func:`fit`: train your own model on your own data, every capability a setting.
- :class:`Coordinator`: hethpc inside your own training loop (batch size, sync, weights).
- :class:`TrainConfig`: every setting, validated; :class:`RunResult`: what a run returns.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = ["ConfigError", "Coordinator", "RunResult", "TrainConfig", "__version__", "fit"]

_LAZY = {
    "ConfigError": "hethpc.train.settings.config",
    "Coordinator": "hethpc.train.coordinator",
    "RunResult": "hethpc.train.run.loop",
    "TrainConfig": "hethpc.train.settings.config",
    "fit": "hethpc.train.fit",
}

if TYPE_CHECKING:
    from hethpc.train.coordinator import Coordinator
    from hethpc.train.fit import fit
    from hethpc.train.run.loop import RunResult
    from hethpc.train.settings.config import ConfigError, TrainConfig


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'hethpc' has no attribute {name!r}")
