"""The training loop: composes data, batching, sync, checkpoints, metrics and the guards."""

from __future__ import annotations

import copy
import json
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from hethpc import comm
from hethpc.comm import ReduceOp
from hethpc.data import (
    ArrayDataset,
    ShardedDataset,
    load_mnist1d,
    open_dataset_shared,
)
from hethpc.models import build_model
from hethpc.sync import average_model_
from hethpc.train import parts
from hethpc.train.checkpoint import CheckpointManager
from hethpc.train.config import ConfigError, TrainConfig
from hethpc.train.config_compare import check_same_config, resume_differences
from hethpc.train.engine import check_pipeline_config, make_engine
from hethpc.train.errors import NonFiniteError
from hethpc.train.evaluation import Metric, accuracy, evaluate, metric_key
from hethpc.train.faults import Fault, apply_faults
from hethpc.train.guards import (
    AveragedGradientGuard,
    check_same_model,
    local_nonfinite,
    nonfinite_ranks,
    poison_if_nonfinite_,
)
from hethpc.train.losses import make_loss
from hethpc.train.metrics import open_run
from hethpc.train.progress import Progress
from hethpc.train.rng import seed_rank
from hethpc.train.rundir import RunDirError, claim, next_run_dir
from hethpc.train.state import Components, gather_state, restore_state
from hethpc.train.watchdog import Watchdog


@dataclass
class RunResult:
    """What a finished run reports (the same on every rank)."""

    summary: dict[str, Any]
    model: nn.Module
    run_dir: Path
    checkpoint: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def load_data(cfg: TrainConfig) -> tuple[ArrayDataset | ShardedDataset, ArrayDataset]:
    """``(train, test)`` for ``cfg.data``.

    ``mnist1d`` is generated into the cache (rank 0 first, so the others only read it); any
    other value is a directory holding ``train/`` and ``test/`` HDF5 shard datasets (as written
    by ``data_tools/convert.py``), verified against their manifests before training (each rank
    hashes a share of the shards; every rank raises the same error on damage). The test split is
    read into memory for evaluation.
    """
    if cfg.data != "mnist1d":
        root = Path(cfg.data)
        train = open_dataset_shared(root / "train")  # each rank hashes a share of the shards
        test = open_dataset_shared(root / "test")
        x, y = test.read(np.arange(len(test)))  # as stored: evaluate() scales uint8 as training
        return train, ArrayDataset(np.asarray(x), np.asarray(y), int(test.num_classes))
    cache = cfg.cache_dir or str(Path.home() / ".cache" / "hethpc")
    if comm.rank() == 0:
        load_mnist1d(num_samples=cfg.samples, seed=cfg.data_seed, cache_dir=cache)
    comm.barrier()
    return load_mnist1d(num_samples=cfg.samples, seed=cfg.data_seed, cache_dir=cache)


def sample_shape(train: Any) -> tuple[int, ...]:
    """The shape of one training sample."""
    return tuple(train.sample_shape) if hasattr(train, "sample_shape") else tuple(train.x.shape[1:])


def build(cfg: TrainConfig, train: Any) -> nn.Module:
    """The model, initialised from ``cfg.seed`` (identical on every rank before the broadcast)."""
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model, sample_shape(train), int(train.num_classes))
    with torch.no_grad():
        model(torch.zeros(2, *sample_shape(train)))  # materialise lazy layers
    return model


def make_optimizer(
    cfg: TrainConfig, model: nn.Module, total_steps: int
) -> tuple[torch.optim.Optimizer, Any]:
    """The optimizer and its per-step learning-rate schedule."""
    opt: torch.optim.Optimizer
    if cfg.optimizer == "sgd":
        opt = torch.optim.SGD(
            model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay
        )
    else:
        opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    factor: Callable[[int], float]
    if cfg.lr_schedule == "cosine":
        factor = lambda s: 0.5 * (1 + math.cos(math.pi * min(s, total_steps) / max(total_steps, 1)))  # noqa: E731
    elif cfg.lr_schedule == "step":
        factor = lambda s: 0.1 ** (3 * s // max(total_steps, 1))  # noqa: E731
    else:
        factor = lambda s: 1.0  # noqa: E731
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)


def describe(key: str, score: float) -> str:
    """``test accuracy 91.2%`` or ``test mse 0.0123``, for the log."""
    if key == "test_acc":
        return f"test accuracy {100 * score:.1f}%"
    return f"{key.replace('_', ' ')} {score:.4g}"


def nonfinite_advice(cfg: TrainConfig, step: int, in_a_row: int, ranks: list[int]) -> str:
    """The message that stops a run whose steps keep turning NaN/Inf, with the likely cause."""
    return (
        f"{in_a_row} steps in a row (up to step {step}) had a non-finite loss or gradient, "
        f"last on rank(s) {ranks}; stopping (--max-skipped-steps {cfg.max_skipped_steps}). "
        f"Likely cause: the learning rate is too large for this model (--lr {cfg.lr}), or the "
        "data holds NaN/Inf values. Lower --lr, check the data, or raise --max-skipped-steps"
    )


def train(
    cfg: TrainConfig,
    *,
    faults: Sequence[Fault] = (),
    overwrite: bool = False,
    log: Callable[[str], None] = print,
) -> RunResult:
    """Run the training that ``cfg`` describes on every rank of the world (a collective).

    The data (``cfg.data``) and the model (``cfg.model``) are built from the settings, the
    loss is cross-entropy and the metric accuracy; :func:`hethpc.fit` takes the user's own.

    Args:
        cfg: the settings (the same on every rank; checked before anything else).
        faults: deliberate failures, for reliability tests only.
        overwrite: a fresh run may replace an earlier hethpc run in ``cfg.run_dir``.
        log: where rank 0's messages go.

    Raises:
        ConfigError: settings differ across ranks, or the run directory holds another run.
        ModelMismatchError: the ranks built different models.
        NonFiniteError: a NaN/Inf appeared and ``cfg.on_nonfinite == "stop"``.
    """
    run_dir = start_run(cfg, overwrite=overwrite, log=log)
    train_set, test_set = load_data(cfg)
    model = build(cfg, train_set)
    return run_training(
        cfg, model, train_set, test_set, run_dir=run_dir, loss_fn=make_loss(cfg.loss),
        faults=faults, log=log,
    )  # fmt: skip


def start_run(
    cfg: TrainConfig, *, overwrite: bool = False, log: Callable[[str], None] = print
) -> Path:
    """Check the settings on every rank and claim the run directory (a collective); its path.

    Raises:
        ConfigError: settings differ across ranks or do not fit the world.
        RunDirError: the run directory may not be written (the user's files, an earlier run).
    """
    rank, size = comm.rank(), comm.size()
    say = log if rank == 0 else (lambda _msg: None)
    check_same_config(cfg)
    if cfg.pipeline_stages > 1:
        check_pipeline_config(cfg, size)
    if torch.cuda.is_available():
        # CPU kernels used here are deterministic already; on CPU this call would only cost
        # seconds of imports (it loads torch._inductor).
        # warn_only: cuBLAS needs CUBLAS_WORKSPACE_CONFIG for determinism; without it, warn.
        torch.use_deterministic_algorithms(True, warn_only=True)
    refusal, chosen = "", cfg.run_dir
    if rank == 0:
        try:
            if not chosen and cfg.resume:
                raise RunDirError("--resume needs --run-dir: the directory of the run to continue")
            chosen = str(chosen or next_run_dir())
            claim(chosen, digest=cfg.digest(), resume=cfg.resume, overwrite=overwrite)
        except RunDirError as e:
            refusal = str(e)
    # Decided on rank 0, raised on every rank: no rank is left waiting in a collective.
    refusal, chosen = comm.broadcast_object((refusal, chosen))
    if refusal:
        raise RunDirError(refusal)
    say(f"hethpc: run directory {chosen}")
    return Path(chosen)


def run_training(
    cfg: TrainConfig,
    model: nn.Module,
    train_set: ArrayDataset | ShardedDataset,
    test_set: ArrayDataset | None,
    *,
    run_dir: Path,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    metric: Metric = accuracy,
    faults: Sequence[Fault] = (),
    log: Callable[[str], None] = print,
) -> RunResult:
    """The training loop over a built model and data, after :func:`start_run` (a collective).

    Args:
        cfg: the settings.
        model: the same architecture on every rank (rank 0's weights are broadcast).
        train_set: the training data.
        test_set: evaluated with ``metric`` at epoch ends and at the end; None: never.
        run_dir: from :func:`start_run`.
        loss_fn: ``loss_fn(model(x), y)``, a scalar mean over the batch (default
            cross-entropy).
        metric: ``metric(model(x), y)``, a batch mean (default accuracy).
        faults: deliberate failures, for reliability tests only.
        log: where rank 0's messages go.
    """
    rank, size = comm.rank(), comm.size()
    say = log if rank == 0 else (lambda _msg: None)
    ckpts = CheckpointManager(run_dir / "checkpoints", keep=cfg.keep_checkpoints)
    loss_fn = loss_fn if loss_fn is not None else nn.CrossEntropyLoss()
    key = metric_key(metric)
    classify = metric is accuracy
    check_same_model(model)
    comm.broadcast_model(model)  # the whole model, before a pipeline cuts it into stages
    engine = make_engine(cfg, model)
    module = engine.module
    if test_set is None and engine.collective_eval:
        raise ConfigError("pipeline runs need test data to evaluate (test_data)")
    loader = parts.make_loader(cfg, train_set, rank=engine.replica, world_size=engine.replicas)
    partition_lengths = (
        None
        if cfg.partition in ("iid", "seldp")
        else np.asarray(comm.allgather_object(loader.length))[engine.replica_leaders]
    )
    controller = parts.make_controller(
        cfg, device=engine.device, group=engine.group, b_min=engine.min_batch
    )
    policy = parts.make_policy(cfg, group=engine.group)
    injector = parts.make_injector(cfg)
    rebalancer = parts.make_rebalancer(cfg, partition_lengths)
    spe = int(
        comm.allreduce_array(np.array([loader.steps_per_epoch(cfg.batch_size)]), ReduceOp.MIN)[0]
    )
    if spe < 1:
        raise ConfigError(
            f"--batch-size {cfg.batch_size} is larger than the training set of {len(train_set)}"
        )
    total = cfg.epochs * spe if cfg.max_steps == 0 else min(cfg.epochs * spe, cfg.max_steps)
    optimizer, scheduler = make_optimizer(cfg, module, total)
    components = Components(module, optimizer, scheduler, loader, controller, policy)

    start, elapsed0 = 0, 0.0
    synced = skipped = 0  # the job's own counts, carried across a resume
    seed_rank(cfg.seed, rank)
    if cfg.resume:
        found = ckpts.load_latest() if rank == 0 else None
        changed = resume_differences(found[1]["config"], cfg) if found is not None else []
        if found is not None and engine.saves_own_state and found[1]["world_size"] != size:
            changed.append(f"world size: {found[1]['world_size']} -> {size} (pipeline stages "
                           "resume only on the same layout)")  # fmt: skip
        if changed:
            found = None  # not broadcast: every rank raises below
        found, changed = comm.broadcast_object((found, changed))
        if changed:
            raise ConfigError(
                f"--resume: these settings differ from the checkpoint's in {ckpts.directory}: "
                + "; ".join(changed)
                + ". Resume with the checkpoint's settings, or allow the change with "
                + "--resume-changes "
                + ",".join(c.split(":")[0] for c in changed if not c.startswith("world size"))
            )
        if found is None:
            say(f"hethpc: no checkpoint in {ckpts.directory}; starting afresh")
        else:
            start, state = found
            elapsed0 = float(state["elapsed_s"])
            counters = state.get("counters", {})
            synced, skipped = int(counters.get("synced", 0)), int(counters.get("skipped", 0))
            same = restore_state(state, components, seed=cfg.seed)
            how = "" if same else f" (saved on {state['world_size']} ranks, re-split over {size})"
            say(f"hethpc: resumed from step {start}{how}")

    # Each rank saves its own model and optimizer state when replicas may differ, or when each
    # rank holds a different pipeline stage.
    own_state = cfg.sync != "bsp" or engine.saves_own_state

    def checkpoint(step: int) -> Path | None:
        metrics.flush()  # the records up to a checkpoint are on disk before it is
        dog.kick(step, "checkpoint")
        state = gather_state(
            components,
            step=step,
            elapsed_s=elapsed0 + time.perf_counter() - t0,
            config=cfg.to_dict(),
            replicas_differ=own_state,
            counters={"synced": synced, "skipped": skipped},
        )
        path = ckpts.save(state, step) if state is not None else None
        dog.kick(step, "barrier")
        comm.barrier()
        return path

    say(
        f"hethpc: {engine.describe()}, model {cfg.model}, {len(train_set)} train / "
        f"{len(test_set or ())} test samples, global batch {cfg.batch_size}, {spe} steps per "
        f"epoch, {total} steps, sync {cfg.sync}, batching {cfg.batching}, partition "
        f"{cfg.partition}"
    )
    metrics = open_run(run_dir, cfg.to_dict(), csv_log=cfg.csv, tensorboard=cfg.tensorboard)
    comm.set_link(comm.parse_link(cfg.link))  # emulation: every transfer as slow as the link
    params = list(module.parameters())
    # Data-parallel BSP applies the same averaged gradient on every rank: non-finite steps are
    # caught there, without a per-step vote. Other policies, and pipelines, vote.
    bsp_guard = cfg.sync == "bsp" and not engine.saves_own_state
    average_at_eval = cfg.sync != "bsp" and not engine.saves_own_state and size > 1
    guard = AveragedGradientGuard(optimizer) if bsp_guard else None
    if bsp_guard and cfg.inner_steps != "speed":
        engine.zero_in_place = True  # type: ignore[union-attr]
    bar = (
        Progress(total, start, every_s=cfg.progress_every_s, log=say)
        if cfg.progress and rank == 0
        else None
    )
    if bar is not None:
        say = bar.write  # messages from here on never land inside the bar
    seen = in_a_row = 0
    first_loss: torch.Tensor | None = None
    last_losses: deque[torch.Tensor] = deque(maxlen=10)
    last_path: Path | None = None
    t0 = time.perf_counter()

    def tick() -> None:
        dog.kick(None, "evaluate")

    policy.prepare(module)  # what it shares across ranks (collective), before any step
    dog = Watchdog(
        cfg.watchdog_s, max_s=cfg.watchdog_max_s, heartbeat_dir=run_dir / "heartbeat",
        rank=rank, size=size,
    )  # fmt: skip
    try:
        with dog:
            for step in range(start, total):
                dog.kick(step, "data")
                sizes = np.asarray(controller.batch_sizes)
                b, big_b = int(sizes[engine.replica]), int(sizes.sum())
                weight = parts.gradient_weight(
                    cfg.partition, rank=engine.replica, batch_sizes=sizes,
                    partition_lengths=partition_lengths, rebalanced=rebalancer is not None,
                )  # fmt: skip
                ask = (
                    sizes
                    if injector is None
                    else np.array([injector.local_batch(int(s)) for s in sizes])
                )
                if rebalancer is None:
                    x, y = loader.next_batch(ask)
                else:  # each partition's share of the batch, the surplus to the fast ranks
                    x, y = rebalancer.exchange(*loader.next_batch(rebalancer.reads(ask)), ask)
                if injector is not None:
                    x, y = injector.exchange(x, y, step)
                dog.kick(step, "compute")
                tc = time.perf_counter()

                def poison(value: torch.Tensor, step: int = step) -> torch.Tensor:
                    return apply_faults(tuple(faults), rank=rank, step=step, loss=value)

                local_steps, lrs = 1, None
                if cfg.inner_steps == "speed":  # every local step but the last here
                    splits = parts.inner_step_sizes(sizes, engine.replica, rows=len(y))
                    edges = np.cumsum([0, *splits])
                    # Linear scaling: a local step of b rows moves b / (B / N) as far as one
                    # of the uniform batch would, so a round moves as far per sample.
                    lrs = [g["lr"] for g in optimizer.param_groups]
                    for g in optimizer.param_groups:
                        g["lr"] *= float(np.mean(splits)) * len(sizes) / big_b
                    for lo, hi in zip(edges[:-2], edges[1:-1], strict=True):
                        inner, _ = engine.compute(x[lo:hi], y[lo:hi], loss_fn, poison)
                        assert inner is not None
                        if not local_nonfinite(inner, (p.grad for p in params)):
                            optimizer.step()  # a bad local step is dropped on this rank alone
                    x, y = x[edges[-2] :], y[edges[-2] :]
                    local_steps = len(splits)
                policy.before_backward(module, weight=weight)  # BSP overlap: arm the buckets
                loss, out = engine.compute(x, y, loss_fn, poison)
                compute_s = engine.step_time(controller.timer_stop(tc))
                dog.kick(step, "sync")
                link_before = comm.link_stats() if cfg.link else None
                bad: list[int] = []
                if guard is not None:
                    assert loss is not None
                    # BSP: a NaN/Inf travels in the gradient allreduce and the guard skips the
                    # update on every rank alike; ranks are named (a vote) only when it trips.
                    poison_if_nonfinite_(loss, [p.grad for p in params])
                    record = policy.step(module, optimizer, weight=weight, compute_s=compute_s)
                    if guard.tripped:  # name the ranks by their loss (no pass over gradients
                        # on every step); a NaN gradient under a finite loss names them all
                        bad = nonfinite_ranks(not bool(torch.isfinite(loss))) or list(range(size))
                else:
                    here = loss if loss is not None else 0.0
                    mine_bad = local_nonfinite(here, (p.grad for p in params))
                    if policy.asynchronous:  # no vote: each rank skips its own bad steps
                        bad = [rank] if mine_bad else []
                        if bad:
                            policy.skip(module)
                        else:
                            record = policy.step(
                                module, optimizer, weight=weight, compute_s=compute_s
                            )
                    elif policy.group is None:  # the world agrees inside the policy's vote
                        record = policy.step(
                            module, optimizer, weight=weight, compute_s=compute_s,
                            finite=not mine_bad,
                        )  # fmt: skip
                        bad = list(record.nonfinite)
                    else:  # pipeline stages: every stage of every replica skips alike
                        bad = nonfinite_ranks(mine_bad)
                        if not bad:
                            record = policy.step(
                                module, optimizer, weight=weight, compute_s=compute_s
                            )
                in_a_row = in_a_row + 1 if bad else 0
                if bad:
                    where = f"non-finite loss or gradient at step {step} on rank(s) {bad}"
                    if cfg.on_nonfinite == "stop":
                        raise NonFiniteError(f"{where}; stopping (--on-nonfinite stop)")
                    if in_a_row > cfg.max_skipped_steps:
                        raise NonFiniteError(nonfinite_advice(cfg, step, in_a_row, bad))
                    there = "there" if policy.asynchronous else "on every rank"
                    say(f"hethpc: {where}; skipping the step {there}")
                    optimizer.zero_grad()
                    skipped += 1
                    is_synced, sync_s = False, 0.0
                else:
                    is_synced, sync_s = bool(record.synced), float(record.sync_s)
                    if loss is not None:
                        first_loss = loss.detach() if first_loss is None else first_loss
                        last_losses.append(loss.detach())
                if lrs is not None:  # the scheduler's own rates again, before it steps
                    for g, lr in zip(optimizer.param_groups, lrs, strict=True):
                        g["lr"] = lr
                scheduler.step()
                synced += is_synced
                link_after = comm.link_stats() if cfg.link else None
                controller.update(step=step, compute_s=compute_s)
                seen += big_b
                now = elapsed0 + time.perf_counter() - t0
                with torch.no_grad():  # tensors, made numbers when the metrics are written
                    acc = (
                        accuracy(out, y.to(out.device))
                        if classify and out is not None and len(y)
                        else float("nan")
                    )
                    metrics.write(
                        "step",
                        step=step,
                        epoch=step // spe,
                        time=now,
                        loss=loss.detach() if loss is not None else None,
                        acc=acc,
                        batch=b,
                        compute_s=compute_s,
                        sync_s=sync_s,
                        synced=is_synced,
                        decision="SYNC" if is_synced else "LOCAL",
                        skipped=bool(bad),
                        lr=scheduler.get_last_lr()[0],
                        **({"local_steps": local_steps} if cfg.inner_steps == "speed" else {}),
                        **({"batch_sizes": sizes.tolist()} if rank == 0 and size > 1 else {}),
                        **engine.step_fields(),
                        **(
                            {
                                "link_real_s": link_after.real_s - link_before.real_s,
                                "link_wait_s": link_after.waited_s - link_before.waited_s,
                            }
                            if link_after is not None and link_before is not None
                            else {}
                        ),
                    )
                if bar is not None:
                    shown = None
                    if step % 20 == 0 or step + 1 == total:
                        shown = {"acc": f"{float(acc):.2f}"} if classify and out is not None else {}
                        if loss is not None:
                            shown = {"loss": f"{float(loss.detach()):.3f}", **shown}
                        shown["sps"] = f"{seen / (time.perf_counter() - t0):,.0f}"
                    bar.update(shown)
                epoch_done = (step + 1) % spe == 0
                if epoch_done:
                    metrics.flush()
                every = cfg.eval_every * spe
                evaluating = test_set is not None and every and (step + 1) % every == 0
                if epoch_done and evaluating and (engine.collective_eval or average_at_eval):
                    # Replicas that step locally are scored as their average (what the run
                    # would end with), taken on every rank (a collective) into a copy.
                    assert test_set is not None
                    if engine.collective_eval:
                        got = engine.evaluate(test_set, metric, tick=tick)
                    else:
                        scored = copy.deepcopy(module)
                        average_model_(scored, weight=weight, group=engine.group)
                        got = 0.0
                        if rank == 0:
                            got = evaluate(scored, test_set, metric=metric, tick=tick)
                elif epoch_done and evaluating and rank == 0:
                    assert test_set is not None
                    got = engine.evaluate(test_set, metric, tick=tick)
                if epoch_done and evaluating and rank == 0:
                    metrics.write("epoch", step=step, epoch=step // spe, time=now, **{key: got})
                    msg = (
                        f"epoch {(step + 1) // spe}/{cfg.epochs}  {describe(key, got)}  "
                        f"({now:.1f} s)"
                    )
                    say(msg)
                if (
                    cfg.checkpoint_every
                    and (step + 1) % cfg.checkpoint_every == 0
                    and step + 1 < total
                ):
                    last_path = checkpoint(step + 1)
                dog.kick()
            if bar is not None:
                bar.close()
            elapsed = elapsed0 + time.perf_counter() - t0
            last_path = checkpoint(total) if start < total or not ckpts.steps() else last_path
            dog.kick(total, "sync")
            parts.finish_policy(policy, module)
            policy.close()
            score = None
            if test_set is not None:
                score = engine.evaluate(test_set, metric, tick=tick)
    finally:
        emulated = comm.link_stats()
        comm.set_link(None)
        metrics.close()
        if guard is not None:
            guard.remove()
    done = total - start
    # The policy counts only this process's steps (and BSP counts skipped steps as synced):
    # the job's own counts, carried through checkpoints, win.
    policy_figures = {
        k: v
        for k, v in parts.policy_summary(policy).items()
        if k not in ("steps", "synced_steps", "sync_fraction")
    }
    # First and final (mean of the last 10) loss, from the rank that reports them.
    reports = rank == engine.loss_rank and first_loss is not None and last_losses
    first_last = np.array(
        [float(first_loss), float(torch.stack(list(last_losses)).mean())]  # type: ignore[arg-type]
        if reports
        else [0.0, 0.0]
    )
    first_last = comm.allreduce_array(first_last, ReduceOp.SUM)
    summary = {
        **policy_figures,
        key: score,
        "time_s": elapsed,
        "steps": total,
        "synced_steps": synced,
        "samples_per_s": done * cfg.batch_size / max(elapsed - elapsed0, 1e-9) if done else None,
        "sync_fraction": synced / total if total else None,
        "skipped_steps": skipped,
        "first_loss": float(first_last[0]) if done else None,
        "final_loss": float(first_last[1]) if done else None,
        "final_batch_sizes": [int(s) for s in np.asarray(controller.batch_sizes)],
        "world_size": size,
        **(
            {"link": cfg.link, "comm_real_s": emulated.real_s,
             "comm_emulated_wait_s": emulated.waited_s}
            if cfg.link
            else {}
        ),  # fmt: skip
        **engine.summary_fields(),
        "config": cfg.shared(),
    }
    if rank == 0:
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    return RunResult(summary=summary, model=module, run_dir=run_dir, checkpoint=last_path)
