"""FedAvg / periodic averaging: local steps, and a parameter average every ``period`` steps."""

from __future__ import annotations

from hethpc.sync.policy import Outcome, StepInput, SyncPolicy


class FedAvg(SyncPolicy):
    """Take local steps; after every ``period``-th step (steps ``H-1, 2H-1, ...``, 0-based)
    average parameters and buffers across ranks, weighted by ``b_k / B`` when given.

    Args:
        period: H, steps between averages; ``>= 1`` (1 averages after every step). Default 10.
        group: the ranks that average together (default: the world).
        keep_records: keep every step's record.

    Raises:
        ValueError: ``period`` is not an integer ``>= 1``.
    """

    name = "fedavg"
    settings = ("period",)
    accepts_inner_steps = True
    separate_weight_check = True

    def __init__(self, *, period: int = 10, **kwargs: object) -> None:
        if isinstance(period, bool) or int(period) != period or period < 1:
            raise ValueError(f"FedAvg period must be an integer >= 1 (steps), got {period!r}")
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.period = int(period)

    def _step(self, s: StepInput) -> Outcome:
        model, optimizer, weight = s.model, s.optimizer, s.weight
        optimizer.step()
        if (self.steps + 1) % self.period != 0:
            return Outcome(synced=False)
        seconds, nbytes = self._average_model(model, weight, optimizer)
        return Outcome(synced=True, sync_s=seconds, bytes=nbytes, model_averaged=True)
