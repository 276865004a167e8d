"""The end of an epoch: the records flushed, the model evaluated and the score logged."""

from __future__ import annotations

import copy
from collections.abc import Callable

from hethpc import comm
from hethpc.data import ArrayDataset
from hethpc.sync import average_model_
from hethpc.train.assembly import RunParts
from hethpc.train.config import TrainConfig
from hethpc.train.evaluation import Metric, evaluate
from hethpc.train.metrics import MetricsWriter


def describe(key: str, score: float) -> str:
    """``test accuracy 91.2%`` or ``test mse 0.0123``, for the log."""
    if key == "test_acc":
        return f"test accuracy {100 * score:.1f}%"
    return f"{key.replace('_', ' ')} {score:.4g}"


class EpochEnd:
    """The work after a step that ends an epoch, built once per run; called after every step.

    Args:
        cfg: the run's settings (``eval_every`` epochs between evaluations).
        run: the run's parts.
        test_set: evaluated with ``metric``; None: never.
        metric: ``metric(model(x), y)``, a batch mean.
        key: the metric's name in the records (``test_acc``).
        metrics: where the epoch records go.
        tick: called while evaluating (the watchdog's kick).
        say: where rank 0's messages go.
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
    ) -> None:
        self.cfg, self.run, self.test_set, self.metric, self.key = cfg, run, test_set, metric, key
        self.metrics, self.tick, self.say = metrics, tick, say
        self.rank = comm.rank()
        # Replicas that step locally are scored as their average (what the run would end
        # with), taken on every rank (a collective) into a copy.
        self.average = cfg.sync != "bsp" and not run.engine.saves_own_state and comm.size() > 1

    def __call__(self, step: int, *, weight: float, now: float) -> None:
        """After step ``step`` (run seconds ``now``): flush, evaluate and log at an epoch's end.

        A collective on the epochs that evaluate a pipeline or an average of replicas.
        """
        spe, engine, test_set = self.run.steps_per_epoch, self.run.engine, self.test_set
        if (step + 1) % spe != 0:
            return
        self.metrics.flush()
        every = self.cfg.eval_every * spe
        if test_set is None or not every or (step + 1) % every != 0:
            return
        if engine.collective_eval or self.average:
            if engine.collective_eval:
                got = engine.evaluate(test_set, self.metric, tick=self.tick)
            else:
                scored = copy.deepcopy(self.run.module)
                average_model_(scored, weight=weight, group=engine.group)
                got = 0.0
                if self.rank == 0:
                    got = evaluate(scored, test_set, metric=self.metric, tick=self.tick)
        elif self.rank == 0:
            got = engine.evaluate(test_set, self.metric, tick=self.tick)
        if self.rank == 0:
            self.metrics.write("epoch", step=step, epoch=step // spe, time=now, **{self.key: got})
            self.say(
                f"epoch {(step + 1) // spe}/{self.cfg.epochs}  {describe(self.key, got)}  "
                f"({now:.1f} s)"
            )
