"""A peer of hethpc: plain Horovod data-parallel training, as Horovod's own examples write it.

    scripts/mpirun.sh -np 2 .venv/bin/python benchmarks/peer_horovod.py --epochs 6
    python3 jobs/testbed.py --name peers run --node cpu=1,link=1gbit \\
        --node cpu=0.5,link=200mbit -- scripts/mpirun.sh -np 2 .venv/bin/python \\
        benchmarks/peer_horovod.py --out runs/peer_horovod.json

What a user would run instead of hethpc, unchanged, so that comparisons run it beside hethpc
on the same uneven cluster: the loop of ``examples/pytorch/pytorch_mnist.py`` (``hvd.init``,
``hvd.DistributedOptimizer``, ``broadcast_parameters`` and ``broadcast_optimizer_state``,
equal per-rank batches, test metrics averaged by ``hvd.allreduce``), training the model and
data of hethpc's demo (``jobs/demo.toml``): ``cnn1d_wide`` on the 20,000-sample MNIST-1D that
hethpc generates (80 % train, 20 % test, cached in ``$HETHPC_CACHE`` or ``~/.cache/hethpc``).
Only the model factory and the data generator come from hethpc, never its training loop.

``--batch-size`` is the global batch (each of N ranks takes ``batch / N``) and ``--lr`` is the
rate for it, as in hethpc, so the same flags mean the same optimisation. ``--partition iid``
shards the samples as ``torch.utils.data.DistributedSampler`` does; ``labels`` gives rank
``r`` the samples of hethpc's label-skew partition (``--labels-per-rank`` labels each), each
rank's share shuffled every epoch and padded with its own samples to the largest share, so that
every rank takes the same number of steps (Horovod's allreduce needs it).

Made for the evidence protocol (``benchmarks/bench_evidence.py``, docs/evaluation.md), the
run can be scored as hethpc's runs are (``benchmarks/_peer_eval.py``): ``--val-fraction``
holds out the validation split hethpc holds out (the same samples for the same ``--samples``
and ``--data-seed``; training uses the rest), ``--eval-every-steps`` evaluates every so many
steps instead of every epoch, on the validation split when there is one, with the training
clock stopped; the test split is then scored once, at the end. A non-finite training loss on
any rank ends the run as diverged at the next evaluation. The training loop itself is
Horovod's. ``run(argv)`` does the same in a process that is already an MPI rank (Horovod
started for the run and shut down after it unless it was up already), for the protocol's
scenarios, which run every method in one MPI job.

Rank 0 prints one line per epoch (its training time, evaluations excluded, the mean training
loss over all ranks, and the score of the evaluation at its end) and the summary as one JSON
object on the last line, also written to ``--out``: the epochs, the evaluations (``curve``:
step, training seconds without evaluations, score), the final test and validation accuracies,
and ``diverged`` (None, or why the run stopped).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import horovod.torch as hvd
import torch
import torch.nn.functional as F
from _peer_args import add_run_args, check_run_args, lr_schedule
from _peer_data import load_data, train_split
from _peer_eval import Evaluations
from torch.utils.data import DataLoader

from hethpc.models import build_model

PEER = "horovod"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_args(p)
    p.add_argument("--fp16-allreduce", action="store_true",
                   help="compress gradients to fp16 in the allreduce (Horovod's Compression.fp16)")
    p.add_argument("--out", type=Path, help="write the JSON summary here (rank 0)")
    args = p.parse_args(argv)
    check_run_args(p, args)
    return args


def metric_sum(values: list[float], name: str = "metric_sum") -> list[float]:
    """``values`` summed over the ranks."""
    return hvd.allreduce(torch.tensor(values, dtype=torch.float64), op=hvd.Sum, name=name).tolist()


def train(args: argparse.Namespace) -> dict[str, Any]:
    """Train and evaluate after ``hvd.init()``; the summary (the same on every rank but for
    the times)."""
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)  # Horovod: limit the CPU threads used per worker
    if args.batch_size % hvd.size():
        raise SystemExit(f"--batch-size {args.batch_size} must be a multiple of the "
                         f"{hvd.size()} ranks (every rank takes an equal batch)")  # fmt: skip
    per_rank = args.batch_size // hvd.size()
    data = load_data(args, hvd.rank(), hvd.barrier)
    train_set, sampler = train_split(args, data, hvd.rank(), hvd.size())
    train_loader = DataLoader(train_set, batch_size=per_rank, sampler=sampler)

    model = build_model("cnn1d_wide", tuple(data.train.tensors[0].shape[1:]), 10)
    with torch.no_grad():
        model(data.train.tensors[0][:2])  # materialise the lazy layer before the broadcast
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression, op=hvd.Average)  # fmt: skip
    schedule = lr_schedule(optimizer, args.lr_schedule, args.epochs * len(train_loader))
    evals = Evaluations(model, every=args.eval_every_steps or len(train_loader), test=data.test,
                        val=data.val, rank=hvd.rank(), size=hvd.size(),
                        metric_sum=metric_sum)  # fmt: skip

    epochs: list[dict[str, Any]] = []
    trained = 0.0  # samples over all ranks
    step, stop = 0, False
    start = time.perf_counter()
    evals.start()
    for epoch in range(1, args.epochs + 1):
        sampler.set_epoch(epoch)
        model.train()
        loss_sum = seen = 0.0
        t0 = evals.train_time()
        for x, y in train_loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            schedule.step()
            loss_sum += loss.item() * len(y)
            seen += len(y)
            step += 1
            stop = evals.after_step(step, loss.item())
            if stop:
                break
        time_s = evals.train_time() - t0
        loss_all, seen_all = metric_sum([loss_sum, seen], "train_loss")
        trained += seen_all
        row = {"epoch": epoch, "time_s": time_s, "train_loss": loss_all / seen_all,
               **evals.scores_at(step)}  # fmt: skip
        epochs.append(row)
        if hvd.rank() == 0:
            scored = "".join(f"  {k.replace('_acc', ' accuracy')} {v:.4f}"
                             for k, v in evals.scores_at(step).items())  # fmt: skip
            print(f"epoch {epoch}  time {time_s:.2f} s  train loss {row['train_loss']:.4f}"
                  f"{scored}", flush=True)  # fmt: skip
        if stop:
            break
    train_s = sum(e["time_s"] for e in epochs)
    return {
        "peer": PEER,
        "world_size": hvd.size(),
        "testbed": os.environ.get("HETHPC_TESTBED"),
        "epochs": epochs,
        "total_time_s": train_s,
        "wall_s": time.perf_counter() - start,
        "samples_per_s": trained / train_s,
        "steps_per_epoch": len(train_loader),
        "steps": step,
        "per_rank_batch": per_rank,
        "val_samples": 0 if data.val is None else len(data.val),
        **evals.finish(step),
        "settings": {**{k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                     "model": "cnn1d_wide"},  # fmt: skip
    }


def run(argv: Sequence[str]) -> dict[str, Any]:
    """One run with these command-line settings in a process that is already an MPI rank (a
    collective); its summary. Horovod is started for it and shut down after it, unless it was
    up already, so that it runs no background thread beside other work."""
    args = parse_args(argv)
    started = not hvd.is_initialized()
    hvd.init()
    try:
        return train(args)
    finally:
        if started:
            hvd.shutdown()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    hvd.init()
    summary = train(args)
    if hvd.rank() == 0:
        if args.out is not None:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(summary, indent=1) + "\n")
        print(json.dumps(summary), flush=True)
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
