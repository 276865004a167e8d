"""The sync policy a configuration selects: its traits, its keywords, and the autos it decides.

Every ``auto`` setting that depends on the policy is resolved here, by asking the policy's
class (:mod:`hethpc.sync`) what it is, never by its name; the rules that refuse settings a
policy cannot honour are in :mod:`~hethpc.train.settings.rules`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hethpc.sync.factory import policy_class
from hethpc.sync.traits import Traits

if TYPE_CHECKING:
    from hethpc.train.settings.fields import Settings

# SelSync on non-IID partitions: at most this many local steps between syncs (auto).
# Measured with bench_tta on skew_slowlink (2 ranks, 6 of 10 labels each), BSP 95.33 %:
# without drift correction no bound 84.2 % (9 % of steps synchronised), 4 steps 91.3 % (23 %),
# 2 steps 93.2 % (36 %); with it (the default there) 4 steps 95.48 % (23 %), 3 steps 95.63 %
# (27 %), and SelSync with dynamic batching 94.10 % and 96.08 % at 4 and 3 steps.
NON_IID_MAX_LOCAL_STEPS = 3


#: Partitions that give ranks data of different distributions: different labels
#: (``labels``, ``dirichlet``) or different sources (``site``: each rank its own sites' text).
NON_IID_PARTITIONS = ("labels", "dirichlet", "site")


def non_iid(cfg: Settings) -> bool:
    """Whether ``cfg``'s partition gives ranks data of different distributions
    (:data:`NON_IID_PARTITIONS`), where the auto settings guard each rank's own data."""
    return cfg.partition in NON_IID_PARTITIONS


def staleness_bound(cfg: Settings) -> int | None:
    """SelSync's bound on local steps in a row: ``max_local_steps`` with -1 resolved."""
    if cfg.max_local_steps == -1:
        return NON_IID_MAX_LOCAL_STEPS if non_iid(cfg) else None
    return cfg.max_local_steps or None


def policy_settings(cfg: Settings) -> dict[str, Any]:
    """The keywords of its own that ``cfg``'s policy is built with (those its class names in
    ``settings``), auto values resolved."""
    offered = {
        "threshold": cfg.threshold,
        "window": cfg.sync_window,
        "aggregation": cfg.aggregation,
        "max_local_steps": staleness_bound(cfg),
        "overlap": cfg.overlap,
        "period": cfg.fedavg_period,
        "staleness": cfg.staleness,
    }
    return {key: offered[key] for key in policy_class(cfg.sync).settings}


def policy_traits(cfg: Settings) -> Traits:
    """What ``cfg``'s policy is, with its settings (SelSync's aggregation)."""
    policy = policy_class(cfg.sync)
    settings = policy_settings(cfg)
    return policy.traits(**{key: settings[key] for key in policy.trait_settings})


def policy_named(cfg: Settings) -> str:
    """The policy as error messages name it, with the settings that change its traits
    (``sync selsync with aggregation grads``)."""
    settings = policy_settings(cfg)
    changes = policy_class(cfg.sync).trait_settings
    return f"sync {cfg.sync}" + "".join(f" with {key} {settings[key]}" for key in changes)


def rebalances(cfg: Settings) -> bool:
    """Whether the batches are rebalanced across a non-IID partition: ``rebalance`` with
    auto resolved (on for unequal batches when the policy averages gradients: bsp, or selsync
    with aggregation grads; never with pipeline stages); off on IID data."""
    skewed = non_iid(cfg)
    if cfg.rebalance != "auto":
        return cfg.rebalance == "on" and skewed
    unequal = cfg.batching in ("dynamic", "static")
    # Only where gradients are averaged: with local steps between parameter averages the slow
    # rank's small batch of its own labels then weighs b_k / B, and its drift correction
    # grows unstable (bench_tta demo: SelSync 90.6 % with both, 94.1 % rebalanced without
    # drift correction, 94.7-95.3 % with drift correction alone).
    return skewed and unequal and cfg.pipeline_stages == 1 and policy_traits(cfg).averages_gradients


def corrects_drift(cfg: Settings) -> bool:
    """Whether the policy corrects the drift of local steps: ``drift_correction`` with auto
    resolved (on for non-IID partitions), for policies that average parameters (not bsp,
    ssp, selsync with aggregation grads)."""
    on = cfg.drift_correction == "on" or (cfg.drift_correction == "auto" and non_iid(cfg))
    return on and policy_traits(cfg).averages_parameters


def averages_optimizer_state(cfg: Settings) -> bool:
    """Whether parameter averages take the optimizer's state along: ``average_optimizer_state``
    with auto resolved, for policies that average parameters during training (selsync with
    aggregation params, fedavg). Auto is on for non-IID partitions, unless the ranks take
    different numbers of local steps between averages (``inner_steps`` speed): averaging
    momenta built over unequal rounds measured worse (``docs/sync.md``)."""
    mode = cfg.average_optimizer_state
    auto = non_iid(cfg) and cfg.inner_steps == "fixed"
    on = mode == "on" or (mode == "auto" and auto)
    return on and policy_traits(cfg).averages_while_training
