"""The end of an epoch: the records flushed, the model evaluated and the score logged."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable

from hethpc import comm
from hethpc.data import ArrayDataset
from hethpc.sync.averaging import average_model_
from hethpc.train.evaluation import Metric, evaluate_all, metric_key, scored
from hethpc.train.parts.assembly import RunParts
from hethpc.train.report.metrics import MetricsWriter
from hethpc.train.report.tally import Tally
from hethpc.train.settings.config import TrainConfig


def describe(key: str, score: float) -> str:
    """``test accuracy 91.2%``, ``validation bits per byte 2.415`` or ``test mse 0.0123``,
    for the log."""
    split, _, name = key.partition("_")
    split = {"val": "validation"}.get(split, split)
    if name == "acc":
        return f"{split} accuracy {100 * score:.1f}%"
    if name == "bpb":
        return f"{split} bits per byte {score:.3f}"
    return f"{split} {name.replace('_', ' ')} {score:.4g}"


class EpochEnd:
    """The work after a step that ends an epoch, built once per run; called after every step.

    Records are flushed at every epoch's end; the model is evaluated every ``eval_every``
    epochs, or every ``eval_every_steps`` steps when that is set, on the validation split when
    the run holds one out (the test split then waits for the end), else on the test split.
    An evaluation record (kind
    ``epoch``) has the run's seconds (``time``) and the seconds without any evaluation
    (``train_time``: the clock stopped while evaluating, so that methods that evaluate the
    same number of times compare alike).

    Args:
        cfg: the run's settings.
        run: the run's parts.
        test_set: evaluated with ``metric``; None: never.
        metric: ``metric(model(x), y)``, a batch mean.
        key: the metric's name in the records (``test_acc``).
        metrics: where the epoch records go.
        tick: called while evaluating (the watchdog's kick).
        say: where rank 0's messages go.
        val_set: a held-out validation split, scored instead of ``test_set`` (``val_acc``).
        tally: the run's counts; the seconds spent evaluating go into ``tally.eval_s``.
    """

    def __init__(
        self,
        cfg: TrainConfig,
        run: RunParts,
        test_set: ArrayDataset | None,
        *,
        metric: Metric,
        key: str,
        metrics: MetricsWriter,
        tick: Callable[[], None],
        say: Callable[[str], None],
        val_set: ArrayDataset | None = None,
        tally: Tally | None = None,
    ) -> None:
        self.cfg, self.run, self.test_set, self.metric, self.key = cfg, run, test_set, metric, key
        self.metrics, self.tick, self.say = metrics, tick, say
        self.val_set, self.tally = val_set, tally if tally is not None else Tally()
        self.val_key = "val" + key.removeprefix("test")
        # the metric and its companions (accuracy per position beside bits per byte)
        self.scored = scored(metric)
        self.keys = [key, *(metric_key(m) for m in self.scored[1:])]
        self.rank = comm.rank()
        # Replicas that step locally are scored as their average (what the run would end
        # with), taken on every rank (a collective) into a copy.
        self.average = (
            not run.policy.keeps_replicas_equal
            and not run.engine.saves_own_state
            and comm.size() > 1
        )

    def __call__(self, step: int, *, weight: float, now: float) -> None:
        """After step ``step`` (run seconds ``now``): flush at an epoch's end, evaluate and log
        when one is due.

        A collective on the steps that evaluate a pipeline or an average of replicas.
        """
        spe = self.run.steps_per_epoch
        if (step + 1) % spe == 0:
            self.metrics.flush()
        if self.cfg.eval_every_steps:
            due = (step + 1) % self.cfg.eval_every_steps == 0
        else:
            every = self.cfg.eval_every * spe
            due = bool(every) and (step + 1) % every == 0
        if not due or (self.test_set is None and self.val_set is None):
            return
        t0 = time.perf_counter()
        scores = self._scores(weight)
        train_time = now - self.tally.eval_s
        self.tally.eval_s += time.perf_counter() - t0
        if self.rank == 0:
            self.metrics.write(
                "epoch", step=step, epoch=step // spe, time=now, train_time=train_time, **scores
            )
            where = (
                f"step {step + 1}" if self.cfg.eval_every_steps
                else f"epoch {(step + 1) // spe}/{self.cfg.epochs}"
            )  # fmt: skip
            said = "  ".join(describe(k, v) for k, v in scores.items())
            self.say(f"{where}  {said}  ({now:.1f} s)")

    def _scores(self, weight: float) -> dict[str, float]:
        """``metric`` and its companions on the validation split, or on the test split without
        one (rank 0's figures; a collective for a pipeline or an average of replicas)."""
        engine = self.run.engine
        data = self.val_set if self.val_set is not None else self.test_set
        if data is None:
            return {}
        keys = self.keys if self.val_set is None else [
            "val" + k.removeprefix("test") for k in self.keys
        ]  # fmt: skip
        values = [0.0] * len(keys)
        if engine.collective_eval:
            values = engine.evaluate(data, self.scored, tick=self.tick)
        elif self.average:  # the replicas' average, taken on every rank into a copy
            model = copy.deepcopy(self.run.module)
            average_model_(model, weight=weight, group=engine.group)
            if self.rank == 0:
                values = evaluate_all(model, data, self.scored, tick=self.tick)
        elif self.rank == 0:
            values = engine.evaluate(data, self.scored, tick=self.tick)
        return dict(zip(keys, values, strict=True))
