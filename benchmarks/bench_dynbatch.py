"""Dynamic batching vs uniform batches with one rank emulated FACTOR times slower.

    flock /tmp/hethpc-bench.lock .venv/bin/python benchmarks/bench_dynbatch.py [--quick]

Launches itself under ``scripts/mpirun.sh`` on 2 ranks (and 4, oversubscribed, unless
``--quick``). Each launch trains a 1-D CNN on MNIST-1D three times:

1. uniform batches, rank 1 slowed FACTOR x, ``--epochs`` epochs;
2. dynamic batching, same slowdown, same seed, same epochs (accuracy compared with 1);
3. dynamic batching while the slowdown changes: FACTOR x, then 1x at step S, FACTOR x at 2S.

Runs 1 and 2 alternate epoch by epoch (U D, D U, U D, ...), so that both are timed on the same
machine: on a shared 2-core host the speed drifts by tens of percent over seconds.

Every step each rank takes its slice of one seeded global permutation by its current size,
times forward + backward (stretched by the emulated slowdown: rank 1 sleeps through its extra
time, or computes with ``--slowdown-mode busy``), and combines gradients with
``weighted_gradient_allreduce``. The global batch is large (1024) so that a step's compute
(about 0.1-0.3 s) dwarfs what it does not count: the allreduce and optimiser step (about 5 ms)
and a fixed cost per forward/backward (about 1.5 ms), which at small batches (128) made step
time far from proportional to the batch.

The figures are defined in :mod:`_dynbatch_figures` (``run_figures``).

With ``--paced S`` each step's compute is paced to S seconds per sample: after the real forward
and backward the rank sleeps until then (and a slowed rank then stretches that). The timings are
then the emulated speeds alone and the host's noise is hidden under them, so the figures show
the control loop (real ranks, allgathers, decisions, Horovod allreduce, real training) apart
from the host; ``late_steps`` counts steps whose real compute overran the pace. Unless
``--quick``, paced runs (``--paced-run``, cnn1d(64) at 0.15 ms per sample) follow the others at
the same world sizes, reported under ``"paced"`` (2 ranks) and ``"paced_np4"``.

The last stdout line is one JSON object: the 2-rank figures at the top level, the 4-rank ones
under ``"np4"``, the paced ones under ``"paced"``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _dynbatch_plot import plot
from _training import gradients
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _dynbatch_figures import run_figures  # noqa: E402

from hethpc import comm  # noqa: E402
from hethpc.batching import (  # noqa: E402
    BatchController,
    ControlSettings,
    weighted_gradient_allreduce,
)
from hethpc.batching.slowdown import pace  # noqa: E402
from hethpc.data import ArrayDataset, load_mnist1d  # noqa: E402
from hethpc.models import cnn1d  # noqa: E402
from hethpc.train.evaluation import evaluate  # noqa: E402


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="about a minute: 2 ranks, fewer steps")
    p.add_argument("--ranks", default=None, help="world sizes to run, e.g. '2,4' (default 2,4)")
    p.add_argument("--factor", type=float, default=3.0, help="slowdown of rank 1")
    p.add_argument(
        "--slowdown-mode",
        default="sleep",
        choices=("sleep", "busy"),
        help="rank 1 sleeps through its extra time (frees its core) or computes (busy, as a "
        "slower node would; with 4 ranks on 2 cores it takes time from the others)",
    )
    p.add_argument("--epochs", type=int, default=None, help="epochs of runs 1 and 2 (default 3)")
    p.add_argument("--samples", type=int, default=None, help="MNIST-1D samples (80%% train)")
    p.add_argument("--phase-steps", type=int, default=None, help="S: steps per phase of run 3")
    p.add_argument("--batch", type=int, default=1024, help="global batch B")
    p.add_argument("--channels", type=int, default=192, help="CNN channels (compute per sample)")
    p.add_argument(
        "--paced-run",
        type=float,
        default=1.5e-4,
        metavar="S",
        help="after the runs, the same world sizes again with --paced S and cnn1d(64), reported "
        "under 'paced' (2 ranks) and 'paced_npN' (0 or --quick: skip)",
    )
    p.add_argument(
        "--paced",
        type=float,
        default=0.0,
        metavar="S",
        help="pace each step's compute to S seconds per sample (sleep after the real forward and "
        "backward until then, before the slowdown stretch): the timings are then the emulated "
        "speeds alone, the host's noise hidden under them, which shows the control loop apart "
        "from the host (pick S above the real per-sample time: see late_steps; 0: off)",
    )
    p.add_argument("--interval", type=int, default=20, help="steps between control decisions")
    p.add_argument("--balance-tol", type=float, default=0.10, help="balanced: max/min - 1 <= tol")
    p.add_argument("--seed", type=int, default=0, help="model init and shuffling seed")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--plot", default=None, help="write a PNG of sizes and times over steps")
    p.add_argument(
        "--cache-dir",
        default=os.environ.get("HETHPC_CACHE", str(Path.home() / ".cache" / "hethpc")),
    )
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    a.ranks = a.ranks or ("2" if a.quick else "2,4")
    a.epochs = a.epochs or (2 if a.quick else 3)
    a.samples = a.samples or (20_000 if a.quick else 50_000)
    a.phase_steps = a.phase_steps or (60 if a.quick else 100)
    return a


# ---- worker: runs on every rank under mpirun -------------------------------------------------


def say(*parts: object) -> None:
    if comm.rank() == 0:
        print(*parts, flush=True)


class Run:
    """One training run (its own model, optimiser and controller), advanced an epoch or a few
    steps at a time so that two runs can be interleaved epoch by epoch."""

    def __init__(
        self,
        args: argparse.Namespace,
        train_set: ArrayDataset,
        test_set: ArrayDataset,
        *,
        mode: str,
        slowdown: str,
    ) -> None:
        self.args, self.train_set, self.test_set, self.mode = args, train_set, test_set, mode
        torch.manual_seed(args.seed)
        self.model = cnn1d(train_set.x.shape[1:], train_set.num_classes, channels=args.channels)
        self.model(torch.from_numpy(train_set.x[:2]))
        comm.broadcast_model(self.model)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=args.lr, momentum=0.9)
        self.loss_fn = nn.CrossEntropyLoss()
        self.ctl = BatchController(
            args.batch,
            mode=mode,
            settings=ControlSettings(interval=args.interval),
            slowdown=slowdown,
            slowdown_mode=args.slowdown_mode,
        )
        self.per_epoch = len(train_set) // args.batch
        self.step = 0
        self.epoch_s: list[float] = []
        self.accuracy: list[float] = []
        self.log: list[tuple[int, int, float]] = []  # (step, batch, compute_s) of this rank
        self.late = 0  # paced steps whose real compute overran the pace
        self._perm = np.empty(0, dtype=np.int64)

    def _one_step(self) -> None:
        B, r = self.args.batch, comm.rank()
        epoch, k = divmod(self.step, self.per_epoch)
        if k == 0:
            self._perm = np.random.default_rng(self.args.seed + epoch).permutation(
                len(self.train_set)
            )
        sizes = self.ctl.batch_sizes
        b = int(sizes[r])
        lo = k * B + int(sizes[:r].sum())
        idx = self._perm[lo : lo + b]
        x, y = torch.from_numpy(self.train_set.x[idx]), torch.from_numpy(self.train_set.y[idx])
        t0 = time.perf_counter()
        gradients(self.model, self.opt, x, y, self.loss_fn)
        if self.args.paced and not pace(t0, b * self.args.paced):
            self.late += 1
        compute_s = self.ctl.timer_stop(t0)
        weighted_gradient_allreduce(self.model.parameters(), weight=b / B)
        self.opt.step()
        self.ctl.update(step=self.step, compute_s=compute_s)
        self.log.append((self.step, b, compute_s))
        self.step += 1

    def run_steps(self, n: int) -> None:
        """``n`` steps, untimed (the change run)."""
        for _ in range(n):
            self._one_step()

    def run_epoch(self) -> None:
        """One timed epoch, then the test accuracy (every rank: the models are identical)."""
        comm.barrier()
        t0 = time.perf_counter()
        for _ in range(self.per_epoch):
            self._one_step()
        comm.barrier()
        self.epoch_s.append(time.perf_counter() - t0)
        self.accuracy.append(evaluate(self.model, self.test_set))
        say(
            f"  {self.mode:8s} epoch {len(self.epoch_s)}: {self.epoch_s[-1]:.2f} s, test accuracy "
            f"{100 * self.accuracy[-1]:.1f}%, sizes {self.ctl.batch_sizes.tolist()}"
        )

    def result(self) -> dict[str, Any]:
        """Per-epoch times and accuracies, every rank's per-step records, the decisions."""
        return {
            "epoch_s": self.epoch_s,
            "accuracy": self.accuracy,
            "logs": comm.allgather_object(self.log),
            "decisions": [a.as_dict() for a in self.ctl.adjustments],
            "steps_per_epoch": self.per_epoch,
            "late": sum(comm.allgather_object(self.late)),
        }


_PACED_CHANNELS = 64  # about 40 us per sample here: well under the 150 us pace


def worker(args: argparse.Namespace) -> None:
    comm.abort_on_exception()
    comm.init()
    torch.set_num_threads(1)
    n, F = comm.size(), args.factor
    if comm.rank() == 0:
        load_mnist1d(num_samples=args.samples, cache_dir=args.cache_dir)
    comm.barrier()
    train_set, test_set = load_mnist1d(num_samples=args.samples, cache_dir=args.cache_dir)
    paced = f", compute paced to {1e3 * args.paced:g} ms/sample" if args.paced else ""
    say(
        f"{n} ranks, rank 1 slowed {F:g}x, global batch {args.batch}, cnn1d({args.channels})"
        + paced
    )

    # Runs 1 and 2 alternate epoch by epoch (U D, D U, U D, ...) so that both see the same
    # machine: on a shared host the speed drifts by tens of percent over minutes.
    uni_run = Run(args, train_set, test_set, mode="uniform", slowdown=f"1:{F:g}")
    dyn_run = Run(args, train_set, test_set, mode="dynamic", slowdown=f"1:{F:g}")
    for e in range(args.epochs):
        for run in (uni_run, dyn_run) if e % 2 == 0 else (dyn_run, uni_run):
            run.run_epoch()
    uni, dyn = uni_run.result(), dyn_run.result()
    S = args.phase_steps
    say(f"  change run: rank 1 at {F:g}x, 1x from step {S}, {F:g}x from step {2 * S}")
    chg_run = Run(
        args, train_set, test_set, mode="dynamic", slowdown=f"1:{F:g}@0,1:1@{S},1:{F:g}@{2 * S}"
    )
    chg_run.run_steps(3 * S)
    chg = chg_run.result()

    out = {
        "ranks": n,
        "factor": F,
        "slowdown_mode": args.slowdown_mode,
        **run_figures(
            uni, dyn, chg, global_batch=args.batch, epochs=args.epochs, phase_steps=S,
            interval=args.interval, tol=args.balance_tol, paced_s_per_sample=args.paced,
        ),  # fmt: skip
    }
    if args.plot and comm.rank() == 0:
        plot(args.plot, chg, S, n)
    if comm.rank() == 0:
        print(json.dumps(out), flush=True)


# ---- launcher: runs mpirun for each world size ------------------------------------------------


def launch_one(n: int, argv: list[str], label: str) -> dict[str, Any] | None:
    """One ``n``-rank run of the worker; its JSON result (None: it failed, said on stderr)."""
    cmd = [str(ROOT / "scripts" / "mpirun.sh"), "-np", str(n), sys.executable, __file__]
    cmd += ["--worker", *argv]
    print(f"bench_dynbatch: {label}: mpirun -np {n} ...", flush=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    lines = proc.stdout.strip().splitlines()
    for line in lines[:-1]:
        print(line, flush=True)
    if proc.returncode != 0 or not lines:
        print(f"bench_dynbatch: {label} run failed (exit {proc.returncode})", file=sys.stderr)
        return None
    r: dict[str, Any] = json.loads(lines[-1])
    print(
        f"  => {label}: uniform {r['uniform_epoch_s']} s/epoch, dynamic "
        f"{r['dynamic_epoch_s']} s, ideal {r['ideal_epoch_s']} s; speedup {r['speedup']}x "
        f"(ideal {r['ideal_speedup']}x); adjustments to balance "
        f"{r['adjustments_to_balance']}, intervals to rebalance "
        f"{r['intervals_to_rebalance']}, steady adjustments {r['steady_adjustments']}; "
        f"dynamic over ideal {r['dynamic_over_ideal']} = product of 1 + "
        f"{r['dynamic_over_ideal_parts']}; "
        f"accuracy {100 * r['uniform_accuracy']:.1f}% vs {100 * r['dynamic_accuracy']:.1f}%",
        flush=True,
    )
    return r


def launch(args: argparse.Namespace, argv: list[str]) -> int:
    results: dict[int, dict[str, Any]] = {}
    for n in [int(v) for v in args.ranks.split(",")]:
        extra = []
        if n != 2 and args.plot:
            extra = ["--plot", str(Path(args.plot).with_suffix(f".np{n}.png"))]
        r = launch_one(n, argv + extra, f"{n} ranks")
        if r is None:
            return 1
        results[n] = r
    top = dict(results.get(2) or next(iter(results.values())))
    for n, r in results.items():
        if n != top["ranks"]:
            top[f"np{n}"] = {k: v for k, v in r.items() if not k.startswith("decisions")}
    if args.paced_run and not args.paced and not args.quick:
        # The same with the compute paced: the control loop apart from the host.
        paced = ["--paced", str(args.paced_run), "--channels", str(_PACED_CHANNELS)]
        for n in results:
            r = launch_one(n, argv + paced, f"{n} ranks, paced")
            if r is None:
                return 1
            key = "paced" if n == 2 else f"paced_np{n}"
            top[key] = {k: v for k, v in r.items() if not k.startswith("decisions")}
    print(json.dumps(top), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    return launch(args, [a for a in argv if a != "--worker"])


if __name__ == "__main__":
    sys.exit(main())
