"""The training loop: composes data, batching, sync, checkpoints, metrics and the guards.

There is one loop, for the job, :func:`hethpc.fit` and both step engines. Its parts live
beside it: building the run (:mod:`~hethpc.train.parts.assembly`), one step
(:mod:`~hethpc.train.run.step`), the end of an epoch (:mod:`~hethpc.train.run.epoch`), checkpoints
(:mod:`~hethpc.train.run.checkpoints`) and the summary (:mod:`~hethpc.train.run.finish`).
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from hethpc import comm
from hethpc.data import ArrayDataset, ShardedDataset
from hethpc.data.holdout import holdout
from hethpc.data.transform import is_sequence
from hethpc.train.errors import TrainingInterrupted
from hethpc.train.evaluation import Metric, accuracy, default_metric, metric_key, scored
from hethpc.train.keep.rng import seed_rank
from hethpc.train.losses import cross_entropy, make_loss
from hethpc.train.parts.assembly import assemble
from hethpc.train.parts.build import build, check_outputs, load_data
from hethpc.train.parts.capabilities import finish_policy
from hethpc.train.report.metrics import open_run
from hethpc.train.report.progress import Progress
from hethpc.train.report.tally import Tally
from hethpc.train.run.checkpoints import RunCheckpoints
from hethpc.train.run.epoch import EpochEnd
from hethpc.train.run.finish import summarize
from hethpc.train.run.start import start_run
from hethpc.train.run.step import TrainStep
from hethpc.train.settings.config import ConfigError, TrainConfig
from hethpc.train.watch.faults import Fault
from hethpc.train.watch.guards import AveragedGradientGuard
from hethpc.train.watch.watchdog import Watchdog


@dataclass
class RunResult:
    """What a finished run reports (the same on every rank)."""

    summary: dict[str, Any]
    model: nn.Module
    run_dir: Path
    checkpoint: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """Keep Python's collector off the objects that exist when training starts.

    The interpreter, torch, the data and the model hold a few hundred thousand objects; every
    full collection walks them all (150-200 ms on the benchmark host, paid by every rank at the
    same step, inside its allreduce). Frozen (``gc.freeze``), they are skipped until the loop
    ends; what the steps allocate is still collected. Call ``gc.collect()`` first, so that
    no garbage is frozen with them. A process that froze its heap itself keeps it as it was.
    """
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def train(
    cfg: TrainConfig,
    *,
    faults: Sequence[Fault] = (),
    overwrite: bool = False,
    log: Callable[[str], None] = print,
) -> RunResult:
    """Run the training that ``cfg`` describes on every rank of the world (a collective).

    The data (``cfg.data``) and the model (``cfg.model``) are built from the settings, the
    loss is ``cfg.loss`` (cross-entropy by default, per position for token windows) and the
    metric accuracy, or bits per byte for token windows; :func:`hethpc.fit` takes the user's
    own. A ``val/`` split beside ``train/`` is scored during training, ``test/`` at the end.

    Args:
        cfg: the settings (the same on every rank; checked before anything else).
        faults: deliberate failures, for reliability tests only.
        overwrite: a fresh run may replace an earlier hethpc run in ``cfg.run_dir``.
        log: where rank 0's messages go.

    Raises:
        ConfigError: settings differ across ranks, the run directory holds another run, or
            ``cfg.val_fraction`` is set for data that holds a ``val/`` split.
        ModelMismatchError: the ranks built different models.
        NonFiniteError: a NaN/Inf appeared and ``cfg.on_nonfinite == "stop"``.
        TrainingInterrupted: a ``KeyboardInterrupt`` (Ctrl-C) stopped the loop: the steps
            done and the checkpoint kept, as this rank knows them (see :func:`run_training`).
    """
    run_dir = start_run(cfg, overwrite=overwrite, log=log)
    train_set, test_set, val_set = load_data(cfg)
    model = build(cfg, train_set)
    check_outputs(
        model, train_set, loss=cfg.loss, what=f"--model {cfg.model}",
        fix="a factory is called as make(sample_shape, num_classes): size its last layer by "
        "num_classes",
    )  # fmt: skip
    return run_training(
        cfg, model, train_set, test_set, run_dir=run_dir, loss_fn=make_loss(cfg.loss),
        faults=faults, log=log, val_set=val_set,
    )  # fmt: skip


def run_training(
    cfg: TrainConfig,
    model: nn.Module,
    train_set: ArrayDataset | ShardedDataset,
    test_set: ArrayDataset | None,
    *,
    run_dir: Path,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    metric: Metric | None = None,
    faults: Sequence[Fault] = (),
    log: Callable[[str], None] = print,
    val_set: ArrayDataset | None = None,
) -> RunResult:
    """The training loop over a built model and data, after :func:`start_run` (a collective).

    Args:
        cfg: the settings.
        model: the same architecture on every rank (rank 0's weights are broadcast).
        train_set: the training data.
        test_set: evaluated with ``metric`` at epoch ends and at the end; None: never.
        run_dir: from :func:`start_run`.
        loss_fn: ``loss_fn(model(x), y)``, a scalar mean over the batch (default
            cross-entropy, per position for token windows).
        metric: ``metric(model(x), y)``, a batch mean (default
            :func:`~hethpc.train.evaluation.default_metric`: accuracy, or bits per byte for
            token windows).
        faults: deliberate failures, for reliability tests only.
        log: where rank 0's messages go.
        val_set: a validation split of its own (the data's ``val/``), scored during training
            instead of ``test_set``, which is then scored at the end only; None: held out of
            ``train_set`` by ``cfg.val_fraction``, or none.

    Raises:
        ConfigError: ``val_set`` is given and ``cfg.val_fraction`` asks for another.
        TrainingInterrupted: a ``KeyboardInterrupt`` stopped the loop; it says how far this
            rank got and its latest complete checkpoint, and no collective is started after
            it (the other ranks may be stopped, or never learn of it).
    """
    rank, size = comm.rank(), comm.size()
    say = log if rank == 0 else (lambda _msg: None)
    loss_fn = loss_fn if loss_fn is not None else cross_entropy
    metric = metric if metric is not None else default_metric(train_set)
    key = metric_key(metric)
    if val_set is not None and cfg.val_fraction:
        raise ConfigError(
            f"val_fraction = {cfg.val_fraction:g} holds out a validation split, but one is "
            "given (val_set); give one or the other",
            key="val_fraction",
        )
    keep: np.ndarray | None = None
    if cfg.val_fraction:
        keep, val_set = holdout(train_set, cfg.val_fraction, cfg.data_seed)
    run = assemble(cfg, model, train_set, test_set, keep=keep, run_dir=run_dir)
    engine, module, policy, total = run.engine, run.module, run.policy, run.total
    tally = Tally()
    ckpts = RunCheckpoints(cfg, run_dir, engine, run.components, tally)
    seed_rank(cfg.seed, rank)
    if cfg.resume:
        ckpts.resume(say)
    start = tally.start
    say(
        f"hethpc: {engine.describe()}, model {cfg.model}, "
        f"{len(train_set) if keep is None else len(keep)} train / "
        + (f"{len(val_set)} validation / " if val_set is not None else "")
        + f"{len(test_set or ())} test samples, global batch {cfg.batch_size}, "
        f"{run.steps_per_epoch} steps per epoch, {total} steps, sync {cfg.sync}, batching "
        f"{cfg.batching}, partition {cfg.partition}"
    )
    # config.json also records how this run's tensors travel (CUDA-aware MPI, NCCL, staging).
    recorded = {**cfg.to_dict(), "transfers": comm.transfers().as_dict()}
    metrics = open_run(run_dir, recorded, csv_log=cfg.csv, tensorboard=cfg.tensorboard)
    if start > 0 and rank == 0:  # where this process took over (jobs/report.py marks it)
        metrics.write("resume", step=start, time=tally.elapsed0)
    comm.set_link(comm.parse_link(cfg.link))  # emulation: every transfer as slow as the link
    # Data-parallel BSP applies the same averaged gradient on every rank: non-finite steps are
    # caught there, without a per-step vote. Other policies, and pipelines, vote.
    bsp_guard = policy.keeps_replicas_equal and not engine.saves_own_state
    guard = AveragedGradientGuard(run.optimizer) if bsp_guard else None
    if bsp_guard and cfg.inner_steps != "speed":
        engine.zero_in_place = True
    bar = (
        Progress(total, start, every_s=cfg.progress_every_s, log=say)
        if cfg.progress and rank == 0
        else None
    )
    if bar is not None:
        say = bar.write  # messages from here on never land inside the bar
    gc.collect()  # before the clock starts; the loop then runs on a frozen heap
    tally.t0 = time.perf_counter()

    def tick() -> None:
        dog.kick(None, "evaluate")

    policy.prepare(module)  # what it shares across ranks (collective), before any step
    dog = Watchdog(
        cfg.watchdog_s, max_s=cfg.watchdog_max_s, heartbeat_dir=run_dir / "heartbeat",
        rank=rank, size=size,
    )  # fmt: skip
    # Step records hold the batch's accuracy (per position for token windows).
    classify = metric is accuracy or is_sequence(train_set)
    train_step = TrainStep(
        cfg, run, tally, loss_fn=loss_fn, classify=classify, faults=faults,
        guard=guard, metrics=metrics, dog=dog, bar=bar, say=say,
    )  # fmt: skip
    epoch_end = EpochEnd(
        cfg, run, test_set, metric=metric, key=key, metrics=metrics, tick=tick, say=say,
        val_set=val_set, tally=tally,
    )  # fmt: skip
    # A resumed run's checkpoint stands until this run saves one.
    last_path: Path | None = (
        ckpts.manager.path(start) if start and start in ckpts.manager.steps() else None
    )
    done = start  # steps completed, for the word on an interrupt
    try:
        with dog, frozen_heap():
            for step in range(start, total):
                train_step(step)
                epoch_end(step, weight=train_step.weight, now=train_step.now)
                if (
                    cfg.checkpoint_every
                    and (step + 1) % cfg.checkpoint_every == 0
                    and step + 1 < total
                ):
                    last_path = ckpts.save(step + 1, metrics=metrics, dog=dog)
                done = step + 1
                dog.kick()
            if bar is not None:
                bar.close()
            elapsed = tally.elapsed()
            if start < total or not ckpts.manager.steps():
                last_path = ckpts.save(total, metrics=metrics, dog=dog)
            else:  # resumed a finished run: its final checkpoint is the result's
                last_path = ckpts.manager.path(start)
            dog.kick(total, "sync")
            finish_policy(policy, module)
            policy.close()
            score = val_score = None
            also: dict[str, float] = {}  # the companions' scores (accuracy beside bpb)
            companions = [metric_key(m) for m in scored(metric)[1:]]
            if test_set is not None:
                score, *rest = engine.evaluate(test_set, scored(metric), tick=tick)
                also.update(zip(companions, rest, strict=True))
            if val_set is not None:
                val_score, *rest = engine.evaluate(val_set, scored(metric), tick=tick)
                also.update(
                    ("val" + k.removeprefix("test"), v)
                    for k, v in zip(companions, rest, strict=True)
                )
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM where the job makes it one
        if bar is not None:
            bar.close()
        saved = last_path if last_path is not None and last_path.is_file() else None
        raise TrainingInterrupted(
            str(e) or "SIGINT", step=done, total=total, checkpoint=saved, run_dir=run_dir
        ) from e
    finally:
        emulated = comm.link_stats()
        comm.set_link(None)
        metrics.close()
        if guard is not None:
            guard.remove()
    summary = summarize(
        cfg, run, tally, key=key, score=score, elapsed=elapsed, emulated=emulated,
        run_dir=run_dir, val_score=val_score, also=also,
    )  # fmt: skip
    return RunResult(summary=summary, model=module, run_dir=run_dir, checkpoint=last_path)
