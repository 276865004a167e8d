"""The training configuration: one frozen dataclass, TOML loading and a cross-rank check."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hethpc import comm
from hethpc.comm import Group, LinkError, parse_link
from hethpc.train.errors import ConfigError


def _f(
    default: Any,
    help: str,
    *,
    choices: tuple[str, ...] | None = None,
    local: bool = False,
    operational: bool = False,
) -> Any:
    # local: may legitimately differ between ranks (paths on node-local disks, display).
    # operational: does not change what is trained, so --resume lets it differ.
    meta = {"help": help, "choices": choices, "local": local, "operational": local or operational}
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class TrainConfig:
    """Every setting of a training run; each field is one ``--flag`` of ``jobs/train.py``.

    Defaults give a small, quick MNIST-1D run that works on one or more CPU ranks.
    """

    # Data
    data: str = _f(
        "mnist1d", "'mnist1d' (generated and cached on first use) or an HDF5 shard directory"
    )
    samples: int = _f(20_000, "MNIST-1D samples to generate (80% train, 20% test)")
    data_seed: int = _f(42, "seed of the generated MNIST-1D data")
    cache_dir: str = _f(
        "", "where generated data sets are cached (default ~/.cache/hethpc)", local=True
    )
    partition: str = _f(
        "iid", "how samples map to ranks", choices=("iid", "seldp", "labels", "dirichlet")
    )
    labels_per_rank: int = _f(
        2,
        "labels each rank holds with --partition labels (ranks x labels must cover every "
        "class, unless --allow-uncovered)",
    )
    allow_uncovered: bool = _f(
        False, "--partition labels may leave classes on no rank (they are never trained on)"
    )
    dirichlet_alpha: float = _f(0.5, "concentration with --partition dirichlet (small = skewed)")
    inject_alpha: float = _f(0.0, "data injection: fraction of ranks that send samples each step")
    inject_beta: float = _f(0.0, "data injection: fraction of a sender's batch that is sent")
    rebalance: str = _f(
        "auto",
        "unequal batches on partitioned data: each rank reads its partition's share of the "
        "global batch and the slow ranks send what they do not compute on to the fast ones, so "
        "every step draws from each partition as uniform batches do (a few samples per step). "
        "auto: on with --batching dynamic or static, --partition labels or dirichlet, and "
        "gradients averaged every step (sync bsp, or selsync with aggregation grads)",
        choices=("auto", "on", "off"),
    )
    # Model and optimisation
    model: str = _f(
        "cnn1d",
        "a built-in model (mlp, cnn1d, cnn1d_wide, resnet, large) or your own: "
        "'package.module:factory' or 'path/to/file.py:factory', called as "
        "factory(sample_shape, num_classes)",
    )
    loss: str = _f(
        "cross_entropy",
        "cross_entropy, mse, l1, smooth_l1, or your own 'package.module:factory' (called "
        "without arguments, returns loss(output, target))",
    )
    epochs: int = _f(5, "passes over the training set")
    max_steps: int = _f(0, "stop after this many steps in total (0: run every epoch)")
    batch_size: int = _f(128, "global batch: the sum of every rank's batch, kept fixed")
    optimizer: str = _f("sgd", "optimizer", choices=("sgd", "adam"))
    lr: float = _f(0.05, "learning rate")
    momentum: float = _f(0.9, "SGD momentum")
    weight_decay: float = _f(0.0, "L2 weight decay")
    lr_schedule: str = _f(
        "constant", "learning-rate schedule over all steps", choices=("constant", "cosine", "step")
    )
    seed: int = _f(0, "seed of model initialisation, shuffling and per-rank random streams")
    # Synchronisation
    sync: str = _f(
        "bsp", "synchronisation policy", choices=("bsp", "selsync", "fedavg", "local", "ssp")
    )
    threshold: float = _f(0.3, "SelSync: relative gradient-norm change that triggers a sync")
    sync_window: int = _f(25, "SelSync: EWMA window of the gradient norm")
    max_local_steps: int = _f(
        -1,
        "SelSync: synchronise anyway after this many local steps in a row, a staleness bound. "
        "-1 (auto): 3 with --partition labels or dirichlet (label-skewed replicas drift apart "
        "between syncs), no bound with iid or seldp; 0: no bound (the published rule, the "
        "gradient votes alone decide)",
    )
    aggregation: str = _f(
        "params", "SelSync: average parameters or gradients", choices=("params", "grads")
    )
    overlap: bool = _f(
        False,
        "BSP: allreduce the gradients in 25 MB buckets while the backward pass runs (as "
        "Horovod and DDP do); off: one allreduce after it, faster on the 2-core benchmark host "
        "(benchmarks/bench_overhead.py); try it on nodes with cores to spare",
    )
    fedavg_period: int = _f(10, "FedAvg: steps between parameter averages")
    inner_steps: str = _f(
        "fixed",
        "fedavg/local with unequal batches: 'speed' splits each rank's batch into as many "
        "local steps as it takes samples per step over the smallest batch's rank, each step "
        "of about that smallest batch, so faster ranks take more local steps between averages "
        "(DiLoCo with local steps sized by measured speed); 'fixed': one step per batch",
        choices=("fixed", "speed"),
    )
    staleness: int = _f(
        2, "SSP: steps a rank may run ahead of the slowest (0: every rank waits, as BSP)"
    )
    outer_optimizer: str = _f(
        "none",
        "outer step after every parameter average (fedavg, selsync, local): nesterov is DiLoCo "
        "(with --sync fedavg), sgd without look-ahead; none: plain averaging",
        choices=("none", "sgd", "nesterov"),
    )
    outer_lr: float = _f(0.7, "outer optimizer: learning rate on the averaged pseudo-gradient")
    outer_momentum: float = _f(
        0.5,
        "outer optimizer: momentum (DiLoCo's 0.9 is for rounds of ~500 steps; 0 with sgd and "
        "lr 1: plain averaging)",
    )
    drift_correction: str = _f(
        "auto",
        "policies that average parameters (selsync, fedavg, local): each replica adds, per "
        "local step, how much less than the average it moved in the last round, so label-"
        "skewed replicas stop drifting apart (SCAFFOLD's correction in parameter space; no "
        "extra communication). auto: on with --partition labels or dirichlet",
        choices=("auto", "on", "off"),
    )
    drift_smoothing: float = _f(
        1.0, "drift correction: weight of the newest round in the average of rounds (0, 1]"
    )
    # Batching
    batching: str = _f(
        "uniform", "how the global batch is split", choices=("uniform", "static", "dynamic")
    )
    weights: str = _f("", "static batching: per-rank weights, e.g. '1,2'")
    batch_interval: int = _f(10, "dynamic batching: steps between re-allocations")
    b_min: int = _f(1, "dynamic batching: smallest batch of a rank")
    slowdown: str = _f("", "emulated slow ranks, 'rank:factor@step,...' e.g. '1:2@0'")
    link: str = _f(
        "",
        "emulated link for every collective, e.g. '1gbit', '10gbit:20us' (an emulation: each "
        "transfer lasts at least as long as on that link; off by default)",
    )
    slowdown_mode: str = _f(
        "sleep",
        "how an emulated slow rank spends its extra time: asleep (sleep: frees its core) or "
        "computing (busy: as a slower node would; with more ranks than cores it takes time "
        "from the others)",
        choices=("sleep", "busy"),
    )
    # Pipeline
    pipeline_stages: int = _f(1, "pipeline stages P (world = P x data-parallel replicas)")
    micro_batches: int = _f(4, "micro-batches per batch with pipeline stages")
    schedule: str = _f("1f1b", "pipeline schedule", choices=("1f1b", "gpipe", "zb"))
    # Reliability and output
    eval_every: int = _f(
        1, "epochs between test evaluations on rank 0 (0: only at the end)", operational=True
    )
    run_dir: str = _f(
        "",
        "run directory: metrics, checkpoints, summary (default: a new runs/run-<N>); hethpc "
        "writes only into a new, empty or earlier hethpc run directory",
        operational=True,
    )
    checkpoint_every: int = _f(
        0, "steps between checkpoints (0: only at the end)", operational=True
    )
    keep_checkpoints: int = _f(
        3, "checkpoints kept on disk (older ones are deleted)", operational=True
    )
    resume: bool = _f(
        False, "continue from the newest valid checkpoint in the run directory", operational=True
    )
    resume_changes: str = _f(
        "",
        "with --resume: settings that may differ from the checkpoint's, comma-separated, e.g. "
        "'lr,epochs' (every other setting that changes the result must match)",
        operational=True,
    )
    on_nonfinite: str = _f(
        "skip",
        "a NaN/Inf loss or gradient on any rank: skip the step everywhere, or stop",
        choices=("skip", "stop"),
        operational=True,
    )
    max_skipped_steps: int = _f(
        10,
        "with --on-nonfinite skip: steps skipped in a row before the job stops",
        operational=True,
    )
    watchdog_s: float = _f(
        30.0,
        "end the job when no rank made progress for this long (seconds; the limit grows to "
        "20x the slowest step seen, up to --watchdog-max-s; 0: never)",
        operational=True,
    )
    watchdog_max_s: float = _f(
        1800.0, "the watchdog's limit never grows past this (seconds)", operational=True
    )
    progress: bool = _f(
        True,
        "rank 0 shows progress: a bar on a terminal, else (a SLURM log, a pipe) a plain line "
        "every --progress-every-s seconds",
        local=True,
    )
    progress_every_s: float = _f(
        30.0, "seconds between plain progress lines when the output is not a terminal", local=True
    )
    csv: bool = _f(
        False,
        "also write rank 0's metrics to <run-dir>/csv/metrics.csv (one row per step or epoch "
        "record, as Lightning's CSVLogger)",
        operational=True,
    )
    tensorboard: bool = _f(
        False,
        "also write TensorBoard event files to <run-dir>/tensorboard (torch.utils.tensorboard; "
        "view with: tensorboard --logdir <run-dir>/tensorboard)",
        operational=True,
    )

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            object.__setattr__(self, f.name, check_type(f.name, getattr(self, f.name), str(f.type)))
            choices = f.metadata.get("choices")
            value = getattr(self, f.name)
            if choices and value not in choices:
                raise ConfigError(f"{f.name} = {value!r} is not one of {list(choices)}", key=f.name)
        positive = (
            "samples",
            "epochs",
            "batch_size",
            "keep_checkpoints",
            "sync_window",
            "fedavg_period",
            "batch_interval",
            "b_min",
            "labels_per_rank",
            "pipeline_stages",
            "micro_batches",
        )
        for name in positive:
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1, got {getattr(self, name)}", key=name)
        for name in ("lr", "dirichlet_alpha", "outer_lr"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}", key=name)
        for name in (
            "max_steps",
            "checkpoint_every",
            "eval_every",
            "max_skipped_steps",
            "watchdog_s",
            "watchdog_max_s",
            "progress_every_s",
            "threshold",
            "weight_decay",
            "staleness",
        ):
            if getattr(self, name) < 0:
                raise ConfigError(
                    f"{name} must not be negative, got {getattr(self, name)}", key=name
                )
        for name in ("inject_alpha", "inject_beta"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"{name} must be in [0, 1], got {getattr(self, name)}", key=name)
        if self.max_local_steps < -1:
            raise ConfigError(
                f"max_local_steps must be -1 (auto), 0 (no bound) or more, got "
                f"{self.max_local_steps}",
                key="max_local_steps",
            )
        for name in ("momentum", "outer_momentum"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(
                    f"{name} must be in [0, 1), got {getattr(self, name)}", key=name
                )
        if self.outer_optimizer != "none" and (
            self.sync in ("bsp", "ssp") or (self.sync == "selsync" and self.aggregation == "grads")
        ):
            what = {"bsp": "bsp averages gradients", "ssp": "ssp adds updates"}.get(
                self.sync, "selsync with aggregation grads averages gradients"
            )
            raise ConfigError(
                f"outer_optimizer = {self.outer_optimizer!r} steps on averaged parameters, but "
                f"sync {what}; use sync fedavg (DiLoCo), selsync with aggregation params, or "
                "local",
                key="outer_optimizer",
            )
        if not 0.0 < self.drift_smoothing <= 1.0:
            raise ConfigError(
                f"drift_smoothing must be in (0, 1], got {self.drift_smoothing}",
                key="drift_smoothing",
            )
        if self.drift_correction == "on" and (
            self.sync in ("bsp", "ssp") or (self.sync == "selsync" and self.aggregation == "grads")
        ):
            raise ConfigError(
                f"drift_correction = 'on' corrects local steps between parameter averages, but "
                f"sync {self.sync}"
                + (" with aggregation grads" if self.sync == "selsync" else "")
                + " has none; use sync selsync (aggregation params), fedavg or local, or "
                "drift_correction auto",
                key="drift_correction",
            )
        if self.rebalance == "on" and self.pipeline_stages > 1:
            raise ConfigError(
                "rebalance = 'on' moves samples between data-parallel ranks, which is not built "
                "for pipeline runs; use rebalance auto or off with pipeline_stages > 1",
                key="rebalance",
            )
        if self.rebalance == "on" and self.sync == "ssp":
            raise ConfigError(
                "sync ssp lets ranks step at their own pace, but rebalancing exchanges samples "
                "between ranks every step; use rebalance auto or off with ssp",
                key="rebalance",
            )
        if self.overlap and (self.sync != "bsp" or self.pipeline_stages > 1):
            raise ConfigError(
                f"overlap sends BSP's gradients during the backward pass, but this run uses sync "
                f"{self.sync} with {self.pipeline_stages} pipeline stage(s); use it with sync "
                "bsp and pipeline_stages 1, or turn it off",
                key="overlap",
            )
        if self.inner_steps == "speed" and self.sync not in ("fedavg", "local"):
            raise ConfigError(
                f"inner_steps = 'speed' sizes local steps between parameter averages, but sync "
                f"{self.sync} has none to size; use sync fedavg (with outer_optimizer nesterov: "
                "DiLoCo) or local",
                key="inner_steps",
            )
        if self.inner_steps == "speed" and self.batching == "uniform":
            raise ConfigError(
                "inner_steps = 'speed' follows each rank's measured speed through its batch "
                "size, but batching uniform gives every rank the same; use batching dynamic",
                key="inner_steps",
            )
        if self.sync == "ssp" and self.batching == "dynamic":
            raise ConfigError(
                "sync ssp lets ranks step at their own pace, but batching dynamic re-splits the "
                "batch in a collective every batch_interval steps, which would hold them "
                "together; use batching uniform or static with ssp",
                key="batching",
            )
        if self.sync == "ssp" and self.inject_alpha > 0:
            raise ConfigError(
                "sync ssp lets ranks step at their own pace, but data injection exchanges "
                "samples between ranks every step; use inject_alpha 0 with ssp",
                key="inject_alpha",
            )
        if self.b_min > self.batch_size:
            raise ConfigError(
                f"b_min = {self.b_min} is larger than batch_size = {self.batch_size}", key="b_min"
            )
        if self.watchdog_s and self.watchdog_max_s < self.watchdog_s:
            raise ConfigError(
                f"watchdog_max_s = {self.watchdog_max_s} is below watchdog_s = "
                f"{self.watchdog_s}; the ceiling must be at least the floor",
                key="watchdog_max_s",
            )
        try:
            parse_link(self.link)
        except LinkError as e:
            raise ConfigError(str(e), key="link") from None
        names = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(self.resume_change_set()) - names)
        if unknown:
            raise ConfigError(
                f"resume_changes names unknown setting(s) {unknown}; use setting names such "
                "as 'lr,epochs'",
                key="resume_changes",
            )

    def resume_change_set(self) -> tuple[str, ...]:
        """The settings ``resume_changes`` allows to differ (dashes read as underscores)."""
        items = (n.strip().replace("-", "_") for n in self.resume_changes.split(","))
        return tuple(n for n in items if n)

    def to_dict(self) -> dict[str, Any]:
        """All settings as a plain dict (JSON- and TOML-friendly)."""
        return dataclasses.asdict(self)

    def shared(self) -> dict[str, Any]:
        """The settings every rank must agree on (all but the node-local ones)."""
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if not f.metadata["local"]
        }

    def digest(self) -> str:
        """sha256 of :meth:`shared` in canonical JSON: equal digests mean equal settings."""
        blob = json.dumps(self.shared(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()


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


def make_config(values: Mapping[str, Any], sources: Mapping[str, str] | None = None) -> TrainConfig:
    """A :class:`TrainConfig` from ``values``; an error names where the faulty value came from.

    Args:
        values: settings by field name.
        sources: where each value was set, e.g. ``{"lr": "--lr", "epochs": "run.toml line 3"}``.

    Raises:
        ConfigError: an unknown or invalid setting, with its source appended.
    """
    known = {f.name for f in config_fields()}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(f"unknown setting(s) {unknown}")
    try:
        return TrainConfig(**values)
    except ConfigError as e:
        where = (sources or {}).get(e.key or "")
        if where:
            raise ConfigError(f"{e} (set by {where})", key=e.key) from None
        raise


def resume_differences(saved: Mapping[str, Any], config: TrainConfig) -> list[str]:
    """The settings that change the result and differ from a checkpoint's, as ``name: a -> b``.

    Operational settings (paths, checkpoint cadence, watchdog, display) and those named in
    ``config.resume_changes`` may differ. A setting the checkpoint does not know (added
    since) counts as different only when it is not at its default.
    """
    allowed = set(config.resume_change_set())
    out = []
    for f in config_fields():
        if f.metadata["operational"] or f.name in allowed:
            continue
        now = getattr(config, f.name)
        before = saved.get(f.name, f.default)
        if json.dumps(before) != json.dumps(now):
            out.append(f"{f.name}: {before!r} -> {now!r}")
    return out


def config_fields() -> list[dataclasses.Field[Any]]:
    """The fields of :class:`TrainConfig`, in declaration order."""
    return list(dataclasses.fields(TrainConfig))


def load_toml(path: str | Path) -> dict[str, Any]:
    """Read settings from a TOML file: top-level ``key = value`` pairs named like the fields.

    Tables (``[sync]``) are allowed for grouping; their keys are read as if top-level.
    Dashes in keys are read as underscores (``batch-size`` = ``batch_size``).

    Raises:
        ConfigError: the file cannot be parsed, or a key is not a setting.
    """
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"cannot read config file {path}: {e}") from e
    flat: dict[str, Any] = {}
    for key, value in raw.items():
        items = value.items() if isinstance(value, dict) else [(key, value)]
        for k, v in items:
            flat[k.replace("-", "_")] = v
    known = {f.name for f in config_fields()}
    unknown = sorted(set(flat) - known)
    if unknown:
        raise ConfigError(
            f"{path}: unknown setting(s) {unknown}; see 'jobs/train.py --help' for the names"
        )
    return flat


_TOML_KEY = re.compile(r"""^\s*["']?([A-Za-z0-9_-]+)["']?\s*=""")


def toml_sources(path: str | Path) -> dict[str, str]:
    """Where each key of a TOML file is set, as ``{"lr": "run.toml line 3"}`` (for messages)."""
    out: dict[str, str] = {}
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return out
    for number, line in enumerate(lines, start=1):
        m = _TOML_KEY.match(line)
        if m:
            out.setdefault(m.group(1).replace("-", "_"), f"{path} line {number}")
    return out


def check_same_config(config: TrainConfig, group: Group | None = None) -> None:
    """Refuse to train unless every rank has the same settings (compared by digest first).

    Raises:
        ConfigError: on every rank, naming each differing setting and the ranks' values.
    """
    digests = comm.allgather_object(config.digest(), group)
    if len(set(digests)) == 1:
        return
    shared = comm.allgather_object(config.shared(), group)
    diffs = []
    for name in shared[0]:
        values = [s[name] for s in shared]
        if len({json.dumps(v) for v in values}) > 1:
            per_rank = ", ".join(f"rank {r}: {v!r}" for r, v in enumerate(values))
            diffs.append(f"{name} ({per_rank})")
    raise ConfigError(
        "the ranks run different configurations; differing settings: "
        + "; ".join(diffs)
        + ". Launch every rank with the same flags and config file."
    )
