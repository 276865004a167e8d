"""Dynamic batching vs uniform batches with one rank emulated FACTOR times slower (issue 4).

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

Definitions: a rank's *throughput* is its samples over its compute seconds (all of them, slow
spells included, as the epoch times include them) in epochs 2..; the *ideal* epoch time is the
epoch's samples over the sum of the ranks' throughputs, each rank taken at the higher of its
throughputs in runs 1 and 2. Sizes are *balanced* when the step times they predict differ by
at most ``--balance-tol`` (max/min - 1), each rank's time taken as its size times its
per-sample compute time over the whole phase (run 2; each of run 3's three phases): the sizes
are judged, in hindsight, against the best measure of the speeds, not against the 20 steps a
decision sees, over which this host's speed alone wanders by up to 10 % (``timing_drift``).
``adjustments_to_balance``: adopted adjustments before the sizes of run 2 were balanced.
``intervals_to_rebalance``: for each change in run 3, decisions after the change before the
sizes were balanced at the new speeds (the largest over the changes).
``steady_adjustments``: adopted adjustments after balance, before the next change, summed over
runs 2 and 3. The same figures judged by each decision's own estimates (balanced: the smoothed
step times it gathered within the tolerance) are reported as ``*_by_estimate``.
``dynamic_epoch_s`` and ``uniform_epoch_s``: means over epochs 2.. (epoch 1 holds the transient
from uniform sizes, reported as ``dynamic_first_epoch_s``). ``dynamic_over_ideal_parts``
splits dynamic over ideal into factors whose product it is: ``speed`` (the ranks' mean compute
over the ideal: slower than at their best), ``imbalance`` (the busiest rank's total compute over
the mean: what the sizes cost), ``step_noise`` (the sum over steps of the slowest rank's
compute over the busiest rank's total: each step waits for the slower of two noisy ranks) and
``outside_compute`` (the allreduce, optimiser and waiting), from the per-epoch sums
``dynamic_slowest_compute_epoch_s`` (over steps, the slowest rank's compute),
``dynamic_busiest_rank_compute_epoch_s`` and ``dynamic_mean_compute_epoch_s``;
``ideal_same_run_epoch_s`` is the ideal at the dynamic run's own throughputs.
``timing_noise``: per rank, the standard deviation of the log compute time per step in run 1;
``timing_drift``: of the log mean per-sample time over blocks of ``--interval`` steps in run 1
(fixed sizes).

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
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _training import gradients
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hethpc import comm  # noqa: E402
from hethpc.batching import BatchController, weighted_gradient_allreduce  # noqa: E402
from hethpc.batching.figures import (  # noqa: E402
    block_drift,
    brief,
    judged,
    loss_parts,
    phase_figures,
    throughput,
    to_balance,
)
from hethpc.batching.slowdown import pace  # noqa: E402
from hethpc.data import ArrayDataset, load_mnist1d  # noqa: E402
from hethpc.models import cnn1d  # noqa: E402
from hethpc.train import evaluate  # noqa: E402


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
            interval=args.interval,
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

    # Epoch 1 of the dynamic run holds the transient from uniform sizes; both runs are compared
    # over epochs 2.. (measured side by side), and the ranks' throughputs are taken from the
    # uniform run's steps in those epochs.
    spe = uni["steps_per_epoch"]
    e0 = 1 if args.epochs > 1 else 0
    skip = e0 * spe or min(5, spe // 4)
    X = [throughput(log[skip:]) for log in uni["logs"]]
    X_dyn = [throughput(log[skip:]) for log in dyn["logs"]]
    noise = [statistics.pstdev(np.log([t for _, _, t in log[skip:]])) for log in uni["logs"]]
    # Each rank at the faster of its two measured speeds: a run that slowed a rank down (the
    # host's speed depends on what both cores do) then cannot flatter the ideal.
    ideal = spe * args.batch / sum(max(u, d) for u, d in zip(X, X_dyn, strict=True))
    # Where the dynamic run's time goes, over the same epochs: the ideal at its own measured
    # speeds; each step's slowest compute (the balance and the per-step noise); the rest
    # (allreduce, optimiser, waiting outside compute).
    ideal_same = spe * args.batch / sum(X_dyn)
    per_step = np.array([[t for _, _, t in log[skip:]] for log in dyn["logs"]])
    dyn_epochs = max(1, per_step.shape[1] / spe)
    uniform_epoch = statistics.mean(uni["epoch_s"][e0:])
    dynamic_epoch = statistics.mean(dyn["epoch_s"][e0:])
    tol = args.balance_tol

    # Balance judged in hindsight (the sizes at each phase's mean speeds), the goals' figures.
    n_dyn = len(dyn["logs"][0])
    f2 = judged(dyn, [0, n_dyn]).phase(0, n_dyn, tol)
    bounds = [0, S, 2 * S, 3 * S]
    r3 = judged(chg, bounds)
    f3 = [r3.phase(bounds[i], bounds[i + 1], tol) for i in range(3)]
    rebalance = [f.intervals_to_balance for f in f3[1:]]
    # The same by each decision's own estimates (20 steps or more at the sizes in force).
    first_est, steady2_est = phase_figures(dyn["decisions"], 0, 10**9, tol)
    applied_before = None
    if first_est is not None:
        applied_before = sum(1 for d in dyn["decisions"][:first_est] if d["applied"])
    rebalance_est: list[int | None] = []
    steady3_est = 0
    for i in range(3):
        first, steady = phase_figures(chg["decisions"], bounds[i], bounds[i + 1], tol)
        steady3_est += steady
        if i > 0:
            rebalance_est.append(first)
    parts, (slowest, busiest, mean_rank) = loss_parts(dynamic_epoch, ideal, per_step / dyn_epochs)
    acc_u, acc_d = uni["accuracy"][-1], dyn["accuracy"][-1]
    out = {
        "ranks": n,
        "factor": F,
        "slowdown_mode": args.slowdown_mode,
        "global_batch": args.batch,
        "steps_per_epoch": spe,
        "uniform_epoch_s": round(uniform_epoch, 3),
        "uniform_first_epoch_s": round(uni["epoch_s"][0], 3),
        "dynamic_epoch_s": round(dynamic_epoch, 3),
        "dynamic_first_epoch_s": round(dyn["epoch_s"][0], 3),
        "ideal_epoch_s": round(ideal, 3),
        "speedup": round(uniform_epoch / dynamic_epoch, 3),
        "ideal_speedup": round(uniform_epoch / ideal, 3),
        "dynamic_over_ideal": round(dynamic_epoch / ideal, 3),
        "ideal_same_run_epoch_s": round(ideal_same, 3),
        "dynamic_over_ideal_same_run": round(dynamic_epoch / ideal_same, 3),
        "dynamic_slowest_compute_epoch_s": round(slowest, 3),
        "dynamic_busiest_rank_compute_epoch_s": round(busiest, 3),
        "dynamic_mean_compute_epoch_s": round(mean_rank, 3),
        # dynamic / ideal = the product of (1 + each part), exactly.
        "dynamic_over_ideal_parts": {k: round(v, 4) for k, v in parts.items()},
        "adjustments_to_balance": to_balance(f2),
        "intervals_to_rebalance": None if None in rebalance else max(rebalance),  # type: ignore[type-var]
        "intervals_to_rebalance_per_change": rebalance,
        "steady_adjustments": f2.steady_adjustments + sum(f.steady_adjustments for f in f3),
        "final_imbalance": round(f2.final_imbalance, 4),
        "phase_final_imbalance": [round(f.final_imbalance, 4) for f in f3],
        "adjustments_to_balance_by_estimate": applied_before,
        "intervals_to_rebalance_by_estimate": rebalance_est,
        "steady_adjustments_by_estimate": steady2_est + steady3_est,
        "throughputs": [round(x, 1) for x in X],
        "dynamic_throughputs": [round(x, 1) for x in X_dyn],
        "timing_noise": [round(v, 3) for v in noise],
        "timing_drift": [round(block_drift(log[skip:], args.interval), 3) for log in uni["logs"]],
        "final_sizes": dyn["decisions"][-1]["new_sizes"] if dyn["decisions"] else None,
        "epochs": args.epochs,
        "paced_s_per_sample": args.paced,
        "late_steps": uni["late"] + dyn["late"] + chg["late"],
        "uniform_accuracy": round(acc_u, 4),
        "dynamic_accuracy": round(acc_d, 4),
        "accuracy_gap_points": round(100 * abs(acc_u - acc_d), 2),
        "decisions_run2": [brief(d) for d in dyn["decisions"]],
        "decisions_run3": [brief(d) for d in chg["decisions"]],
    }
    if args.plot and comm.rank() == 0:
        plot(args.plot, chg, S, n)
    if comm.rank() == 0:
        print(json.dumps(out), flush=True)


def plot(path: str, run: dict[str, Any], S: int, n: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    for k in range(n):
        steps = [s for s, _, _ in run["logs"][k]]
        ax1.plot(steps, [b for _, b, _ in run["logs"][k]], label=f"rank {k}")
        ax2.plot(steps, [1e3 * t for _, _, t in run["logs"][k]], label=f"rank {k}")
    for ax in (ax1, ax2):
        for s in (S, 2 * S):
            ax.axvline(s, color="grey", ls=":")
        ax.legend()
    ax1.set_ylabel("batch size")
    ax2.set_ylabel("compute ms / step")
    ax2.set_xlabel("step")
    fig.suptitle("dynamic batching: rank 1 slowdown changes at the dotted lines")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


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
