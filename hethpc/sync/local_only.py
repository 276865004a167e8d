"""Local only: no synchronisation at all until :meth:`~SyncPolicy.finish` averages the replicas."""

from __future__ import annotations

from hethpc.sync.policy import Outcome, StepInput, SyncPolicy


class LocalOnly(SyncPolicy):
    """Every step is local; :meth:`finish` averages parameters and buffers once at the end.

    Args:
        group: the ranks that average at the end (default: the world).
        keep_records: keep every step's record.
    """

    name = "local"
    averages_while_training = False  # its one average is at finish(): no optimizer state
    accepts_inner_steps = True

    def _step(self, s: StepInput) -> Outcome:
        optimizer = s.optimizer
        # No collective here: the weights are checked, on every rank, when finish() averages.
        optimizer.step()
        return Outcome(synced=False)
