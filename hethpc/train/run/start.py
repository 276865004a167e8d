"""Starting a run: the settings checked on every rank and the run directory claimed."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from hethpc import comm
from hethpc.train.keep.rundir import RunDirError, claim, next_run_dir
from hethpc.train.parts.pipeline_stage import check_pipeline_config
from hethpc.train.settings.compare import check_same_config
from hethpc.train.settings.config import TrainConfig


def start_run(
    cfg: TrainConfig, *, overwrite: bool = False, log: Callable[[str], None] = print
) -> Path:
    """Check the settings on every rank and claim the run directory (a collective); its path.

    Raises:
        ConfigError: settings differ across ranks or do not fit the world.
        RunDirError: the run directory may not be written (the user's files, an earlier run).
    """
    rank, size = comm.rank(), comm.size()
    say = log if rank == 0 else (lambda _msg: None)
    check_same_config(cfg)
    if cfg.pipeline_stages > 1:
        check_pipeline_config(cfg, size)
    if torch.cuda.is_available() and cfg.device != "cpu":
        # CPU kernels used here are deterministic already; on CPU this call would only cost
        # seconds of imports (it loads torch._inductor), and fill every new tensor.
        # warn_only: cuBLAS needs CUBLAS_WORKSPACE_CONFIG for determinism; without it, warn.
        torch.use_deterministic_algorithms(True, warn_only=True)
    refusal, chosen = "", cfg.run_dir
    if rank == 0:
        try:
            if not chosen and cfg.resume:
                raise RunDirError(
                    "--resume needs --run-dir (fit: resume=True needs run_dir=...): the "
                    "directory of the run to continue"
                )
            chosen = str(chosen or next_run_dir())
            claim(chosen, digest=cfg.digest(), resume=cfg.resume, overwrite=overwrite)
        except RunDirError as e:
            refusal = str(e)
    # Decided on rank 0, raised on every rank: no rank is left waiting in a collective.
    refusal, chosen = comm.broadcast_object((refusal, chosen))
    if refusal:
        raise RunDirError(refusal)
    say(f"hethpc: run directory {chosen}")
    return Path(chosen)
