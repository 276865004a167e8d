"""The traits each sync policy declares agree with what it does and with the settings that
name it (one process, world size 1)."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import pytest
import torch
from torch import nn

from hethpc.sync import POLICIES, SyncPolicy
from hethpc.sync import make_policy as make_sync_policy
from hethpc.sync.drift import DriftCorrection
from hethpc.sync.factory import policy_class
from hethpc.sync.outer import OuterOptimizer
from hethpc.sync.traits import Traits
from hethpc.train.parts.capabilities import make_policy
from hethpc.train.settings.config import TrainConfig, config_fields
from hethpc.train.settings.policy import policy_settings, policy_traits

# Every policy, and SelSync in both aggregations: the settings that change traits.
VARIANTS = [
    ("bsp", {}),
    ("selsync", {"aggregation": "params"}),
    ("selsync", {"aggregation": "grads"}),
    ("fedavg", {}),
    ("local", {}),
    ("ssp", {}),
]
IDS = [name + "".join(f"-{v}" for v in kw.values()) for name, kw in VARIANTS]


def _traits(name: str, kwargs: dict[str, Any]) -> Traits:
    return policy_class(name).traits(**kwargs)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2))


def test_the_registry_names_the_config_choices() -> None:
    choices = next(f for f in config_fields() if f.name == "sync").metadata["choices"]
    assert list(choices) == list(POLICIES)
    assert all(cls.name == name for name, cls in POLICIES.items())
    ours = [c for c in SyncPolicy.__subclasses__() if c.__module__.startswith("hethpc.sync.")]
    assert {c.name for c in ours} == set(POLICIES)


@pytest.mark.parametrize("name", list(POLICIES))
def test_every_trait_is_a_class_attribute_of_its_type(name: str) -> None:
    cls = POLICIES[name]
    for f in dataclasses.fields(Traits):
        assert isinstance(getattr(cls, f.name), bool if f.type == "bool" else str), f.name
    assert set(cls.trait_settings) <= set(cls.settings)


@pytest.mark.parametrize(("name", "kwargs"), VARIANTS, ids=IDS)
def test_outer_and_drift_are_taken_exactly_where_parameters_are_averaged(
    name: str, kwargs: dict[str, Any]
) -> None:
    averages = _traits(name, kwargs).averages_parameters
    parts = {"outer": OuterOptimizer("nesterov"), "drift": DriftCorrection(1.0)}
    for key, part in parts.items():
        if averages:
            make_sync_policy(name, **kwargs, **{key: part})
        else:
            with pytest.raises(ValueError, match="parameters"):
                make_sync_policy(name, **kwargs, **{key: part})


@pytest.mark.parametrize(("name", "kwargs"), VARIANTS, ids=IDS)
def test_optimizer_state_is_taken_exactly_where_parameters_are_averaged_while_training(
    name: str, kwargs: dict[str, Any]
) -> None:
    if _traits(name, kwargs).averages_while_training:
        assert make_sync_policy(name, **kwargs, optimizer_state=True).optimizer_state
    else:
        with pytest.raises(ValueError, match="parameters"):
            make_sync_policy(name, **kwargs, optimizer_state=True)


@pytest.mark.parametrize(("name", "kwargs"), VARIANTS, ids=IDS)
def test_a_policy_that_exchanges_during_training_syncs_during_training(
    name: str, kwargs: dict[str, Any]
) -> None:
    traits = _traits(name, kwargs)
    policy = make_sync_policy(name, **kwargs)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    synced = []
    for _ in range(12):  # past FedAvg's period
        opt.zero_grad()
        nn.functional.cross_entropy(model(torch.randn(8, 4)), torch.randint(0, 2, (8,))).backward()
        synced.append(policy.step(model, opt).synced)
    policy.close()
    during = traits.averages_while_training or traits.averages_gradients or traits.asynchronous
    assert any(synced) is during
    if traits.keeps_replicas_equal:
        assert all(synced)


@pytest.mark.parametrize(("name", "kwargs"), VARIANTS, ids=IDS)
def test_traits_that_follow_from_others(name: str, kwargs: dict[str, Any]) -> None:
    t = _traits(name, kwargs)
    assert not (t.averages_parameters and t.averages_gradients)
    assert t.averages_parameters or not t.averages_while_training
    assert (t.exchange == "averages parameters") is t.averages_parameters
    assert (t.exchange == "averages gradients") is t.averages_gradients
    assert not t.keeps_replicas_equal or (t.averages_gradients and not t.asynchronous)
    assert not t.accepts_inner_steps or (t.averages_parameters and not t.decides_by_norm)


@pytest.mark.parametrize("name", list(POLICIES))
def test_settings_are_keywords_of_the_constructor(name: str) -> None:
    cls = POLICIES[name]
    params = inspect.signature(cls.__init__).parameters
    assert set(cls.settings) <= set(params)
    if cls.separate_weight_check:
        assert not cls(check_weights=False).check_weights


def test_selsync_refuses_an_unknown_aggregation_as_its_constructor_does() -> None:
    with pytest.raises(ValueError, match="aggregation must be one of"):
        policy_class("selsync").traits(aggregation="both")


@pytest.mark.parametrize(("name", "kwargs"), VARIANTS, ids=IDS)
def test_a_config_builds_the_class_it_names_with_its_settings(
    name: str, kwargs: dict[str, Any]
) -> None:
    cfg = TrainConfig(sync=name, **kwargs)
    assert type(make_policy(cfg)) is POLICIES[name]
    assert set(policy_settings(cfg)) == set(POLICIES[name].settings)
    assert policy_traits(cfg) == _traits(name, kwargs)
