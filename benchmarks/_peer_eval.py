"""The peers' evaluations (``peer_horovod.py``, ``peer_ddp.py``): when they score the model, on
which split, with the training clock stopped, and when a non-finite loss ends the run.

The schedule is the evidence protocol's (docs/evaluation.md), not part of the peers' training:
every ``every`` steps (by default one epoch) on the validation split when one is held out, else
on the test split; the training clock stops while it evaluates; at the end, the test split and
the validation split are scored once. A non-finite training loss on any rank ends the run as
diverged at the next evaluation, decided by one sum over the ranks there (no collective is
added to the training step).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import DataLoader, Subset, TensorDataset

MetricSum = Callable[[list[float]], list[float]]  # values summed over the ranks (a collective)


class Evaluations:
    """A run's evaluations and its training clock, the same calls on every rank.

    Each rank scores every ``size``-th sample from its ``rank`` (no sample twice, none padded),
    and ``metric_sum`` adds up the counts, so every rank gets the accuracy over the whole split.

    Args:
        model: the model to score (the wrapped module, not a distributed wrapper).
        every: steps between evaluations, at least 1.
        test: the test split.
        val: the held-out validation split; None: the evaluations score the test split.
        rank: this rank.
        size: the number of ranks.
        metric_sum: sums a list of floats over the ranks.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        every: int,
        test: TensorDataset,
        val: TensorDataset | None,
        rank: int,
        size: int,
        metric_sum: MetricSum,
    ) -> None:
        if every < 1:
            raise ValueError(f"evaluations every {every} steps: expected at least 1")
        self.model, self.every, self.metric_sum = model, every, metric_sum
        self.splits = {"test_acc": test} if val is None else {"val_acc": val, "test_acc": test}
        self.key = next(iter(self.splits))  # what the evaluations during training score
        self.rank, self.size = rank, size
        self.curve: list[dict[str, Any]] = []
        self.diverged: str | None = None
        self.nonfinite = False
        self.eval_s = 0.0
        self.t0 = time.perf_counter()

    def start(self) -> None:
        """Start the training clock (before the first step)."""
        self.t0, self.eval_s = time.perf_counter(), 0.0

    def train_time(self) -> float:
        """Seconds since :meth:`start` without the evaluations."""
        return time.perf_counter() - self.t0 - self.eval_s

    def after_step(self, step: int, loss: float) -> bool:
        """After step ``step`` (counted from 1) with this rank's ``loss``: evaluate when due.
        Whether the run must stop (a rank saw a non-finite loss), the same on every rank."""
        self.nonfinite |= not math.isfinite(loss)
        if step % self.every:
            return False
        return self._evaluate(step, record=True)

    def scores_at(self, step: int) -> dict[str, float]:
        """The scores of the evaluation after ``step``; empty if there was none."""
        if self.curve and self.curve[-1]["step"] == step:
            return {self.key: self.curve[-1][self.key]}
        return {}

    def finish(self, step: int) -> dict[str, Any]:
        """After the last step: the last check, the final scores on every split (None when the
        run diverged), the curve and the training seconds."""
        train_time = self.train_time()
        if self.diverged is None and not self.scores_at(step):
            self._evaluate(step, record=False)
        finals: dict[str, float | None] = {"final_test_acc": None, "final_val_acc": None}
        if self.diverged is None:
            for key, split in self.splits.items():
                done = self.scores_at(step).get(key)
                finals[f"final_{key}"] = self.accuracy(split) if done is None else done
        return {"curve": self.curve, "eval_key": self.key, "train_time_s": train_time,
                "diverged": self.diverged, **finals}  # fmt: skip

    def accuracy(self, split: TensorDataset) -> float:
        """The model's accuracy over the whole ``split`` (a collective)."""
        shard = Subset(split, range(self.rank, len(split), self.size))
        self.model.eval()
        correct = count = 0
        with torch.no_grad():
            for x, y in DataLoader(shard, batch_size=1000):
                correct += int((self.model(x).argmax(1) == y).sum())
                count += len(y)
        self.model.train()
        correct_all, count_all = self.metric_sum([correct, count])
        return correct_all / count_all

    def _evaluate(self, step: int, *, record: bool) -> bool:
        t = time.perf_counter()
        train_time = t - self.t0 - self.eval_s
        (bad,) = self.metric_sum([float(self.nonfinite)])
        if bad:
            self.diverged = f"non-finite training loss on {int(bad)} rank(s) by step {step}"
        elif record:
            self.curve.append({"step": step, "train_time": train_time, "time": t - self.t0,
                               self.key: self.accuracy(self.splits[self.key])})  # fmt: skip
        self.eval_s += time.perf_counter() - t
        return self.diverged is not None
