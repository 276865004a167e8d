"""SSP in one process (world size 1) and its settings; on real ranks: tests/mpi/."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hethpc.sync import SSP, make_policy
from hethpc.train import TrainConfig
from hethpc.train.parts.pipeline_stage import check_pipeline_config
from hethpc.train.settings.config import ConfigError


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2))


def test_one_rank_is_plain_sgd() -> None:
    runs = []
    for policy in (None, SSP(staleness=1)):
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        g = torch.Generator().manual_seed(3)
        for _ in range(5):
            opt.zero_grad()
            x, y = torch.randn(8, 4, generator=g), torch.randint(0, 2, (8,), generator=g)
            nn.functional.cross_entropy(model(x), y).backward()
            if policy is None:
                opt.step()
            else:
                policy.step(model, opt)
        if policy is not None:
            policy.finish(model)
            assert (policy.max_clock_gap, policy.waits) == (0, 0)
        runs.append([p.detach().clone() for p in model.parameters()])
    for a, b in zip(*runs, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-7)


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_bad_staleness_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="SSP staleness must be an integer >= 0"):
        make_policy("ssp", staleness=bad)


@pytest.mark.parametrize(
    ("settings", "key", "match"),
    [
        ({"sync": "ssp", "staleness": -1}, "staleness", "staleness must not be negative"),
        ({"sync": "ssp", "batching": "dynamic"}, "batching", "use batching uniform or static"),
        ({"sync": "ssp", "inject_alpha": 0.5, "inject_beta": 0.2}, "inject_alpha",
         "use inject_alpha 0 with ssp"),
        ({"sync": "ssp", "outer_optimizer": "nesterov"}, "outer_optimizer", "ssp adds updates"),
    ],
    ids=["negative", "dynamic", "injection", "outer"],
)  # fmt: skip
def test_job_settings_are_checked(settings: dict[str, object], key: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as e:
        TrainConfig(**settings)  # type: ignore[arg-type]
    assert e.value.key == key


def test_pipeline_stages_refuse_ssp() -> None:
    with pytest.raises(ConfigError, match="supports only: no --sync ssp"):
        check_pipeline_config(TrainConfig(sync="ssp", pipeline_stages=2), 2)


def test_state_resumes_the_clock_and_refuses_another_bound() -> None:
    policy = SSP(staleness=2)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        nn.functional.cross_entropy(model(torch.randn(8, 4)), torch.randint(0, 2, (8,))).backward()
        policy.step(model, opt)
    again = SSP(staleness=2)
    again.load_state_dict(policy.state_dict())
    assert again.steps == 3 and again.state_dict()["clock"] == 3
    with pytest.raises(ValueError, match="saved with staleness 2"):
        SSP(staleness=1).load_state_dict(policy.state_dict())
