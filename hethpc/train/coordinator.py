"""hethpc in the user's own training loop: the batch size, the sync decision, the weights."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import nn

from hethpc import comm
from hethpc.batching.busy import CpuShare
from hethpc.sync.records import SyncRecord
from hethpc.train.parts.capabilities import finish_policy, make_controller, make_policy
from hethpc.train.parts.optim import GradientClip
from hethpc.train.run.synchronise import synchronise
from hethpc.train.settings.config import ConfigError
from hethpc.train.settings.sources import did_you_mean, make_config
from hethpc.train.watch.guards import check_same_model


class Coordinator:
    """Added to a user's own loop, as Horovod's ``DistributedOptimizer`` is (create on every rank).

    It owns what hethpc decides across ranks: how many samples this rank takes per step
    (:attr:`batch_size`: equal shares, fixed ``weights``, or sized by measured throughput with
    ``batching="dynamic"``, the global batch kept fixed), whether a step synchronises (``sync``:
    BSP every step, SelSync on significant gradient changes, FedAvg every ``fedavg_period``
    steps, or local only), and the weight of this rank's gradient in the average (its share of
    the global batch, so the update is that of the whole global batch). The loop keeps its own
    data, model, loss and optimizer::

        coord = hethpc.Coordinator(model, opt, global_batch=256, sync="selsync",
                                   batching="dynamic")
        for step in range(steps):
            x, y = next_batch(coord.batch_size)       # this rank's share of the global batch
            coord.start()                             # times forward + backward
            loss = loss_fn(model(x), y)
            opt.zero_grad()
            loss.backward()
            coord.step()                              # weigh, synchronise or not, opt.step()
        coord.finish()                                # average replicas that diverged

    Args:
        model: this rank's replica; rank 0's weights are broadcast (``broadcast=True``).
        optimizer: a plain optimizer over ``model``'s parameters (not wrapped by Horovod).
        global_batch: samples per step over all ranks; never changes.
        broadcast: start every rank from rank 0's weights.
        skip_nonfinite: skip, on every rank alike, a step whose loss or gradients hold NaN or
            Inf on any rank (one tiny collective per step).
        device: the compute device (on CUDA the timer synchronises it); default: the device of
            the model's first parameter.
        **settings: named like :class:`~hethpc.train.TrainConfig`'s fields and validated
            alike: ``sync``, ``threshold``, ``sync_window``, ``aggregation``,
            ``fedavg_period``, ``staleness``, ``outer_optimizer``, ``outer_lr``, ``outer_momentum``,
            ``batching``, ``weights``, ``batch_interval``, ``b_min``, ``slowdown``,
            ``slowdown_mode``, ``transport``, ``compression``, ``clip_grad_norm`` (clipped inside
            ``optimizer.step()`` by a step pre-hook on ``optimizer``: under BSP the averaged
            gradient, on local steps this rank's own; see ``--clip-grad-norm``).

    The optimizer and its schedule are the loop's own: AdamW without decay on biases and norms
    is ``torch.optim.AdamW(hethpc.train.param_groups(model, 0.1), lr=...)``, warmup and the
    job's schedules ``LambdaLR(opt, lambda s: hethpc.train.lr_factor("cosine", s, steps,
    warmup=100))``. To accumulate, call ``backward()`` on each micro-batch's loss times its
    share of this rank's rows, then :meth:`step` once: the policy sees the summed gradient.

    Raises:
        ConfigError: a setting is invalid, naming it.
        ModelMismatchError: the ranks' models differ.
    """

    _SETTINGS = frozenset({
        "sync", "threshold", "sync_window", "aggregation", "fedavg_period", "staleness",
        "outer_optimizer",
        "outer_lr", "outer_momentum", "batching", "weights", "batch_interval", "b_min",
        "slowdown", "slowdown_mode", "transport", "compression", "clip_grad_norm",
    })  # fmt: skip

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        global_batch: int,
        broadcast: bool = True,
        skip_nonfinite: bool = True,
        device: torch.device | str | None = None,
        **settings: Any,
    ) -> None:
        unknown = sorted(set(settings) - self._SETTINGS)
        if unknown:
            own = ("global_batch", "broadcast", "skip_nonfinite", "device")
            raise ConfigError(
                f"Coordinator got unknown setting(s) {unknown}"
                f"{did_you_mean(unknown, {*self._SETTINGS, *own})}; it takes "
                f"{sorted(self._SETTINGS)}"
            )
        self.config = make_config(
            {"batch_size": global_batch, **settings},
            {**{k: f"Coordinator({k}=...)" for k in settings},
             "batch_size": "Coordinator(global_batch=...)"},
        )  # fmt: skip
        if comm.is_horovod_optimizer(optimizer):
            raise ConfigError(
                "Coordinator got a Horovod DistributedOptimizer: it would allreduce every "
                "gradient itself, on top of the Coordinator's sync (twice the traffic, and "
                "SelSync/FedAvg local steps would synchronise anyway); pass the plain optimizer "
                "(torch.optim.SGD(...) without hvd.DistributedOptimizer)"
            )
        comm.init(transport=self.config.transport)
        if device is None:  # else a CUDA model's steps would time their kernel launches only
            device = next((p.device for p in model.parameters()), torch.device("cpu"))
        self.model, self.optimizer = model, optimizer
        self.skip_nonfinite = skip_nonfinite
        check_same_model(model)
        if broadcast:
            comm.broadcast_model(model)
        self.controller = make_controller(self.config, device=torch.device(device))
        self.policy = make_policy(self.config)
        self.clip = (
            GradientClip(optimizer, self.config.clip_grad_norm)
            if self.config.clip_grad_norm > 0
            else None
        )
        self.steps = 0
        self.skipped = 0
        self._t0 = math.nan
        self._cpu = CpuShare()  # compute time at the CPU share this rank gets
        self._on_gpu = torch.device(device).type == "cuda"

    @property
    def batch_size(self) -> int:
        """This rank's batch for the next step."""
        return int(self.controller.local_batch)

    @property
    def batch_sizes(self) -> np.ndarray:
        """Every rank's batch for the next step (the same on every rank; sums to the global)."""
        return np.asarray(self.controller.batch_sizes)

    def start(self) -> None:
        """Start timing this step's compute; call just before the forward pass."""
        self._cpu.begin_step()
        self._cpu.begin_compute()
        self._t0 = self.controller.timer_start()

    def step(self, loss: torch.Tensor | float | None = None) -> SyncRecord | None:
        """Finish the step on every rank: weigh, synchronise as the policy says, step.

        Call after ``loss.backward()``, on every rank, every step. Pass ``loss`` to have a
        non-finite loss skip the step too.

        Returns:
            The policy's record of the step, or None when it was skipped (NaN/Inf).
        """
        step = self.steps
        if self.config.batching == "dynamic" and not math.isfinite(self._t0):
            raise ConfigError(
                f"Coordinator.step() at step {step} without coord.start(): batching='dynamic' "
                "sizes each rank's batch by its measured compute time, so call coord.start() "
                "just before the forward pass of every step"
            )
        self._cpu.end_compute()
        compute_s = (
            self.controller.timer_stop(self._t0, step=step) if math.isfinite(self._t0) else math.nan
        )
        self._t0 = math.nan
        record: SyncRecord | None = None
        sizes = self.batch_sizes
        weight = float(sizes[comm.rank()]) / float(sizes.sum())
        if not self.skip_nonfinite:
            record = self.policy.step(
                self.model, self.optimizer, weight=weight, compute_s=compute_s
            )
        else:
            bad, record = synchronise(
                self.policy, self.model, self.optimizer, loss=loss, weight=weight,
                compute_s=compute_s,
            )  # fmt: skip
            if bad:
                self.optimizer.zero_grad()
                self.skipped += 1
                record = None
        own_s = self._cpu.end_step(compute_s)
        self.controller.update(step=step, compute_s=compute_s if self._on_gpu else own_s)
        self.steps += 1
        return record

    def finish(self) -> None:
        """Average replicas that diverged (SelSync, FedAvg, local); a no-op under BSP."""
        finish_policy(self.policy, self.model)

    def state_dict(self) -> dict[str, Any]:
        """The batch sizes, the policy's trackers and the step count, for a checkpoint."""
        return {
            "steps": self.steps,
            "skipped": self.skipped,
            "controller": self.controller.state_dict(),
            "policy": self.policy.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (on the same number of ranks)."""
        self.steps, self.skipped = int(state["steps"]), int(state["skipped"])
        self.controller.load_state_dict(state["controller"])
        self.policy.load_state_dict(state["policy"])
