"""The rules a training configuration must meet: types, ranges and settings that conflict.

Each error names the setting (``ConfigError.key``), what it got and how to fix it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

from hethpc.batching.memory_cap import parse_max_rank_batch
from hethpc.comm import LinkError, parse_link
from hethpc.pipeline.balance import parse_balance
from hethpc.pipeline.schedule import chunks_per_stage
from hethpc.sync.codecs import parse_compression
from hethpc.sync.factory import policy_class
from hethpc.train.errors import ConfigError
from hethpc.train.settings.policy import policy_named, policy_traits

if TYPE_CHECKING:
    from hethpc.train.settings.fields import Settings

_EXPECTED = {
    "bool": "true or false (a TOML boolean, not a string)",
    "int": "an integer",
    "float": "a finite number",
    "str": "a string",
}


def check_type(name: str, value: Any, kind: str) -> Any:
    """``value`` as setting ``name`` of type ``kind`` (``bool|int|float|str``), or an error.

    No guessing: a bool must be a bool (``"false"`` is refused), an int an int (not ``1.5``,
    not ``True``), a float any finite number (an int becomes a float), a str a str.

    Raises:
        ConfigError: naming the setting, the value and what was expected.
    """
    ok = {
        "bool": isinstance(value, bool),
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value),
        "str": isinstance(value, str),
    }[kind]
    if not ok:
        raise ConfigError(f"{name} = {value!r}: expected {_EXPECTED[kind]}", key=name)
    return float(value) if kind == "float" else value


def validate(cfg: Settings) -> None:
    """Coerce each setting of ``cfg`` to its type (in place) and check the rules between them.

    Raises:
        ConfigError: naming the setting at fault, its value and what was expected.
    """
    for f in dataclasses.fields(cfg):
        object.__setattr__(cfg, f.name, check_type(f.name, getattr(cfg, f.name), str(f.type)))
        choices = f.metadata.get("choices")
        value = getattr(cfg, f.name)
        if choices and value not in choices:
            raise ConfigError(f"{f.name} = {value!r} is not one of {list(choices)}", key=f.name)
    positive = (
        "epochs",
        "batch_size",
        "keep_checkpoints",
        "sync_window",
        "fedavg_period",
        "batch_interval",
        "labels_per_rank",
        "pipeline_stages",
        "micro_batches",
    )
    for name in positive:
        if getattr(cfg, name) < 1:
            raise ConfigError(f"{name} must be at least 1, got {getattr(cfg, name)}", key=name)
    if cfg.samples < 10:
        raise ConfigError(
            f"samples must be at least 10 (MNIST-1D is split 80 % train, 20 % test), got "
            f"{cfg.samples}",
            key="samples",
        )
    for name in ("lr", "dirichlet_alpha", "outer_lr"):
        if getattr(cfg, name) <= 0:
            raise ConfigError(f"{name} must be positive, got {getattr(cfg, name)}", key=name)
    for name in (
        "max_steps",
        "checkpoint_every",
        "eval_every",
        "eval_every_steps",
        "max_skipped_steps",
        "watchdog_s",
        "watchdog_max_s",
        "progress_every_s",
        "threshold",
        "weight_decay",
        "staleness",
        "warmup_steps",
        "clip_grad_norm",
    ):
        if getattr(cfg, name) < 0:
            raise ConfigError(
                f"{name} must not be negative, got {getattr(cfg, name)}", key=name
            )
    if not 0.0 <= cfg.val_fraction < 0.5:
        raise ConfigError(
            f"val_fraction must be in [0, 0.5), got {cfg.val_fraction}; it is the share of the "
            "training samples held out for validation (0.1 holds out a tenth)",
            key="val_fraction",
        )
    for name in ("inject_alpha", "inject_beta"):
        if not 0.0 <= getattr(cfg, name) <= 1.0:
            raise ConfigError(f"{name} must be in [0, 1], got {getattr(cfg, name)}", key=name)
    if cfg.max_local_steps < -1:
        raise ConfigError(
            f"max_local_steps must be -1 (auto), 0 (no bound) or more, got "
            f"{cfg.max_local_steps}",
            key="max_local_steps",
        )
    for name in ("momentum", "outer_momentum"):
        if not 0.0 <= getattr(cfg, name) < 1.0:
            raise ConfigError(
                f"{name} must be in [0, 1), got {getattr(cfg, name)}", key=name
            )
    _check_pipeline(cfg)
    _check_optimisation(cfg)
    # What the policy is (its traits), for the settings that need a policy of some kind.
    policy, traits, named = policy_class(cfg.sync), policy_traits(cfg), policy_named(cfg)
    if cfg.outer_optimizer != "none" and not traits.averages_parameters:
        raise ConfigError(
            f"outer_optimizer = {cfg.outer_optimizer!r} steps on averaged parameters, but "
            f"{named} {traits.exchange}; use sync fedavg (DiLoCo), selsync with aggregation "
            "params, or local",
            key="outer_optimizer",
        )
    if not 0.0 < cfg.drift_smoothing <= 1.0:
        raise ConfigError(
            f"drift_smoothing must be in (0, 1], got {cfg.drift_smoothing}",
            key="drift_smoothing",
        )
    if cfg.drift_correction == "on" and not traits.averages_parameters:
        raise ConfigError(
            "drift_correction = 'on' corrects local steps between parameter averages, but "
            f"{named} has none; use sync selsync (aggregation params), fedavg or local, or "
            "drift_correction auto",
            key="drift_correction",
        )
    if cfg.average_optimizer_state == "on" and not traits.averages_while_training:
        raise ConfigError(
            "average_optimizer_state = 'on' averages the optimizer's state with the "
            f"parameters, but {named} averages no parameters during training; use sync "
            "selsync (aggregation params) or fedavg, or average_optimizer_state auto",
            key="average_optimizer_state",
        )
    if cfg.rebalance == "on" and cfg.pipeline_stages > 1:
        raise ConfigError(
            "rebalance = 'on' moves samples between data-parallel ranks, which is not built "
            "for pipeline runs; use rebalance auto or off with pipeline_stages > 1",
            key="rebalance",
        )
    if cfg.rebalance == "on" and traits.asynchronous:
        raise ConfigError(
            f"sync {cfg.sync} lets ranks step at their own pace, but rebalancing exchanges "
            f"samples between ranks every step; use rebalance auto or off with {cfg.sync}",
            key="rebalance",
        )
    if cfg.overlap and ("overlap" not in policy.settings or cfg.pipeline_stages > 1):
        raise ConfigError(
            f"overlap sends BSP's gradients during the backward pass, but this run uses sync "
            f"{cfg.sync} with {cfg.pipeline_stages} pipeline stage(s); use it with sync "
            "bsp and pipeline_stages 1, or turn it off",
            key="overlap",
        )
    _check_compression(cfg)
    if cfg.inner_steps == "speed" and not traits.accepts_inner_steps:
        raise ConfigError(
            f"inner_steps = 'speed' sizes local steps between parameter averages, but sync "
            f"{cfg.sync} has none to size; use sync fedavg (with outer_optimizer nesterov: "
            "DiLoCo) or local",
            key="inner_steps",
        )
    if cfg.inner_steps == "speed" and cfg.batching == "uniform":
        raise ConfigError(
            "inner_steps = 'speed' follows each rank's measured speed through its batch "
            "size, but batching uniform gives every rank the same; use batching dynamic",
            key="inner_steps",
        )
    if traits.asynchronous and cfg.batching == "dynamic":
        raise ConfigError(
            f"sync {cfg.sync} lets ranks step at their own pace, but batching dynamic "
            "re-splits the batch in a collective every batch_interval steps, which would hold "
            f"them together; use batching uniform or static with {cfg.sync}",
            key="batching",
        )
    if traits.asynchronous and cfg.inject_alpha > 0:
        raise ConfigError(
            f"sync {cfg.sync} lets ranks step at their own pace, but data injection exchanges "
            f"samples between ranks every step; use inject_alpha 0 with {cfg.sync}",
            key="inject_alpha",
        )
    if cfg.weights:
        _check_weights(cfg)
    if cfg.b_min < 0:
        raise ConfigError(
            f"b_min must be at least 1, or 0 for auto, got {cfg.b_min}", key="b_min"
        )
    if cfg.b_min > cfg.batch_size:
        raise ConfigError(
            f"b_min = {cfg.b_min} is larger than batch_size = {cfg.batch_size}", key="b_min"
        )
    if cfg.watchdog_s and cfg.watchdog_max_s < cfg.watchdog_s:
        raise ConfigError(
            f"watchdog_max_s = {cfg.watchdog_max_s} is below watchdog_s = "
            f"{cfg.watchdog_s}; the ceiling must be at least the floor",
            key="watchdog_max_s",
        )
    try:
        parse_link(cfg.link)
    except LinkError as e:
        raise ConfigError(str(e), key="link") from None
    names = {f.name for f in dataclasses.fields(cfg)}
    unknown = sorted(set(cfg.resume_change_set()) - names)
    if unknown:
        raise ConfigError(
            f"resume_changes names unknown setting(s) {unknown}; use setting names such "
            "as 'lr,epochs'",
            key="resume_changes",
        )


def _check_pipeline(cfg: Settings) -> None:
    """``pipeline_balance``: params, time or one layer count per chunk of the schedule
    (written back without spaces, so a resume compares it as given)."""
    try:
        given = parse_balance(cfg.pipeline_balance)
    except ValueError as e:
        raise ConfigError(str(e), key="pipeline_balance") from None
    if isinstance(given, str):
        object.__setattr__(cfg, "pipeline_balance", given)
        return
    object.__setattr__(cfg, "pipeline_balance", ",".join(str(c) for c in given))
    chunks = cfg.pipeline_stages * chunks_per_stage(cfg.schedule)
    if len(given) != chunks:
        per = "two chunks per stage" if chunks_per_stage(cfg.schedule) == 2 else "one per stage"
        raise ConfigError(
            f"pipeline_balance = {cfg.pipeline_balance!r} lists {len(given)} chunk(s), but "
            f"pipeline_stages = {cfg.pipeline_stages} with schedule {cfg.schedule} cuts the "
            f"model into {chunks} ({per}); give {chunks} layer counts, or params or time",
            key="pipeline_balance",
        )


def _check_optimisation(cfg: Settings) -> None:
    """``decay_norms_biases`` with adamw only; ``accumulate`` and ``clip_grad_norm`` where
    they are built (not on pipeline stages)."""
    if cfg.decay_norms_biases and cfg.optimizer != "adamw":
        raise ConfigError(
            f"decay_norms_biases = true chooses what adamw decays, but optimizer = "
            f"{cfg.optimizer!r} adds weight_decay to every parameter's gradient; use "
            "optimizer adamw, or drop decay_norms_biases",
            key="decay_norms_biases",
        )
    if cfg.accumulate < 1:
        raise ConfigError(
            f"accumulate must be at least 1 (micro-batches per step; 1: no accumulation), got "
            f"{cfg.accumulate}",
            key="accumulate",
        )
    if cfg.accumulate > cfg.batch_size:
        raise ConfigError(
            f"accumulate = {cfg.accumulate} splits each rank's batch into more micro-batches "
            f"than the whole batch_size = {cfg.batch_size} has samples; use accumulate "
            f"{cfg.batch_size} or less",
            key="accumulate",
        )
    try:
        caps = parse_max_rank_batch(cfg.max_rank_batch)
    except ValueError as e:
        raise ConfigError(str(e), key="max_rank_batch") from None
    if isinstance(caps, tuple) and cfg.pipeline_stages > 1:
        raise ConfigError(
            f"max_rank_batch = {cfg.max_rank_batch!r} caps a data-parallel rank's pass; "
            f"pipeline stages pass micro-batches already: with pipeline_stages > 1 raise "
            f"micro_batches (now {cfg.micro_batches}) for smaller passes, or give "
            "max_rank_batch auto with pipeline_balance time (the cut keeps each stage within "
            "its rank's memory)",
            key="max_rank_batch",
        )
    if caps == "auto" and cfg.pipeline_stages > 1 and cfg.pipeline_balance != "time":
        raise ConfigError(
            "max_rank_batch = 'auto' with pipeline stages keeps each stage within its rank's "
            "memory as the cut by time measures it: add pipeline_balance time (now "
            f"{cfg.pipeline_balance!r}), or max_rank_batch none",
            key="max_rank_batch",
        )
    if not (cfg.memory_limit_gb >= 0 and math.isfinite(cfg.memory_limit_gb)):
        raise ConfigError(
            f"memory_limit_gb must be 0 (the cgroup's limit) or a positive number of GB, got "
            f"{cfg.memory_limit_gb}",
            key="memory_limit_gb",
        )
    if cfg.accumulate > 1 and cfg.pipeline_stages > 1:
        raise ConfigError(
            f"accumulate = {cfg.accumulate} splits each step's batch into micro-batches, which "
            f"pipeline stages already do; with pipeline_stages > 1 use micro_batches (now "
            f"{cfg.micro_batches}) instead, and accumulate 1",
            key="accumulate",
        )
    if cfg.clip_grad_norm > 0 and cfg.pipeline_stages > 1:
        raise ConfigError(
            f"clip_grad_norm = {cfg.clip_grad_norm} clips the norm of the whole model's "
            "gradient, but each pipeline stage holds only its own part (a norm across the "
            "stages is not built); use clip_grad_norm 0 with pipeline_stages > 1",
            key="clip_grad_norm",
        )


def _check_compression(cfg: Settings) -> None:
    """``compression``: a codec's name that the policy can send with (powersgd: BSP without
    overlap)."""
    try:
        codec = parse_compression(cfg.compression)
    except ValueError as e:
        raise ConfigError(str(e), key="compression") from None
    offered = policy_class(cfg.sync).compressions
    if codec.name not in offered:
        raise ConfigError(
            f"compression = {cfg.compression!r} is not built for sync {cfg.sync} (it takes "
            f"{list(offered)}); use one of those, or compression none",
            key="compression",
        )


def _check_weights(cfg: Settings) -> None:
    """``weights``: comma-separated finite positive numbers, and a batching mode that uses
    them (static: fixed; dynamic: the first split). Their count is checked against the
    data-parallel ranks when the job starts."""
    try:
        values = [float(v) for v in cfg.weights.split(",")]
    except ValueError:
        values = []
    if not values or any(not math.isfinite(v) or v <= 0 for v in values):
        raise ConfigError(
            f"weights = {cfg.weights!r}: expected comma-separated positive numbers, one per "
            "data-parallel rank, e.g. '1,2'",
            key="weights",
        )
    if cfg.batching == "uniform":
        raise ConfigError(
            f"weights = {cfg.weights!r} would be ignored with batching 'uniform' (equal "
            "batches); use batching static (fixed weights) or dynamic (weights as the first "
            "split), or drop weights",
            key="weights",
        )
