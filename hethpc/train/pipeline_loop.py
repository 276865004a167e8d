"""The training loop with pipeline stages: P stages per pipeline, BSP across D replicas."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from hethpc import comm
from hethpc.comm import ReduceOp
from hethpc.data import ArrayDataset, Loader, ShardedDataset, to_inputs
from hethpc.pipeline import Pipeline, make_pipeline_groups, partition_by_params
from hethpc.train.config import ConfigError, TrainConfig
from hethpc.train.metrics import open_run
from hethpc.train.watchdog import Watchdog

# Settings a pipelined run supports; the others are refused up front (named in the error).
_UNSUPPORTED = (
    ("sync", "bsp", "--sync bsp (replicas of each stage average gradients every step)"),
    ("partition", "iid", "--partition iid"),
    ("batching", "uniform", "--batching uniform"),
    ("inject_alpha", 0.0, "no --inject-alpha"),
    ("slowdown", "", "no --slowdown"),
    ("checkpoint_every", 0, "--checkpoint-every 0"),
    ("resume", False, "no --resume"),
)


def check_pipeline_config(cfg: TrainConfig, world_size: int) -> None:
    """Refuse settings a pipelined run cannot honour yet (the same decision on every rank).

    Raises:
        ConfigError: ``--pipeline-stages`` does not divide the world size, the global batch
            does not split into replicas and micro-batches, or another setting is unsupported.
    """
    p = cfg.pipeline_stages
    if world_size % p:
        raise ConfigError(
            f"--pipeline-stages {p} must divide the number of ranks {world_size} "
            f"(world = stages x replicas); launch a multiple of {p} ranks"
        )
    d = world_size // p
    if cfg.batch_size % d or cfg.batch_size // d < cfg.micro_batches:
        raise ConfigError(
            f"--batch-size {cfg.batch_size} must split evenly over {d} replica(s) into at "
            f"least --micro-batches {cfg.micro_batches} rows each"
        )
    wrong = [need for key, want, need in _UNSUPPORTED if getattr(cfg, key) != want]
    if wrong:
        raise ConfigError(
            f"--pipeline-stages {p} supports only: {', '.join(wrong)} (not wired in yet)"
        )


def evaluate_pipeline(
    pipe: Pipeline, data: ArrayDataset, replicas: int, *, batch: int = 2048
) -> float:
    """Test accuracy through the pipelines (a collective over the world; the same everywhere)."""
    correct = 0
    pipe.module.eval()
    for i in range(0, len(data), batch):
        x = to_inputs(data.x[i : i + batch])  # scaled as in training
        out = pipe.forward(x)
        if out is not None:
            correct += int((out.argmax(1).cpu().numpy() == data.y[i : i + batch]).sum())
    pipe.module.train()
    # Each replica's last stage counted the same samples: average them.
    total = comm.allreduce_array(np.array([float(correct)]), ReduceOp.SUM)[0] / replicas
    return float(total) / max(len(data), 1)


def train_pipeline(
    cfg: TrainConfig,
    *,
    model: nn.Sequential,
    make_optimizer: Callable[[nn.Module, int], tuple[torch.optim.Optimizer, Any]],
    train_set: ArrayDataset | ShardedDataset,
    test_set: ArrayDataset,
    run_dir: Path,
    say: Callable[[str], None],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> tuple[dict[str, Any], Pipeline]:
    """Train ``model`` cut into ``cfg.pipeline_stages`` stages; returns ``(summary, pipeline)``.

    Replica ``d`` (world ranks ``d*P .. d*P+P-1``) reads batch slice ``d`` of each global
    batch; each stage's replicas average their gradients every step (BSP). Every rank of a
    pipeline reads the same batch (the first stage uses the inputs, the last the targets).
    """
    rank, size = comm.rank(), comm.size()
    groups = make_pipeline_groups(cfg.pipeline_stages)
    lay = groups.layout
    balance = partition_by_params(model, lay.stages)
    pipe = Pipeline(
        model,
        balance=balance,
        micro_batches=cfg.micro_batches,
        schedule=cfg.schedule,
        stage_group=groups.stage_group,
        dp_group=groups.dp_group,
    )
    loader = Loader(
        train_set,
        rank=lay.replica,
        world_size=lay.replicas,
        seed=cfg.seed,
        prefetch="auto" if isinstance(train_set, ShardedDataset) else False,
    )
    sizes = np.full(lay.replicas, cfg.batch_size // lay.replicas)
    spe = loader.steps_per_epoch(cfg.batch_size)
    total = cfg.epochs * spe if cfg.max_steps == 0 else min(cfg.epochs * spe, cfg.max_steps)
    optimizer, scheduler = make_optimizer(pipe.module, total)
    say(
        f"hethpc: {size} ranks = {lay.stages} pipeline stages x {lay.replicas} replica(s), "
        f"layers per stage {list(balance)}, {cfg.micro_batches} micro-batches ({cfg.schedule}), "
        f"model {cfg.model}, global batch {cfg.batch_size}, {spe} steps per epoch, {total} steps"
    )
    metrics = open_run(run_dir, cfg.to_dict())
    loss_fn = loss_fn if loss_fn is not None else nn.CrossEntropyLoss()
    losses: list[float] = []
    t0 = time.perf_counter()
    try:
        dog = Watchdog(
            cfg.watchdog_s, max_s=cfg.watchdog_max_s, heartbeat_dir=run_dir / "heartbeat",
            rank=rank, size=size,
        )  # fmt: skip
        with dog:
            for step in range(total):
                dog.kick(step, "step")
                x, y = loader.next_batch(sizes)
                tc = time.perf_counter()
                optimizer.zero_grad()
                loss = pipe.train_step(x, y, loss_fn)
                optimizer.step()
                scheduler.step()
                if loss is not None:
                    losses.append(loss)
                metrics.write(
                    "step",
                    step=step,
                    epoch=step // spe,
                    time=time.perf_counter() - t0,
                    loss=loss,
                    batch=int(sizes[lay.replica]),
                    compute_s=pipe.stats.busy_s,
                    step_s=time.perf_counter() - tc,
                    idle=pipe.stats.idle_fraction,
                    stage=lay.stage,
                    replica=lay.replica,
                    synced=lay.replicas > 1,
                    decision="SYNC" if lay.replicas > 1 else "LOCAL",
                    skipped=False,
                    lr=scheduler.get_last_lr()[0],
                )
                epoch_done = (step + 1) % spe == 0
                if epoch_done:
                    metrics.flush()
                if epoch_done and cfg.eval_every and ((step + 1) // spe) % cfg.eval_every == 0:
                    dog.kick(step, "evaluate")
                    acc = evaluate_pipeline(pipe, test_set, lay.replicas)
                    now = time.perf_counter() - t0
                    metrics.write("epoch", step=step, epoch=step // spe, time=now, test_acc=acc)
                    say(f"epoch {(step + 1) // spe}/{cfg.epochs}  test accuracy {100 * acc:.1f}%")
                dog.kick()
            elapsed = time.perf_counter() - t0
            dog.kick(total, "evaluate")
            test_acc = evaluate_pipeline(pipe, test_set, lay.replicas)
    finally:
        metrics.close()
    # The last stage of replica 0 (world rank P-1) saw the losses; share its first and last.
    first_last = np.array(
        [losses[0], np.mean(losses[-10:])] if losses and lay.replica == 0 else [0.0, 0.0]
    )
    first_last = comm.allreduce_array(first_last, ReduceOp.SUM)
    summary = {
        "test_acc": test_acc,
        "time_s": elapsed,
        "steps": total,
        "samples_per_s": total * cfg.batch_size / max(elapsed, 1e-9) if total else None,
        "first_loss": float(first_last[0]),
        "final_loss": float(first_last[1]),
        "sync_fraction": 1.0 if lay.replicas > 1 else None,
        "skipped_steps": 0,
        "final_batch_sizes": [int(s) for s in sizes],
        "pipeline_stages": lay.stages,
        "replicas": lay.replicas,
        "balance": list(balance),
        "world_size": size,
        "config": cfg.shared(),
    }
    if rank == 0:
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    return summary, pipe
