"""A run's checkpoints: resuming from the latest one and saving one at a step (collectives)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import nn

from hethpc import comm
from hethpc.train.keep.checkpoint import CheckpointManager
from hethpc.train.keep.state import Components, gather_state, restore_state
from hethpc.train.parts.engine import Engine
from hethpc.train.parts.optim import make_optimizer
from hethpc.train.report.metrics import MetricsWriter
from hethpc.train.report.tally import Tally
from hethpc.train.settings.compare import resume_differences
from hethpc.train.settings.config import ConfigError, TrainConfig
from hethpc.train.watch.watchdog import Watchdog

# Differences no --resume-changes can allow.
_FIXED = ("world size", "model layout")


def layout_changes(saved: dict[str, Any] | None, model: nn.Module) -> list[str]:
    """``["model layout: ..."]`` when ``model``'s parameters differ in name or shape from the
    checkpoint's ``saved`` state dict (a fit() user's model is not named in the settings)."""
    if not isinstance(saved, dict):
        return []
    mine = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    theirs = {k: tuple(v.shape) for k, v in saved.items() if hasattr(v, "shape")}
    diffs = [
        f"{k} {theirs.get(k, 'absent')} -> {mine.get(k, 'absent')}"
        for k in sorted(mine.keys() | theirs.keys())
        if mine.get(k) != theirs.get(k)
    ]
    if not diffs:
        return []
    more = f" and {len(diffs) - 3} more" if len(diffs) > 3 else ""
    return [
        f"model layout: {', '.join(diffs[:3])}{more} (a checkpoint resumes only into the same "
        "model; start a new run_dir, or overwrite this one)"
    ]


class RunCheckpoints:
    """The checkpoints of one run, in ``run_dir / "checkpoints"``.

    Args:
        cfg: the run's settings.
        run_dir: the run directory.
        engine: the step engine (whether each rank saves its own state).
        components: what a checkpoint saves and restores.
        tally: the loop's counts (the time, synced and skipped steps travel in checkpoints).
    """

    def __init__(
        self,
        cfg: TrainConfig,
        run_dir: Path,
        engine: Engine,
        components: Components,
        tally: Tally,
    ) -> None:
        self.cfg, self.components, self.tally = cfg, components, tally
        self.manager = CheckpointManager(run_dir / "checkpoints", keep=cfg.keep_checkpoints)
        self.saves_own_state = engine.saves_own_state
        self.engine = engine
        # Each rank saves its own model and optimizer state when replicas may differ, or when
        # each rank holds a different pipeline stage.
        self.own_state = not components.policy.keeps_replicas_equal or engine.saves_own_state

    def resume(self, say: Callable[[str], None]) -> None:
        """Restore the latest checkpoint into the components and the tally (a collective).

        Rank 0 reads it and checks its settings against this run's; every rank raises alike.

        Raises:
            ConfigError: the checkpoint's settings differ from this run's.
        """
        cfg, ckpts, tally, size = self.cfg, self.manager, self.tally, comm.size()
        found = ckpts.load_latest() if comm.rank() == 0 else None
        changed = resume_differences(found[1]["config"], cfg) if found is not None else []
        if found is not None and self.saves_own_state and found[1]["world_size"] != size:
            changed.append(f"world size: {found[1]['world_size']} -> {size} (pipeline stages "
                           "resume only on the same layout)")  # fmt: skip
        if found is not None and not self.saves_own_state:
            saved = found[1]["ranks"][0].get("model", found[1].get("model"))
            changed += layout_changes(saved, self.components.model)
        if changed:
            found = None  # not broadcast: every rank raises below
        found, changed = comm.broadcast_object((found, changed))
        if changed:
            allowed = [c.split(":")[0] for c in changed if not c.startswith(_FIXED)]
            raise ConfigError(
                f"--resume: these settings differ from the checkpoint's in {ckpts.directory}: "
                + "; ".join(changed)
                + ". Resume with the checkpoint's settings"
                + (", or allow the change with --resume-changes " + ",".join(allowed)
                   + f" (fit: resume_changes={','.join(allowed)!r})" if allowed else "")
            )  # fmt: skip
        if found is None:
            say(f"hethpc: no checkpoint in {ckpts.directory}; starting afresh")
        else:
            tally.start, state = found
            tally.elapsed0 = float(state["elapsed_s"])
            counters = state.get("counters", {})
            tally.synced = int(counters.get("synced", 0))
            tally.skipped = int(counters.get("skipped", 0))
            tally.eval_s = float(counters.get("eval_s", 0.0))
            moved = self.engine.adopt_checkpoint(state, lambda m: make_optimizer(cfg, m, 1)[0])
            if moved:  # this rank's layers changed: its policy's per-parameter state starts afresh
                mine = state["ranks"][comm.rank()]
                mine["policy"] = self.components.policy.for_other_parameters(mine["policy"])
                say(f"hethpc: {moved}")
            same = restore_state(state, self.components, seed=cfg.seed)
            how = "" if same else f" (saved on {state['world_size']} ranks, re-split over {size})"
            say(f"hethpc: resumed from step {tally.start}{how}")

    def save(self, step: int, *, metrics: MetricsWriter, dog: Watchdog) -> Path | None:
        """Save the run's state after ``step`` steps (a collective); the file, on the saver."""
        metrics.flush()  # the records up to a checkpoint are on disk before it is
        dog.kick(step, "checkpoint")
        tally = self.tally
        state = gather_state(
            self.components,
            step=step,
            elapsed_s=tally.elapsed(),
            config=self.cfg.to_dict(),
            replicas_differ=self.own_state,
            counters={"synced": tally.synced, "skipped": tally.skipped, "eval_s": tally.eval_s},
        )
        if state is not None and self.engine.balance is not None:
            state["cut"] = list(self.engine.balance)  # the layers each stage's state holds
        path = self.manager.save(state, step) if state is not None else None
        dog.kick(step, "barrier")
        comm.barrier()
        return path
