"""The cut by speed within each rank's memory: every rank measures its layers and states its
memory, and every rank cuts alike; a rank that knows no memory is refused on every rank.

One stage per rank, one replica (P = the world size); in a plain process there is no cut.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hethpc import comm
from hethpc.pipeline import BalanceError, PipelineError, build_pipeline
from hethpc.pipeline.profile import MemoryBudget, measure_speeds

ROWS, WIDTH, BLOCKS = 16, 64, 8
LINEAR = (WIDTH * WIDTH + WIDTH) * 4  # one Linear's parameter bytes
ACT = ROWS * WIDTH * 4  # what each layer keeps for backward on a micro-batch
SMALL = (3 * LINEAR + ACT) + ACT + 100  # one Linear and its ReLU fit, not two


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*(m for _ in range(BLOCKS) for m in (nn.Linear(WIDTH, WIDTH), nn.ReLU())))


@pytest.fixture
def stages(world: tuple[int, int]) -> int:
    if world[1] < 2:
        pytest.skip("a cut needs 2 or more ranks")
    return world[1]


def test_the_last_stage_gets_only_what_its_memory_holds(stages: int) -> None:
    # the last rank holds one Linear layer and its ReLU (parameters, gradients and momentum:
    # 3 copies; one micro-batch in flight), the others plenty
    small = SMALL
    left = small if comm.rank() == stages - 1 else 1 << 40
    budget = MemoryBudget(left, (1,) * stages, state_copies=3.0, share=1.0)
    model = _model()
    x = torch.randn(ROWS, WIDTH)
    speeds = measure_speeds(model, list(range(stages)), x, repeats=1, memory=budget)
    balance = speeds.balance()
    got = comm.allgather_object(balance)
    assert all(b == balance for b in got), got  # every rank cuts alike
    assert sum(balance) == 2 * BLOCKS and balance[-1] <= 2, balance
    for need, limit in speeds.memory_use(balance):
        assert limit is None or need <= limit
    assert speeds.limits[-1] == small and speeds.limits[0] == float(1 << 40)
    # without the limit the last stage gets about an even share (16 layers on 2-4 stages)
    free = measure_speeds(model, list(range(stages)), x, repeats=1)
    assert free.balance()[-1] > balance[-1]
    assert speeds.fits(balance) and not speeds.fits(free.balance())


def test_a_rank_that_knows_no_memory_is_refused_on_every_rank(stages: int) -> None:
    left = None if comm.rank() == 0 else 1 << 40
    budget = MemoryBudget(left, (1,) * stages)
    with pytest.raises(BalanceError, match=r"rank\(s\) \[0\] know none: .*memory_limit_gb"):
        measure_speeds(_model(), list(range(stages)), torch.randn(ROWS, WIDTH), repeats=1,
                       memory=budget)  # fmt: skip


def test_build_pipeline_cuts_within_memory(stages: int) -> None:
    left = SMALL if comm.rank() == stages - 1 else 1 << 40
    budget = MemoryBudget(left, (1,) * stages, state_copies=3.0, share=1.0)
    x, y = torch.randn(2 * ROWS, WIDTH), torch.randint(0, WIDTH, (2 * ROWS,))
    pipe = build_pipeline(_model(), stages=stages, micro_batches=2, balance="time",
                          sample=(x, y), memory=budget, progress_interval=None)  # fmt: skip
    assert sum(pipe.balance) == 2 * BLOCKS and pipe.balance[-1] <= 2, pipe.balance


def test_memory_needs_the_cut_by_time(world: tuple[int, int]) -> None:
    budget = MemoryBudget(1 << 40, (1,) * world[1])
    with pytest.raises(PipelineError, match='use balance="time"'):
        build_pipeline(_model(), stages=world[1], micro_batches=1, balance="params",
                       memory=budget, progress_interval=None)  # fmt: skip
