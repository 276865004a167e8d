"""Loader throughput on a >= 1 GB synthetic HDF5 dataset, beside raw and naive h5py reads.

    flock /tmp/hethpc-bench.lock .venv/bin/python benchmarks/bench_loader.py [--quick]

Measures samples/s for a few batch sizes, side by side in one run:
  loader: hethpc.data.Loader as configured by default on a dataset opened by default
          (``open_dataset(path)``: sha256 of every shard checked once, then uncompressed chunks
          read as raw bytes without HDF5's per-chunk Fletcher32 test; IID mode, chunk-aware
          shuffle, prefetch="auto": this loop does nothing between batches, so it reads in
          line); beside it, the same loader with the prefetch thread forced on
          (``loader_prefetch``) and on a dataset opened with ``verify=False``, whose reads go
          through HDF5 and its Fletcher32 test on every chunk (``loader_checked``);
  raw:    contiguous slices ``x[a:a+B]`` of each shard in file order through h5py (the
          practical limit, Fletcher32 tested by HDF5), and beside it contiguous raw chunk bytes
          (``read_direct_chunk``) copied into each batch: the limit of the loader's raw path
          (``raw_chunks``);
  naive:  a torch Dataset reading one sample per ``__getitem__`` from h5py, through a shuffling
          DataLoader (what users write first).
All read the same files after one warm-up pass (the page cache then holds them), the same
float32 samples stored with the Fletcher32 filter, single-threaded (the forced prefetch thread
aside). The machine is shared, so loader and raw are measured in --rounds
alternating rounds and each method's best round is reported (like ``timeit``), with every
round's loader/raw ratio beside it to show the spread.
The dataset is written once to --path (under /tmp) and reused by later runs.
The last stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np
import torch

from hethpc.data import (
    DatasetError,
    Loader,
    ShardedDataset,
    block_shuffle,
    open_dataset,
    write_dataset,
)
from hethpc.data.sources import synthetic_pieces


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--path", default="/tmp/hethpc-bench-loader/train",
                   help="dataset directory (written if absent, reused if present)")
    p.add_argument("--gigabytes", type=float, default=1.0, help="dataset size")
    p.add_argument("--sample-floats", type=int, default=1024, help="float32 values per sample")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[64, 256, 1024])
    p.add_argument("--read-mb", type=float, default=256.0,
                   help="megabytes read per measurement (loader and raw)")
    p.add_argument("--rounds", type=int, default=3,
                   help="alternating rounds of raw and loader per batch size (best is kept)")
    p.add_argument("--naive-seconds", type=float, default=6.0, help="time per naive measurement")
    p.add_argument("--quick", action="store_true", help="about a minute: fewer bytes per point")
    return p.parse_args(argv)


def ensure_dataset(path: Path, num_samples: int, floats: int) -> ShardedDataset:
    """Open the benchmark dataset, writing it first if absent or of another size."""
    want = {"bench": "loader", "samples": num_samples, "floats": floats}
    if (path / "manifest.json").is_file():
        try:
            ds = open_dataset(path, verify=False)
            if ds.manifest.meta.get("bench") == want:
                print(f"reusing {path} ({len(ds)} samples)", flush=True)
                return ds
        except DatasetError as e:
            print(f"rewriting {path}: {e}", flush=True)
    elif path.exists():
        sys.exit(f"{path} exists and is not a hethpc dataset; choose another --path")
    t0 = time.perf_counter()
    print(f"writing {num_samples} samples x {floats} float32 to {path} ...", flush=True)
    write_dataset(path, synthetic_pieces(num_samples, (floats,), num_classes=10, seed=0),
                  num_classes=10, shard_samples=65_536, force=True, name="bench-loader",
                  meta={"bench": want})
    print(f"  written in {time.perf_counter() - t0:.1f} s", flush=True)
    return open_dataset(path, verify=False)


def warm(ds: ShardedDataset) -> None:
    """Read every file once, so each method reads from the same (cached) state."""
    for s in ds.manifest.shards:
        with open(ds.root / s.file, "rb") as f:
            while f.read(1 << 24):
                pass


def contiguous(
    ds: ShardedDataset, b: int, budget: int, read: Callable[[h5py.Dataset, int, int], np.ndarray]
) -> float:
    """Samples/s of batches ``read(x, a, a + b)`` taken in file order, shard after shard."""
    files = [h5py.File(ds.root / s.file, "r") for s in ds.manifest.shards]
    done, t0 = 0, time.perf_counter()
    for f in files:
        x, y = f["x"], f["y"]
        for a in range(0, x.shape[0], b):
            xb, yb = torch.from_numpy(read(x, a, a + b)), torch.from_numpy(y[a : a + b])
            done += len(xb) + 0 * len(yb)
            if done >= budget:
                break
        if done >= budget:
            break
    dt = time.perf_counter() - t0
    for f in files:
        f.close()
    return done / dt


def bench_raw(ds: ShardedDataset, b: int, budget: int) -> float:
    """Contiguous slices through h5py (HDF5 tests each chunk's Fletcher32)."""
    return contiguous(ds, b, budget, lambda x, a, e: x[a:e])


def bench_raw_chunks(ds: ShardedDataset, b: int, budget: int) -> float:
    """Contiguous batches assembled from raw chunk bytes (``read_direct_chunk``)."""
    c = ds.chunk_samples
    per = c * int(np.prod(ds.sample_shape))
    buf = np.empty(per * ds.dtype.itemsize + 64, np.uint8)
    origin = tuple(0 for _ in ds.sample_shape)

    def read(x: h5py.Dataset, a: int, e: int) -> np.ndarray:
        e = min(e, x.shape[0])
        out = np.empty((e - a, *ds.sample_shape), ds.dtype)
        for c0 in range(a - a % c, e, c):
            _, raw = x.id.read_direct_chunk((c0, *origin), out=buf)
            rows = np.frombuffer(raw, ds.dtype, count=per).reshape(c, *ds.sample_shape)
            lo, hi = max(a, c0), min(e, c0 + c)
            out[lo - a : hi - a] = rows[lo - c0 : hi - c0]
        return out

    return contiguous(ds, b, budget, read)


def bench_loader(ds: ShardedDataset, b: int, budget: int, prefetch: bool | str) -> float:
    ds.close()
    loader = Loader(ds, rank=0, world_size=1, seed=0, prefetch=prefetch)
    # The first call builds the epoch's order (once per epoch, ~0.1 s per million samples;
    # printed apart) and opens the files: measure the steady state after it.
    loader.next_batch([b])
    done, t0 = 0, time.perf_counter()
    while done < budget:
        x, _ = loader.next_batch([b])
        done += len(x)
    dt = time.perf_counter() - t0
    loader.close()
    return done / dt


class NaiveH5(torch.utils.data.Dataset[tuple[torch.Tensor, int]]):
    """One sample per __getitem__, straight from h5py (the usual first attempt)."""

    def __init__(self, ds: ShardedDataset) -> None:
        self.files = [str(ds.root / s.file) for s in ds.manifest.shards]
        self.starts = np.cumsum([0] + [s.num_samples for s in ds.manifest.shards])
        self.handles: list[h5py.File] | None = None

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if self.handles is None:
            self.handles = [h5py.File(f, "r") for f in self.files]
        s = int(np.searchsorted(self.starts, i, side="right") - 1)
        f = self.handles[s]
        j = i - int(self.starts[s])
        return torch.from_numpy(f["x"][j]), int(f["y"][j])


def bench_naive(ds: ShardedDataset, b: int, seconds: float) -> float:
    dl = torch.utils.data.DataLoader(NaiveH5(ds), batch_size=b, shuffle=True, num_workers=0)
    done, t0 = 0, time.perf_counter()
    for x, _ in dl:
        done += len(x)
        if time.perf_counter() - t0 > seconds:
            break
    return done / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    if args.quick:
        args.read_mb, args.naive_seconds = min(args.read_mb, 128.0), min(args.naive_seconds, 3.0)
        args.rounds = min(args.rounds, 2)
    sample_bytes = 4 * args.sample_floats
    n = int(np.ceil(args.gigabytes * 1e9 / sample_bytes))
    checked = ensure_dataset(Path(args.path), n, args.sample_floats)
    t0 = time.perf_counter()
    ds = open_dataset(args.path)  # as users open it: sha256-verified, raw chunk reads
    print(f"open_dataset with its sha256 check: {time.perf_counter() - t0:.2f} s", flush=True)
    size = sum(s.num_bytes for s in ds.manifest.shards)
    print(f"dataset: {len(ds)} samples, {size / 1e9:.2f} GB, chunk {ds.chunk_samples} samples, "
          f"{len(ds.manifest.shards)} shards; warming the page cache", flush=True)
    warm(ds)
    budget = int(args.read_mb * 1e6 / sample_bytes)
    t0 = time.perf_counter()
    block_shuffle(np.arange(len(ds)), chunk=ds.chunk_samples, window=16, seed=0, epoch=0)
    print(f"epoch order (once per epoch): {time.perf_counter() - t0:.3f} s", flush=True)
    rows, spread = {}, {}
    for b in args.batch_sizes:
        runs: dict[str, list[float]] = {k: [] for k in
                                         ("raw", "loader", "loader_prefetch", "loader_checked",
                                          "raw_chunks")}
        for _ in range(max(1, args.rounds)):
            runs["raw"].append(bench_raw(ds, b, budget))
            runs["loader"].append(bench_loader(ds, b, budget, prefetch="auto"))
            runs["loader_prefetch"].append(bench_loader(ds, b, budget, prefetch=True))
            runs["loader_checked"].append(bench_loader(checked, b, budget, prefetch="auto"))
            runs["raw_chunks"].append(bench_raw_chunks(ds, b, budget))
            print(f"  batch {b:>5} round: " + "  ".join(
                f"{k} {v[-1]:>9.0f}/s" for k, v in runs.items()), flush=True)
        rows[b] = {k: max(v) for k, v in runs.items()}
        rows[b]["naive"] = naive = bench_naive(ds, b, args.naive_seconds)
        load, raw = rows[b]["loader"], rows[b]["raw"]
        spread[b] = [round(f / r, 3) for f, r in zip(runs["loader"], runs["raw"], strict=True)]
        print(f"batch {b:>5}: " + "  ".join(f"{k} {v:>9.0f}/s" for k, v in rows[b].items())
              + f"  loader/raw {load / raw:.2f} (rounds {spread[b]})  loader_checked/raw "
              f"{rows[b]['loader_checked'] / raw:.2f}  loader/raw_chunks "
              f"{load / rows[b]['raw_chunks']:.2f}  loader/naive {load / naive:.0f}x", flush=True)
    big = rows[max(args.batch_sizes)]
    print(json.dumps({
        "dataset_gb": round(size / 1e9, 3),
        "batch_size": max(args.batch_sizes),
        "loader_samples_per_s": round(big["loader"]),
        "loader_prefetch_forced_samples_per_s": round(big["loader_prefetch"]),
        "loader_checked_samples_per_s": round(big["loader_checked"]),
        "raw_samples_per_s": round(big["raw"]),
        "raw_chunks_samples_per_s": round(big["raw_chunks"]),
        "naive_samples_per_s": round(big["naive"]),
        "loader_vs_raw": round(big["loader"] / big["raw"], 3),
        "loader_vs_naive": round(big["loader"] / big["naive"], 1),
        "loader_checked_vs_raw": round(big["loader_checked"] / big["raw"], 3),
        "loader_vs_raw_chunks": round(big["loader"] / big["raw_chunks"], 3),
        "goal_vs_raw": 0.7,
        "goal_vs_naive": 10,
        "by_batch": {str(b): {k: round(v) for k, v in r.items()} for b, r in rows.items()},
        "vs_raw_by_batch": {str(b): round(r["loader"] / r["raw"], 3) for b, r in rows.items()},
        "vs_raw_each_round": {str(b): v for b, v in spread.items()},
        "rounds": args.rounds,
        "quick": args.quick,
    }))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
