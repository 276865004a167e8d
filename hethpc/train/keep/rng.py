"""Random-number state of one process: capture, restore, and re-derive from a seed."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def get_rng_state() -> dict[str, Any]:
    """Python, numpy (global) and torch CPU generator states, in checkpoint-safe types, and the
    CUDA generators' when this process has used CUDA (None otherwise: asking would start it)."""
    py = random.getstate()
    np_state: Any = np.random.get_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    return {
        "python": [py[0], list(py[1]), py[2]],
        "numpy": [np_state[0], np.asarray(np_state[1]), *np_state[2:]],
        "torch": torch.get_rng_state(),
        "cuda": cuda,  # CPU byte tensors, one per GPU
    }


def set_rng_state(state: dict[str, Any]) -> None:
    """Inverse of :func:`get_rng_state`. The CUDA generators come back when the state has them
    for as many GPUs as this process sees (older checkpoints have none: they stay as seeded)."""
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    np.random.set_state(tuple(state["numpy"]))
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)


def seed_rank(seed: int, rank: int, step: int = 0) -> None:
    """Seed this rank's streams from ``(seed, rank, step)``: distinct per rank, reproducible.

    Used at the start of a run, and when a checkpoint from a different number of ranks is
    resumed (per-rank streams cannot carry over, so they are re-derived at the resume step).
    """
    s = int(np.random.SeedSequence([seed, rank, step]).generate_state(1)[0])
    random.seed(s)
    np.random.seed(s)
    torch.manual_seed(s)
