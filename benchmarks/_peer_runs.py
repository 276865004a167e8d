"""The peers as methods of the evidence protocol: a run's settings as a peer's command line, the
run in this MPI rank's process, and its result as the protocol reads hethpc's.

A scenario runs every method in one MPI job, the peers too: ``peer_horovod.run`` starts Horovod
for each run and shuts it down after it (no background thread beside hethpc's runs), and
``peer_ddp.run`` joins the gloo process group once per process and reuses it (``close()`` at
the scenario's end). A peer gets the grid's learning rate and global batch, the epoch budget,
the seed, the partition, the data and the validation split of the run's settings, and the
evaluations every ``eval_every_steps`` steps; its training loop is its own (equal batches,
the run's learning-rate schedule as a ``LambdaLR``). A run's ``compression`` becomes the
peer's own: Horovod's ``Compression.fp16`` for ``fp16``, DDP's ``fp16_compress_hook`` for
``fp16`` and ``powerSGD_hook`` for ``powersgd[:RANK]``; any other pair is refused.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import sys
import threading
from collections.abc import Mapping
from typing import Any

from hethpc.train import TrainConfig


def peer_argv(settings: Mapping[str, Any], peer: str) -> list[str]:
    """``peer``'s command line for a run of these TrainConfig settings (validated as such).

    Raises:
        SystemExit: a compression the peer has no counterpart of.
    """
    cfg = TrainConfig(**settings)
    argv = [
        "--epochs", str(cfg.epochs), "--batch-size", str(cfg.batch_size), "--lr", str(cfg.lr),
        "--momentum", str(cfg.momentum), "--seed", str(cfg.seed), "--partition", cfg.partition,
        "--labels-per-rank", str(cfg.labels_per_rank), "--samples", str(cfg.samples),
        "--data-seed", str(cfg.data_seed), "--val-fraction", str(cfg.val_fraction),
        "--eval-every-steps", str(cfg.eval_every_steps), "--lr-schedule", cfg.lr_schedule,
    ]  # fmt: skip
    kind, _, rank = cfg.compression.partition(":")
    if kind == "none":
        return argv
    if (peer, kind) == ("horovod", "fp16"):
        return [*argv, "--fp16-allreduce"]
    if (peer, kind) == ("ddp", "powersgd"):
        return [*argv, "--powersgd", rank or "4"]
    if (peer, kind) == ("ddp", "fp16"):
        return [*argv, "--fp16-compress"]
    raise SystemExit(
        f"peer {peer} has no counterpart of compression {cfg.compression!r}; give horovod "
        "fp16 (Compression.fp16), ddp fp16 (fp16_compress_hook) or ddp powersgd[:RANK] "
        "(powerSGD_hook)"
    )


def run_peer(peer: str, settings: Mapping[str, Any]) -> dict[str, Any]:
    """One run of ``benchmarks/peer_<peer>.py`` in this process (a collective); its summary.
    Its lines per epoch are left out of the protocol's log, as hethpc's runs' are."""
    module: Any = importlib.import_module(f"peer_{peer}")
    timer = threading.Timer(HUNG_S, _hung, args=(peer,))
    timer.daemon = True
    timer.start()
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            return module.run(peer_argv(settings, peer))
    finally:
        timer.cancel()


# A peer run this long is taken as hung (Horovod on CPU ranks under a quota once kept its
# threads busy and ended no epoch, docs/testbed.md): the scenario's job is ended at once
# rather than at mpirun's bound.
HUNG_S = 900.0


def _hung(peer: str) -> None:
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    print(f"bench_evidence: a {peer} run on rank {world.Get_rank()} took over {HUNG_S:.0f} s, "
          "taken as hung; ending the scenario", file=sys.stderr, flush=True)  # fmt: skip
    world.Abort(1)


def as_protocol_run(summary: Mapping[str, Any]) -> dict[str, Any]:
    """A peer's summary in the form of the protocol's runs (``bench_evidence.run_one``)."""
    curve = [(p["train_time"], p["val_acc"]) for p in summary["curve"]]
    sizes = [summary["per_rank_batch"]] * summary["world_size"]
    if summary["diverged"] is not None:
        return {"val": curve, "final_val": 0.0, "final_test": 0.0, "train_time_s": None,
                "time_s": None, "sync_fraction": None, "syncs": {}, "sizes": sizes,
                "diverged": summary["diverged"]}  # fmt: skip
    return {"val": curve, "final_val": summary["final_val_acc"],
            "final_test": summary["final_test_acc"], "train_time_s": summary["train_time_s"],
            "time_s": summary["wall_s"], "sync_fraction": 1.0, "syncs": {},
            "sizes": sizes}  # fmt: skip


def close() -> None:
    """End what the peers keep between runs (DDP's process group), if a run started it."""
    ddp = sys.modules.get("peer_ddp")
    if ddp is not None:
        ddp.close()
