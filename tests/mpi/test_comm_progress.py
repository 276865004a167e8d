"""Progress moves tensors between neighbours whichever way it waits; step timings add up."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hethpc import comm
from hethpc.comm.progress import Lookahead, Progress, auto_interval
from hethpc.pipeline import Pipeline, PipelineError


def payload(sender: int, i: int) -> torch.Tensor:
    """A tensor whose shape and values name its sender and index (variable shapes)."""
    return torch.full((sender + 1, 3 + i), float(100 * sender + i))


@pytest.mark.parametrize(
    ("interval", "wait_sleep"),
    [
        pytest.param(0.0005, 0.00005, id="sleep-between-tests"),
        pytest.param(0.0005, 0.0, id="block-in-mpi-wait"),
        pytest.param(0.01, 0.001, id="slow-thread-long-sleeps"),
    ],
)
def test_ring_exchange_delivers_in_order(interval: float, wait_sleep: float) -> None:
    n, r = comm.size(), comm.rank()
    if n < 2:
        pytest.skip("needs 2 ranks")
    g = comm.world()
    left, right = (r - 1) % n, (r + 1) % n
    count = 5
    with Progress(interval=interval, wait_sleep=wait_sleep) as net:
        ahead = Lookahead(net, list(range(count)), {i: 7 + i for i in range(count)},
                          source=left, device=torch.device("cpu"), group=g, depth=2)
        for i in range(count):
            net.send(payload(r, i), right, tag=7 + i, group=g)
        got = [ahead.take(i) for i in range(count)]
    for i, t in enumerate(got):
        torch.testing.assert_close(t, payload(left, i), rtol=0, atol=0)
    assert net.wait_s > 0


def test_step_stats_add_up() -> None:
    n = comm.size()
    layers = 2 * n
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(8, 8) for _ in range(layers)])
    pipe = Pipeline(model, balance=(2,) * n, micro_batches=4, stage_group=comm.world())
    x, y = torch.randn(16, 8), torch.randn(16, 8)
    pipe.train_step(x, y, nn.functional.mse_loss)
    s = pipe.stats
    assert 0 < s.forward_s < s.busy_s < s.step_s
    assert 0 <= s.wait_s < s.step_s
    assert (s.wait_s > 0) == (n > 1), "only a stage with neighbours waits for messages"
    assert 0 < s.idle_fraction < 1


@pytest.mark.parametrize(
    "interval",
    [
        pytest.param(0.0005, id="progress-thread"),
        pytest.param(None, id="no-thread"),
        pytest.param("auto", id="auto"),
    ],
)
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_gradients_do_not_depend_on_the_progress_thread(
    interval: float | str | None, schedule: str
) -> None:
    n = comm.size()
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(8, 8) for _ in range(2 * n)])
    ref = nn.Sequential(*[nn.Linear(8, 8) for _ in range(2 * n)])
    ref.load_state_dict(model.state_dict())
    pipe = Pipeline(model, balance=(2,) * n, micro_batches=4, schedule=schedule,
                    stage_group=comm.world(), progress_interval=interval)
    x, y = torch.randn(12, 8), torch.randn(12, 8)
    loss = pipe.train_step(x, y, nn.functional.mse_loss)
    if interval == "auto":  # next step: a tenth of this step's mean pass (4 F + 4 B)
        assert pipe.current_progress_interval == auto_interval(pipe.stats.busy_s / 8)
    ref_loss = nn.functional.mse_loss(ref(x), y)
    ref_loss.backward()
    if pipe.is_last:
        assert loss == pytest.approx(ref_loss.item(), rel=1e-5)
    for k, p in pipe.module.named_parameters():
        layer, name = k.split(".", 1)
        want = ref.get_parameter(f"{int(layer) + 2 * pipe.stage}.{name}").grad
        torch.testing.assert_close(p.grad, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("interval", [0.0, -1.0, "fast"], ids=["zero", "neg", "word"])
def test_bad_progress_interval_is_refused(interval: float | str) -> None:
    model = nn.Sequential(*[nn.Linear(8, 8) for _ in range(comm.size())])
    with pytest.raises(PipelineError, match="progress_interval must be a positive"):
        Pipeline(model, balance=(1,) * comm.size(), micro_batches=2,
                 stage_group=comm.world(), progress_interval=interval)
