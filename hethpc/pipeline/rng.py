"""Random-number state for recomputation: a checkpointed forward replays its dropout masks.

With ``checkpoint=True`` a micro-batch's forward runs twice, once without autograd and once in
its backward; the second must draw the same random numbers (dropout) as the first, so the
gradient is that of the forward whose output went on. The state is taken before the first
forward and restored, inside a fork of the generators, for the second (as torchgpipe's
``checkpoint.py``), so the recomputation leaves the generators where they were.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

RngState = tuple[torch.Tensor, torch.Tensor | None]  # the CPU generator's, the device's (CUDA)


def rng_state(device: torch.device) -> RngState:
    """The generators' state now: the CPU's, and ``device``'s when it is a GPU."""
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda


@contextmanager
def rng_restored(device: torch.device, state: RngState) -> Iterator[None]:
    """Run the block with the generators at ``state``, then put them back as they were."""
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.set_rng_state(state[0])
        if state[1] is not None:
            torch.cuda.set_rng_state(state[1], device)
        yield
