"""Loader throughput on a >= 1 GB synthetic HDF5 dataset, beside its peers and page-cache limits.

    flock /tmp/hethpc-bench.lock .venv/bin/python benchmarks/bench_loader.py [--quick]

Measures samples/s for a few batch sizes, side by side in one run:
  loader: hethpc.data.Loader as configured by default on a dataset opened by default
          (``open_dataset(path)``: sha256 of every shard checked once, then each batch
          gathered from the mapped shard files without HDF5's per-chunk Fletcher32 test; IID
          mode, chunk-aware shuffle, prefetch="auto": this loop does nothing between batches,
          so it reads in line); beside it, the same loader with the prefetch thread forced on
          (``loader_prefetch``) and on a dataset opened with ``verify=False``, whose reads go
          through HDF5 and its Fletcher32 test on every chunk (``loader_checked``);
  raw:    contiguous slices ``x[a:a+B]`` of each shard in file order through h5py (the
          practical limit, Fletcher32 tested by HDF5), and beside it contiguous raw chunk bytes
          (``read_direct_chunk``) copied into each batch: the limit of the loader's raw path
          (``raw_chunks``);
  memmap: the page-cache limits: ``numpy.memmap`` of the same float32 sample bytes, written
          once as a flat file beside the shards (``x.f32``, rows page-aligned), gathered per
          batch with ``np.take`` in the loader's own epoch order (``memmap_shuffled``: the
          limit for the loader's reads) and copied in file order (``memmap_contiguous``);
  torch:  a torch ``DataLoader`` over an h5py Dataset that reads a whole batch per
          ``__getitem__`` (sorted indices, one h5py fancy read per shard), fed batches of the
          loader's order by a ``BatchSampler``, with 0 and 2 worker processes (``torch_h5py_0w``,
          ``torch_h5py_2w``; timed from the first batch, so without the workers' start);
  naive:  a torch Dataset reading one sample per ``__getitem__`` from h5py, through a shuffling
          DataLoader (what users write first).
All read the same files after one warm-up pass (the page cache then holds them; by default each
file is first dropped from it and read back, so all enter it the same way: --cache), the same
float32 samples stored with the Fletcher32 filter, single-threaded (the forced prefetch thread
and the torch workers aside); batches become torch tensors, labels included. The machine is
shared, so every method but naive is measured in --rounds alternating rounds and each
method's best round is reported (like ``timeit``), with every round's loader/memmap_shuffled
and loader/raw ratios beside it to show the spread.
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

from hethpc.data import DatasetError, Loader, ShardedDataset, open_dataset, write_dataset
from hethpc.data.shards.order import block_shuffle
from hethpc.data.shards.verify import sha256_file
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
    p.add_argument("--torch-seconds", type=float, default=3.0,
                   help="time per torch DataLoader measurement (each round, each worker count)")
    p.add_argument("--cache", choices=("reread", "as-written"), default="reread",
                   help="reread: drop every file from the page cache and read it back in "
                        "before measuring (the same state for all); as-written: keep what "
                        "writing them left")
    p.add_argument("--quick", action="store_true", help="about a minute: fewer bytes per point")
    return p.parse_args(argv)


def ensure_dataset(path: Path, num_samples: int, floats: int) -> ShardedDataset:
    """Open the benchmark dataset, writing it first if absent or of another size."""
    # "layout": shards from the writer that page-aligns chunks (older ones are rewritten).
    want = {"bench": "loader", "samples": num_samples, "floats": floats, "layout": 2}
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


FLAT_NAME = "x.f32"  # beside the shards; open_dataset ignores files that are not shards


def ensure_flat(ds: ShardedDataset) -> Path:
    """The samples as one flat float32 file (rows at multiples of their size), written once."""
    path = ds.root / FLAT_NAME
    nbytes = len(ds) * int(np.prod(ds.sample_shape)) * ds.dtype.itemsize
    if path.is_file() and path.stat().st_size == nbytes:
        return path
    print(f"writing the flat copy {path} ...", flush=True)
    step = 16 * ds.chunk_samples
    with open(path.with_suffix(".tmp"), "wb") as f:
        for a in range(0, len(ds), step):
            f.write(ds.read_window(np.arange(a, min(a + step, len(ds))))[0].tobytes())
    os.replace(path.with_suffix(".tmp"), path)
    return path


def shard_files(ds: ShardedDataset) -> list[Path]:
    """The dataset's shard files."""
    return [ds.root / s.file for s in ds.manifest.shards]


def warm(paths: list[Path], reread: bool) -> None:
    """Read every file once, so each method reads from the same (cached) state.

    With ``reread``, each file is first written back and dropped from the page cache
    (``posix_fadvise(DONTNEED)``), then read back in as ``open_dataset``'s sha256 check reads
    shards (``sha256_file``: through a memory map advised ``MADV_HUGEPAGE``): every file, the
    flat copy included, enters the cache the same way, as at the start of a job. Without it,
    files written just now stay as their writes left them: the kernel's page-cache folios then
    follow each writer's pattern (HDF5's chunk by chunk, the flat copy's one pass), and so do
    the page faults of a gather (``benchmarks/NOTES.md``)."""
    for p in paths:
        if reread:
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
            sha256_file(p)
        else:
            with open(p, "rb") as f:
                while f.read(1 << 24):
                    pass


def epoch_order(ds: ShardedDataset) -> np.ndarray:
    """The loader's epoch-0 stream order (IID, one rank, seed 0, its default window)."""
    return block_shuffle(np.arange(len(ds)), chunk=ds.chunk_samples, window=16, seed=0, epoch=0)


def bench_memmap(
    ds: ShardedDataset, flat: Path, order: np.ndarray | None, b: int, budget: int
) -> float:
    """Samples/s of batches gathered from a fresh ``numpy.memmap`` of the flat file:
    ``np.take`` of ``order``'s batches, or copies of file-order slices (``order`` None)."""
    x = np.memmap(flat, dtype=ds.dtype, mode="r", shape=(len(ds), *ds.sample_shape))
    labels = ds.labels
    done, t0 = 0, time.perf_counter()
    for a in range(0, budget, b):
        if order is None:
            xb, yb = np.array(x[a : a + b]), labels[a : a + b]
        else:
            idx = order[a : a + b]
            xb, yb = np.take(x, idx, axis=0), labels[idx]
        xt, yt = torch.from_numpy(np.asarray(xb)), torch.from_numpy(yb)
        done += len(xt) + 0 * len(yt)
    dt = time.perf_counter() - t0
    del x
    return done / dt


class BatchH5(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """One whole batch per __getitem__ from h5py: indices sorted, one fancy read per shard."""

    def __init__(self, ds: ShardedDataset) -> None:
        self.files = [str(ds.root / s.file) for s in ds.manifest.shards]
        self.starts = np.cumsum([0] + [s.num_samples for s in ds.manifest.shards])
        self.handles: list[h5py.File] | None = None

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, batch: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        if self.handles is None:  # opened in the process that reads (each worker)
            self.handles = [h5py.File(f, "r") for f in self.files]
        idx = np.sort(np.asarray(batch, dtype=np.int64))
        shard = np.searchsorted(self.starts, idx, side="right") - 1
        xs, ys = [], []
        for s in np.unique(shard).tolist():
            local = idx[shard == s] - int(self.starts[s])
            xs.append(self.handles[s]["x"][local])
            ys.append(self.handles[s]["y"][local])
        return torch.from_numpy(np.concatenate(xs)), torch.from_numpy(np.concatenate(ys))


def bench_torch_h5py(
    ds: ShardedDataset, order: np.ndarray, b: int, workers: int, seconds: float
) -> float:
    """Samples/s of a torch DataLoader over :class:`BatchH5`, batches of ``order``, timed from
    the first batch (worker start excluded)."""
    sampler = torch.utils.data.BatchSampler(order.tolist(), b, drop_last=False)
    dl = torch.utils.data.DataLoader(BatchH5(ds), sampler=sampler, batch_size=None,
                                     num_workers=workers)
    it = iter(dl)
    next(it)
    done, t0 = 0, time.perf_counter()
    for x, _ in it:
        done += len(x)
        if time.perf_counter() - t0 > seconds:
            break
    rate = done / (time.perf_counter() - t0)
    del it
    return rate


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
        args.torch_seconds = min(args.torch_seconds, 1.5)
        args.rounds = min(args.rounds, 2)
    sample_bytes = 4 * args.sample_floats
    n = int(np.ceil(args.gigabytes * 1e9 / sample_bytes))
    checked = ensure_dataset(Path(args.path), n, args.sample_floats)
    t0 = time.perf_counter()
    ds = open_dataset(args.path)  # as users open it: sha256-verified, raw chunk reads
    print(f"open_dataset with its sha256 check: {time.perf_counter() - t0:.2f} s", flush=True)
    size = sum(s.num_bytes for s in ds.manifest.shards)
    flat = ensure_flat(ds)
    print(f"dataset: {len(ds)} samples, {size / 1e9:.2f} GB, chunk {ds.chunk_samples} samples, "
          f"{len(ds.manifest.shards)} shards; warming the page cache ({args.cache})",
          flush=True)
    warm([*shard_files(ds), flat], args.cache == "reread")
    budget = int(args.read_mb * 1e6 / sample_bytes)
    t0 = time.perf_counter()
    order = epoch_order(ds)
    print(f"epoch order (once per epoch): {time.perf_counter() - t0:.3f} s", flush=True)
    rows, spread, spread_raw = {}, {}, {}
    methods: dict[str, Callable[[int], float]] = {
        "raw": lambda b: bench_raw(ds, b, budget),
        "loader": lambda b: bench_loader(ds, b, budget, prefetch="auto"),
        "memmap_shuffled": lambda b: bench_memmap(ds, flat, order, b, budget),
        "memmap_contiguous": lambda b: bench_memmap(ds, flat, None, b, budget),
        "loader_prefetch": lambda b: bench_loader(ds, b, budget, prefetch=True),
        "loader_checked": lambda b: bench_loader(checked, b, budget, prefetch="auto"),
        "raw_chunks": lambda b: bench_raw_chunks(ds, b, budget),
        "torch_h5py_0w": lambda b: bench_torch_h5py(ds, order, b, 0, args.torch_seconds),
        "torch_h5py_2w": lambda b: bench_torch_h5py(ds, order, b, 2, args.torch_seconds),
    }
    for b in args.batch_sizes:
        runs: dict[str, list[float]] = {k: [] for k in methods}
        for _ in range(max(1, args.rounds)):
            for k, f in methods.items():
                runs[k].append(f(b))
            print(f"  batch {b:>5} round: " + "  ".join(
                f"{k} {v[-1]:>9.0f}/s" for k, v in runs.items()), flush=True)
        rows[b] = {k: max(v) for k, v in runs.items()}
        rows[b]["naive"] = naive = bench_naive(ds, b, args.naive_seconds)
        r = rows[b]
        load, raw, lim = r["loader"], r["raw"], r["memmap_shuffled"]
        spread[b] = [round(f / m, 3) for f, m in
                     zip(runs["loader"], runs["memmap_shuffled"], strict=True)]
        spread_raw[b] = [round(f / m, 3) for f, m in zip(runs["loader"], runs["raw"], strict=True)]
        print(f"batch {b:>5}: " + "  ".join(f"{k} {v:>9.0f}/s" for k, v in r.items())
              + f"  loader/memmap_shuffled {load / lim:.2f} (rounds {spread[b]})  "
              f"loader/memmap_contiguous {load / r['memmap_contiguous']:.2f}  loader/raw "
              f"{load / raw:.2f}  loader/torch_h5py_2w {load / r['torch_h5py_2w']:.0f}x  "
              f"loader_checked/raw {r['loader_checked'] / raw:.2f}  loader/naive "
              f"{load / naive:.0f}x", flush=True)
    big = rows[max(args.batch_sizes)]
    print(json.dumps({
        "dataset_gb": round(size / 1e9, 3),
        "batch_size": max(args.batch_sizes),
        "loader_samples_per_s": round(big["loader"]),
        "memmap_shuffled_samples_per_s": round(big["memmap_shuffled"]),
        "memmap_contiguous_samples_per_s": round(big["memmap_contiguous"]),
        "torch_h5py_0w_samples_per_s": round(big["torch_h5py_0w"]),
        "torch_h5py_2w_samples_per_s": round(big["torch_h5py_2w"]),
        "loader_vs_memmap_shuffled": round(big["loader"] / big["memmap_shuffled"], 3),
        "loader_vs_memmap_contiguous": round(big["loader"] / big["memmap_contiguous"], 3),
        "loader_vs_torch_h5py_0w": round(big["loader"] / big["torch_h5py_0w"], 1),
        "loader_vs_torch_h5py_2w": round(big["loader"] / big["torch_h5py_2w"], 1),
        "goal_vs_memmap_shuffled": 0.9,
        "page_cache": args.cache,
        "vs_memmap_shuffled_by_batch": {
            str(b): round(r["loader"] / r["memmap_shuffled"], 3) for b, r in rows.items()},
        "vs_memmap_shuffled_each_round": {str(b): v for b, v in spread.items()},
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
        "vs_raw_each_round": {str(b): v for b, v in spread_raw.items()},
        "rounds": args.rounds,
        "quick": args.quick,
    }))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
