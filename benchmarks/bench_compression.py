"""Fewer bytes on the wire: each ``--compression`` setting's bytes and step time on the
communication-bound model, beside Horovod's ``Compression.fp16`` and DDP's comm hooks, and
what each setting costs in accuracy.

    flock /tmp/hethpc-bench.lock .venv/bin/python benchmarks/bench_compression.py [--quick]

Three parts, each on 2 ranks (``--only`` picks some):

1. **emulated**: the built-in ``large`` model (an MLP of 7.4M parameters, 30 MB of float32
   gradients), global batch 32, BSP with ``--compression`` none, fp16, bf16 and powersgd:4 (and
   none and powersgd:4 with ``--overlap``), on shared memory with hethpc's link emulation at
   200 Mbit/s (``--link 200mbit:50us``). After
   ``WARMUP_STEPS`` unmeasured steps each (PowerSGD's plain first steps among them), ``--rounds``
   rounds of ``--steps`` steps, the settings in a random order per round; per setting the median
   step time, its ratio to fp32 BSP's step in the same round (the median of the rounds' ratios)
   and the bytes per step each rank sent (hethpc's own count, ``summary().bytes``). The peers
   have no emulation, so they are not in this part.
2. **testbed**: the same on hethpc's testbed (``hethpc.testbed``: two nodes of one core each,
   both links shaped to 200 Mbit/s by the kernel, no emulation), with the peers beside hethpc:
   PyTorch DDP over gloo (plain, ``fp16_compress_hook``, ``powerSGD_hook`` at rank 4 with as many
   plain first steps) and Horovod's ``DistributedOptimizer`` (plain, ``Compression.fp16``).
   Bytes per step here are what crossed each node's link (the kernel's counter of its ``eth0``,
   both directions, every protocol), so every contender is counted the same way.
3. **accuracy**: ``jobs/train.py``'s training (``hethpc.train.train``) on shared memory, IID
   MNIST-1D, the same settings for a method and its compressed variants (no tuning: each setting
   is compared with its own fp32 run at the same learning rate and batch): the default ``cnn1d``
   for 6 epochs (SGD, lr 0.05, global batch 128) with BSP (none, fp16, bf16, powersgd:4),
   SelSync and DiLoCo (none, int8), and the ``large`` model for 2 epochs (``--large-epochs``;
   Adam, lr 3e-4, global batch 32) with BSP none and powersgd:4 (``--models`` picks).
   ``--seeds`` seeds, the runs of a seed in a random order (``--methods`` picks among bsp,
   selsync and diloco); final test accuracy and the bytes each rank sent. A compressed
   setting's gap to its fp32 run is given on the medians and seed by seed (the median of the
   per-seed gaps, and how many seeds ended below), with the codec's own ratio of bytes.

Goals: PowerSGD rank 4 on ``large``: at least 4x fewer bytes per step than fp32 and at most 0.6x
its step time on the emulated link, final accuracy within 0.5 point of fp32 BSP's; on the
testbed hethpc's PowerSGD step at most 0.9x DDP's ``powerSGD_hook`` step and hethpc's fp16 step
at most 0.9x Horovod's ``Compression.fp16``; int8: SelSync and DiLoCo within 0.3 point of their
fp32 accuracy with at least 4x fewer bytes. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from _launch import relaunch, under_mpi  # noqa: E402
from _scratch import scratch  # noqa: E402
from bench_overhead import Loop  # noqa: E402

from hethpc import comm  # noqa: E402
from hethpc.comm.link import parse_link, set_link  # noqa: E402
from hethpc.data import load_mnist1d  # noqa: E402
from hethpc.train import TrainConfig, train  # noqa: E402

LINK = "200mbit:50us"
NODES = [{"cpu": 1.0, "link": "200mbit"}, {"cpu": 1.0, "link": "200mbit"}]
WARMUP_STEPS = 12  # past PowerSGD's 10 plain steps (hethpc's and DDP's)
# (name, loop kind, compression); the peers run on the testbed only
HETHPC = [(f"hethpc {c}", "hethpc", c) for c in ("none", "fp16", "bf16", "powersgd:4")] + [
    (f"hethpc overlap {c}", "overlap", c) for c in ("none", "powersgd:4")
]  # with --overlap: buckets allreduced during the backward pass, as DDP's and Horovod's
PEERS = [("ddp none", "ddp", "none"), ("ddp fp16", "ddp", "fp16"),
         ("ddp powersgd:4", "ddp", "powersgd:4"), ("horovod none", "horovod", "none"),
         ("horovod fp16", "horovod", "fp16")]  # fmt: skip
# The large MLP learns MNIST-1D with Adam (SGD at lr 0.05 leaves it at chance), at the step
# parts' global batch.
LARGE: dict[str, Any] = {"sync": "bsp", "optimizer": "adam", "lr": 3e-4, "batch_size": 32}
# (name, model, epochs, TrainConfig fields) of the accuracy part
ACCURACY: list[tuple[str, str, int, dict[str, Any]]] = [
    ("cnn1d bsp none", "cnn1d", 6, {"sync": "bsp"}),
    ("cnn1d bsp fp16", "cnn1d", 6, {"sync": "bsp", "compression": "fp16"}),
    ("cnn1d bsp bf16", "cnn1d", 6, {"sync": "bsp", "compression": "bf16"}),
    ("cnn1d bsp powersgd:4", "cnn1d", 6, {"sync": "bsp", "compression": "powersgd:4"}),
    ("cnn1d selsync none", "cnn1d", 6, {"sync": "selsync"}),
    ("cnn1d selsync int8", "cnn1d", 6, {"sync": "selsync", "compression": "int8"}),
    ("cnn1d diloco none", "cnn1d", 6,
     {"sync": "fedavg", "outer_optimizer": "nesterov", "fedavg_period": 25}),
    ("cnn1d diloco int8", "cnn1d", 6,
     {"sync": "fedavg", "outer_optimizer": "nesterov", "fedavg_period": 25, "compression": "int8"}),
    ("large bsp none", "large", 2, LARGE),
    ("large bsp powersgd:4", "large", 2, {**LARGE, "compression": "powersgd:4"}),
]  # fmt: skip


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a smoke run (a few minutes)")
    p.add_argument(
        "--only",
        default="emulated,testbed,accuracy",
        help="parts to run, comma-separated (default all three)",
    )
    p.add_argument("--rounds", type=int, default=5, help="step parts: rounds per setting")
    p.add_argument("--steps", type=int, default=6, help="step parts: measured steps per round")
    p.add_argument("--batch", type=int, default=32, help="step parts: global batch")
    p.add_argument("--link", default=LINK, help=f"the emulated part's link (default {LINK})")
    p.add_argument("--seeds", type=int, default=3, help="accuracy part: seeds")
    p.add_argument("--samples", type=int, default=20_000, help="MNIST-1D samples (80%% train)")
    p.add_argument("--models", default="cnn1d,large",
                   help="accuracy part: the models whose settings run (default both)")
    p.add_argument("--methods", default="bsp,selsync,diloco",
                   help="accuracy part: the methods whose settings run (default all three)")
    p.add_argument("--large-epochs", type=int, default=2,
                   help="accuracy part: epochs of the large model's runs (default 2)")
    p.add_argument("--part", help=argparse.SUPPRESS)  # a worker's part (under mpirun)
    p.add_argument("--out", type=Path, help=argparse.SUPPRESS)  # where a worker writes JSON
    args = p.parse_args(argv)
    for flag, word in (("models", 0), ("methods", 1)):
        known = {name.split()[word] for name, *_ in ACCURACY}
        wrong = sorted(set(getattr(args, flag).split(",")) - known)
        if wrong:
            p.error(f"--{flag}: unknown {wrong}; the accuracy part has {sorted(known)}")
    if args.large_epochs < 1:
        p.error(f"--large-epochs must be at least 1, got {args.large_epochs}")
    if args.quick:
        args.rounds, args.steps, args.seeds, args.samples = 2, 3, 1, 4000
    return args


def say(*a: object) -> None:
    if comm.rank() == 0:
        print(*a, flush=True)


def link_bytes() -> int:
    """Bytes this node's ``eth0`` sent and received (0 where there is none: shared memory)."""
    stats = Path("/sys/class/net/eth0/statistics")
    if not stats.is_dir():
        return 0
    return sum(int((stats / f).read_text()) for f in ("tx_bytes", "rx_bytes"))


LOOP_ARGS = argparse.Namespace(seed=0, lr=0.05)  # what bench_overhead.Loop reads of its args


def step_part(args: argparse.Namespace, where: str) -> dict[str, Any]:
    """Every setting's (and on the testbed every peer's) step on ``large``: rounds in turn."""
    from peer_ddp import close, connect

    connect(argparse.Namespace(master_addr=None, master_port=None))
    cache = os.environ.get("HETHPC_CACHE", str(Path.home() / ".cache" / "hethpc"))
    if comm.rank() == 0:
        load_mnist1d(num_samples=args.samples, seed=42, cache_dir=cache)
    comm.barrier()
    data, _ = load_mnist1d(num_samples=args.samples, seed=42, cache_dir=cache)
    if where == "emulated":
        set_link(parse_link(args.link))
    contenders = HETHPC + (PEERS if where == "testbed" else [])
    loops = {name: Loop(kind, "large", data, LOOP_ARGS, args.batch, compression)
             for name, kind, compression in contenders}  # fmt: skip
    say(
        f"{where}: large, global batch {args.batch}, {WARMUP_STEPS} warm-up steps, "
        f"{args.rounds} rounds of {args.steps} steps"
    )
    for loop in loops.values():
        loop.run(0, range(WARMUP_STEPS))
    times: dict[str, list[float]] = {n: [] for n in loops}
    wire: dict[str, list[float]] = {n: [] for n in loops}
    own: dict[str, list[float]] = {n: [] for n in loops}
    step = WARMUP_STEPS
    for r in range(args.rounds):
        order = list(loops)
        random.Random(1000 + r).shuffle(order)
        for name in order:
            loop = loops[name]
            sent0 = loop.policy.summary().bytes if loop.policy is not None else 0
            wire0 = link_bytes()
            dt = loop.run(0, range(step, step + args.steps))
            wire[name].append((link_bytes() - wire0) / args.steps)
            if loop.policy is not None:
                own[name].append((loop.policy.summary().bytes - sent0) / args.steps)
            times[name].append(dt / args.steps)
        step += args.steps
        say(f"  round {r + 1}: " + "  ".join(f"{n} {1e3 * times[n][-1]:.0f} ms" for n in loops))
    close()
    set_link(None)
    base = "hethpc none"
    out: dict[str, Any] = {}
    for name in loops:
        ratio = [t / b for t, b in zip(times[name], times[base], strict=True)]
        out[name] = {
            "step_ms": round(1e3 * statistics.median(times[name]), 1),
            "step_ms_rounds": [round(1e3 * t, 1) for t in times[name]],
            "step_vs_fp32": round(statistics.median(ratio), 3),
            "step_vs_fp32_spread": [round(min(ratio), 3), round(max(ratio), 3)],
            "own_bytes_per_step": round(statistics.median(own[name])) if own[name] else None,
            "wire_bytes_per_step": round(statistics.median(wire[name])) if where == "testbed"
            else None,
        }  # fmt: skip
    return out


def accuracy_part(args: argparse.Namespace, new_dir: Callable[[str], str]) -> dict[str, Any]:
    """Each accuracy run per seed, in a random order per seed; final test accuracy and bytes."""
    cache = os.environ.get("HETHPC_CACHE", str(Path.home() / ".cache" / "hethpc"))
    settings = [a for a in ACCURACY if a[1] in args.models.split(",")
                and a[0].split()[1] in args.methods.split(",")]  # fmt: skip
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, *_ in settings}
    for seed in range(args.seeds):
        order = list(settings)
        random.Random(2000 + seed).shuffle(order)
        for name, model, epochs, fields in order:
            run_dir = new_dir(name.replace(" ", "_").replace(":", ""))
            cfg = TrainConfig(**{
                "samples": args.samples, "cache_dir": cache, "model": model,
                "epochs": 1 if args.quick else args.large_epochs if model == "large" else epochs,
                "batch_size": 128, "lr": 0.05,
                "momentum": 0.9, "seed": seed, "eval_every": 0, "progress": False,
                "run_dir": run_dir, "watchdog_s": 300, **fields,
            })  # fmt: skip
            s = train(cfg, overwrite=True, log=lambda _m: None).summary
            r = {
                "seed": seed,
                "test_acc": s["test_acc"],
                "time_s": s["time_s"],
                "bytes": s["bytes"],
                "compression_ratio": s.get("compression_ratio"),
            }
            runs[name].append(r)
            say(f"  seed {seed} {name:24} acc {r['test_acc']:.4f}  {r['bytes'] / 1e6:8.1f} MB "
                f"sent per rank  {r['time_s']:5.1f} s")  # fmt: skip
    return runs


def worker(args: argparse.Namespace) -> None:
    comm.init(transport="auto")
    torch.set_num_threads(1)
    if args.part == "accuracy":
        with scratch("bench-compression-") as new_dir:
            out: dict[str, Any] = accuracy_part(args, new_dir)
    else:
        out = step_part(args, args.part)
    if comm.rank() == 0 and args.out is not None:
        args.out.write_text(json.dumps(out))


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def _paired(base: list[dict[str, Any]], comp: list[dict[str, Any]]) -> list[float]:
    """Per seed both ran: base's test accuracy minus comp's."""
    mine = {r["seed"]: r["test_acc"] for r in comp}
    return [r["test_acc"] - mine[r["seed"]] for r in base if r["seed"] in mine]


def run_part(part: str, args: argparse.Namespace, argv: list[str], tmp: Path) -> dict[str, Any]:
    """One part on 2 ranks (inside a testbed for ``testbed``); its JSON."""
    out = tmp / f"{part}.json"
    worker_argv = [*argv, "--part", part, "--out", str(out)]
    if part != "testbed":
        rc = relaunch(__file__, 2, worker_argv, timeout_s=3600)
    else:
        from hethpc.testbed import Testbed

        cmd = [str(ROOT / "scripts" / "mpirun.sh"), "-np", "2", sys.executable,
               str(Path(__file__).resolve()), *worker_argv]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": "1", "HETHPC_MPIRUN_TIMEOUT": "1800"}
        with Testbed(NODES, name="bcomp") as bed:
            rc = bed.run(cmd, env=env, cwd=ROOT).returncode
    if rc != 0 or not out.is_file():
        raise SystemExit(f"bench_compression: the {part} part failed (exit {rc})")
    return json.loads(out.read_text())


def figures(res: dict[str, Any]) -> dict[str, Any]:
    """The headline figures, flat (one row each in RESULTS.md; the goals: run_all.GOALS)."""
    g: dict[str, Any] = {}
    emu, bed, acc = res.get("emulated"), res.get("testbed"), res.get("accuracy")
    for where, part in (("emulated", emu), ("testbed", bed)):
        if not part:
            continue
        fp32 = part["hethpc none"]["own_bytes_per_step"]
        for name, f in part.items():
            key = name.replace(" ", "_").replace(":", "")
            g[f"{where}_{key}_step_ms"] = f["step_ms"]
            g[f"{where}_{key}_step_vs_fp32"] = f["step_vs_fp32"]
            if f["own_bytes_per_step"]:
                g[f"{where}_{key}_fewer_bytes"] = round(fp32 / f["own_bytes_per_step"], 2)
            if f["wire_bytes_per_step"]:
                g[f"{where}_{key}_wire_mb_per_step"] = round(f["wire_bytes_per_step"] / 1e6, 2)
    if bed:
        for ours, theirs in (
            ("hethpc powersgd:4", "ddp powersgd:4"),
            ("hethpc overlap powersgd:4", "ddp powersgd:4"),
            ("hethpc overlap none", "ddp none"),
            ("hethpc fp16", "horovod fp16"),
            ("hethpc none", "ddp none"),
            ("hethpc none", "horovod none"),
            ("hethpc fp16", "ddp fp16"),
        ):
            key = f"testbed_{ours}_over_{theirs}".replace(" ", "_").replace(":", "")
            g[key] = round(bed[ours]["step_ms"] / bed[theirs]["step_ms"], 3)
    if acc:
        med = {n: _median([r["test_acc"] for r in rs]) for n, rs in acc.items()}
        sent = {n: _median([r["bytes"] for r in rs]) for n, rs in acc.items()}
        for name in acc:
            key = name.replace(" ", "_").replace(":", "")
            g[f"acc_{key}"] = round(med[name], 4)
        for base, comp in (
            ("large bsp none", "large bsp powersgd:4"),
            ("cnn1d bsp none", "cnn1d bsp powersgd:4"),
            ("cnn1d bsp none", "cnn1d bsp fp16"),
            ("cnn1d bsp none", "cnn1d bsp bf16"),
            ("cnn1d selsync none", "cnn1d selsync int8"),
            ("cnn1d diloco none", "cnn1d diloco int8"),
        ):
            if base not in med or comp not in med:
                continue  # a model left out (--models)
            key = comp.replace(" ", "_").replace(":", "")
            gap = round(100 * (med[base] - med[comp]), 2)
            g[f"acc_{key}_points_below_fp32"] = gap
            g[f"acc_{key}_fewer_bytes"] = round(sent[base] / sent[comp], 2)
            # Seed by seed (the same seed: the same data order and start): the median of the
            # gaps, and how many seeds the compressed run ended below its fp32 run.
            pairs = _paired(acc[base], acc[comp])
            if pairs:
                g[f"acc_{key}_paired_points_below_fp32"] = round(100 * _median(pairs), 2)
                g[f"acc_{key}_seeds_below_fp32"] = f"{sum(d > 0 for d in pairs)} of {len(pairs)}"
            ratios = [r["compression_ratio"] for r in acc[comp] if r.get("compression_ratio")]
            if ratios:  # what the codec sent per average, whatever the number of averages
                g[f"acc_{key}_codec_ratio"] = round(_median(ratios), 3)
    return g


def report(res: dict[str, Any]) -> None:
    for where in ("emulated", "testbed"):
        if where not in res:
            continue
        print(f"\n{where}: large (7.4M parameters), median step [min..max of the rounds' "
              "ratios to fp32 BSP]")  # fmt: skip
        for name, f in res[where].items():
            lo, hi = f["step_vs_fp32_spread"]
            own = f"{f['own_bytes_per_step'] / 1e6:7.2f} MB" if f["own_bytes_per_step"] else "-"
            w = f["wire_bytes_per_step"]
            wire = f"{w / 1e6:7.2f} MB on the link" if w else ""
            print(f"  {name:18} {f['step_ms']:8.1f} ms  {f['step_vs_fp32']:.3f}x "
                  f"[{lo:.3f}..{hi:.3f}]  sent {own}/step {wire}")  # fmt: skip
    if "accuracy" in res:
        print("\naccuracy: final test accuracy per seed, MB sent per rank (median)")
        for name, rs in res["accuracy"].items():
            accs = " ".join(f"{r['test_acc']:.4f}" for r in rs)
            mb = _median([r["bytes"] for r in rs]) / 1e6
            print(f"  {name:24} median {_median([r['test_acc'] for r in rs]):.4f}  "
                  f"({accs})  {mb:8.1f} MB")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if under_mpi():
        worker(args)
        return 0
    parts = [p for p in args.only.split(",") if p]
    unknown = set(parts) - {"emulated", "testbed", "accuracy"}
    if unknown:
        raise SystemExit(f"--only: unknown parts {sorted(unknown)}; pick from emulated, "
                         "testbed, accuracy")  # fmt: skip
    if "testbed" in parts:
        from hethpc.testbed.kernel import missing

        lack = missing()
        if lack:
            raise SystemExit("the testbed part needs a testbed; this host lacks "
                             + "; ".join(lack) + " (run --only emulated,accuracy)")  # fmt: skip
    res: dict[str, Any] = {"quick": args.quick}
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="bench-compression-") as d:
        for part in parts:
            print(f"part {part}", flush=True)
            res[part] = run_part(part, args, argv, Path(d))
    res["wall_s"] = round(time.time() - t0)
    report(res)
    print(json.dumps({**figures(res), "detail": res}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
