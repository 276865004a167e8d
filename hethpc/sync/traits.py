"""What a sync policy is: the traits its class declares, asked before it is built."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Traits:
    """A policy's traits under given settings (:meth:`SyncPolicy.traits`). Each is a class
    attribute of the same name on every policy; a caller asks them instead of comparing names.

    Attributes:
        averages_parameters: its synchronisations average parameters (at :meth:`finish` at
            least), so an outer optimizer and drift correction apply to it.
        averages_while_training: it averages parameters between steps, not only at
            :meth:`finish`, so the optimizer's state can be averaged with them.
        averages_gradients: it averages gradients before the optimizer step when it
            synchronises (and no parameters).
        keeps_replicas_equal: every step applies the same averaged update on every rank, so
            replicas that start equal stay equal.
        asynchronous: ranks step at their own pace, with no collective between steps (the
            caller must not add one: no exchange of samples or batch sizes per step).
        decides_by_norm: it decides each step by the gradient norm.
        accepts_inner_steps: a caller may take optimizer steps of its own between two calls
            of :meth:`step` (local steps sized by speed): it averages parameters on a schedule
            of its own steps and decides nothing from their gradients.
        separate_weight_check: it checks the ranks' weights in a collective of its own,
            before each average, which ``check_weights=False`` skips where the caller's
            weights agree by construction (the others check them inside their vote, once at
            :meth:`finish`, or not at all).
        exchange: what its synchronisations do, as error messages say it:
            ``"averages parameters"``, ``"averages gradients"``, ``"adds updates"``.
    """

    averages_parameters: bool
    averages_while_training: bool
    averages_gradients: bool
    keeps_replicas_equal: bool
    asynchronous: bool
    decides_by_norm: bool
    accepts_inner_steps: bool
    separate_weight_check: bool
    exchange: str
