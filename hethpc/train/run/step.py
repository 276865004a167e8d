"""One training step: read the batch, compute, synchronise or skip, and write the step's record."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from hethpc import comm
from hethpc.batching.busy import CpuShare
from hethpc.batching.memory_cap import pieces
from hethpc.sync.records import SyncRecord
from hethpc.train.errors import NonFiniteError
from hethpc.train.evaluation import accuracy
from hethpc.train.parts.assembly import RunParts
from hethpc.train.report.metrics import MetricsWriter
from hethpc.train.report.progress import Progress
from hethpc.train.report.tally import Tally
from hethpc.train.run.shares import gradient_weight, inner_step_sizes
from hethpc.train.run.synchronise import synchronise
from hethpc.train.settings.config import TrainConfig
from hethpc.train.watch.faults import Fault, apply_faults
from hethpc.train.watch.guards import AveragedGradientGuard, local_nonfinite
from hethpc.train.watch.watchdog import Watchdog

Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def nonfinite_advice(cfg: TrainConfig, step: int, in_a_row: int, ranks: list[int]) -> str:
    """The message that stops a run whose steps keep turning NaN/Inf, with the likely cause."""
    return (
        f"{in_a_row} steps in a row (up to step {step}) had a non-finite loss or gradient, "
        f"last on rank(s) {ranks}; stopping (--max-skipped-steps {cfg.max_skipped_steps}). "
        f"Likely cause: the learning rate is too large for this model (--lr {cfg.lr}), or the "
        "data holds NaN/Inf values. Lower --lr, check the data, or raise --max-skipped-steps"
    )


class TrainStep:
    """The body of the training loop, built once per run; calling it runs one step.

    Every rank calls it for every step, so the collectives inside (the policy's, the vote
    naming non-finite ranks) come in the same order on every rank.

    Args:
        cfg: the run's settings.
        run: the run's parts.
        tally: the running counts, updated by each step.
        loss_fn: ``loss_fn(model(x), y)``, a scalar batch mean.
        classify: the step records hold the batch's accuracy.
        faults: deliberate failures, for reliability tests only.
        guard: BSP's check of the averaged gradient (None: the policy votes).
        metrics: where the step records go.
        dog: the watchdog, told each phase of the step.
        bar: rank 0's progress bar, or None.
        say: where rank 0's messages go.
    """

    def __init__(
        self,
        cfg: TrainConfig,
        run: RunParts,
        tally: Tally,
        *,
        loss_fn: Loss,
        classify: bool,
        faults: Sequence[Fault],
        guard: AveragedGradientGuard | None,
        metrics: MetricsWriter,
        dog: Watchdog,
        bar: Progress | None,
        say: Callable[[str], None],
    ) -> None:
        self.cfg, self.run, self.tally = cfg, run, tally
        self.loss_fn, self.classify, self.faults = loss_fn, classify, tuple(faults)
        self.guard, self.metrics, self.dog, self.bar, self.say = guard, metrics, dog, bar, say
        self.rank, self.size = comm.rank(), comm.size()
        self.params = list(run.module.parameters())
        self.weight = 1.0  # the last step's gradient weight, for the end-of-epoch average
        self.now = 0.0  # the run's seconds at the end of the last step
        self.cpu = CpuShare()  # compute time at the CPU share this rank gets, for the controller

    def __call__(self, step: int) -> None:
        """Run step ``step`` on this rank (a collective)."""
        cfg, run, engine, dog = self.cfg, self.run, self.run.engine, self.dog
        optimizer, policy, controller = run.optimizer, run.policy, run.controller
        self.cpu.begin_step()
        dog.kick(step, "data")
        sizes = np.asarray(controller.batch_sizes)
        b, big_b = int(sizes[engine.replica]), int(sizes.sum())
        weight = gradient_weight(
            cfg.partition, rank=engine.replica, batch_sizes=sizes,
            partition_lengths=run.partition_lengths, rebalanced=run.rebalancer is not None,
        )  # fmt: skip
        x, y = self._batch(step, sizes)
        cap = None if run.caps is None else run.caps[engine.replica]
        dog.kick(step, "compute")
        tc = controller.timer_start()
        self.cpu.begin_compute()  # from here, as compute_s: speed-sized local steps included

        def poison(value: torch.Tensor, step: int = step) -> torch.Tensor:
            return apply_faults(self.faults, rank=self.rank, step=step, loss=value)

        local_steps, lrs = 1, None
        if cfg.inner_steps == "speed":  # every local step but the last here
            splits = inner_step_sizes(sizes, engine.replica, rows=len(y))
            edges = np.cumsum([0, *splits])
            # Linear scaling: a local step of b rows moves b / (B / N) as far as one
            # of the uniform batch would, so a round moves as far per sample.
            lrs = [g["lr"] for g in optimizer.param_groups]
            for g in optimizer.param_groups:
                g["lr"] *= float(np.mean(splits)) * len(sizes) / big_b
            for lo, hi in zip(edges[:-2], edges[1:-1], strict=True):
                inner, _ = engine.compute(
                    x[lo:hi], y[lo:hi], self.loss_fn, poison,
                    pieces=pieces(int(hi - lo), cap, cfg.accumulate),
                )  # fmt: skip
                assert inner is not None
                if not local_nonfinite(inner, (p.grad for p in self.params)):
                    optimizer.step()  # a bad local step is dropped on this rank alone
            x, y = x[edges[-2] :], y[edges[-2] :]
            local_steps = len(splits)
        # BSP on a data-parallel engine: the loss scaled by the step's weight, so the gradients
        # come out weighted and the average makes no pass over them to scale them
        scale = policy.loss_scale(weight) if engine.takes_loss_scale else 1.0
        # before_backward: BSP with overlap arms its buckets for the (last) backward pass
        passes = pieces(len(y), cap, cfg.accumulate)
        loss, out = engine.compute(
            x, y, self.loss_fn, poison, loss_scale=scale, pieces=passes,
            before_backward=lambda: policy.before_backward(run.module, weight=weight),
        )  # fmt: skip
        self.cpu.end_compute()
        compute_s = engine.step_time(controller.timer_stop(tc))
        dog.kick(step, "sync")
        link_before = comm.link_stats() if cfg.link else None
        bad, record = synchronise(
            policy, run.module, optimizer, loss=loss, weight=weight, compute_s=compute_s,
            guard=self.guard,
        )  # fmt: skip
        is_synced, sync_s = self._settle(step, bad, record, loss)
        if lrs is not None:  # the scheduler's own rates again, before it steps
            for g, lr in zip(optimizer.param_groups, lrs, strict=True):
                g["lr"] = lr
        run.scheduler.step()
        self.tally.synced += is_synced
        link_after = comm.link_stats() if cfg.link else None
        own_s = self.cpu.end_step(compute_s)
        controller.update(step=step, compute_s=engine.control_time(own_s, compute_s))
        self.tally.seen += big_b
        self.weight, self.now = weight, self.tally.elapsed()
        with torch.no_grad():  # tensors, made numbers when the metrics are written
            acc = (
                accuracy(out, y.to(out.device))
                if self.classify and out is not None and len(y)
                else float("nan")
            )
            self.metrics.write(
                "step",
                step=step,
                epoch=step // run.steps_per_epoch,
                time=self.now,
                loss=loss.detach() if loss is not None else None,
                acc=acc,
                batch=b,
                compute_s=compute_s,
                own_s=own_s,
                cpu_share=self.cpu.share,
                sync_s=sync_s,
                bytes=record.bytes if record is not None and not bad else 0,  # on the wire
                synced=is_synced,
                decision="SYNC" if is_synced else "LOCAL",
                skipped=bool(bad),
                lr=run.scheduler.get_last_lr()[0],
                **({"local_steps": local_steps} if cfg.inner_steps == "speed" else {}),
                **({"pieces": passes} if cap is not None else {}),
                **({"grad_norm": run.clip.norm} if run.clip is not None else {}),
                **({"batch_sizes": sizes.tolist()} if self.rank == 0 and self.size > 1 else {}),
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
        if self.bar is not None:
            self._show(step, loss, out, acc)

    def _batch(self, step: int, sizes: np.ndarray) -> tuple[Any, Any]:
        """This replica's share of the global batch, after rebalancing and injection."""
        run = self.run
        ask = (
            sizes
            if run.injector is None
            else np.array([run.injector.local_batch(int(s)) for s in sizes])
        )
        if run.rebalancer is None:
            x, y = run.loader.next_batch(ask)
        else:  # each partition's share of the batch, the surplus to the fast ranks
            x, y = run.rebalancer.exchange(*run.loader.next_batch(run.rebalancer.reads(ask)), ask)
        if run.injector is not None:
            x, y = run.injector.exchange(x, y, step)
        return x, y

    def _settle(
        self, step: int, bad: list[int], record: SyncRecord | None, loss: torch.Tensor | None
    ) -> tuple[bool, float]:
        """Count a skipped step (or stop the run) or keep the loss; ``(synced, sync seconds)``.

        Raises:
            NonFiniteError: ``--on-nonfinite stop``, or too many skipped steps in a row.
        """
        cfg, tally = self.cfg, self.tally
        tally.in_a_row = tally.in_a_row + 1 if bad else 0
        if bad:
            where = f"non-finite loss or gradient at step {step} on rank(s) {bad}"
            if cfg.on_nonfinite == "stop":
                raise NonFiniteError(f"{where}; stopping (--on-nonfinite stop)")
            if tally.in_a_row > cfg.max_skipped_steps:
                raise NonFiniteError(nonfinite_advice(cfg, step, tally.in_a_row, bad))
            there = "there" if self.run.policy.asynchronous else "on every rank"
            self.say(f"hethpc: {where}; skipping the step {there}")
            self.run.optimizer.zero_grad()
            tally.skipped += 1
            return False, 0.0
        assert record is not None
        if loss is not None:
            tally.first_loss = loss.detach() if tally.first_loss is None else tally.first_loss
            tally.last_losses.append(loss.detach())
        return bool(record.synced), float(record.sync_s)

    def _show(self, step: int, loss: torch.Tensor | None, out: Any, acc: Any) -> None:
        """Advance rank 0's progress bar; every 20 steps with the loss, accuracy and speed."""
        assert self.bar is not None
        shown = None
        if step % 20 == 0 or step + 1 == self.run.total:
            shown = {"acc": f"{float(acc):.2f}"} if self.classify and out is not None else {}
            if loss is not None:
                shown = {"loss": f"{float(loss.detach()):.3f}", **shown}
            shown["sps"] = f"{self.tally.seen / (time.perf_counter() - self.tally.t0):,.0f}"
        self.bar.update(shown)
