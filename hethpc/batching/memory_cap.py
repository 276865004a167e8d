"""Each rank's memory cap: the most samples it computes in one forward and backward pass (given,
or measured at start), and the micro-batches in which a larger share of the global batch goes.

Dynamic batching gives a fast rank a large share of the global batch; on devices of different
memory that share can exceed what the fast device holds. With ``max_rank_batch`` a rank whose
share exceeds its cap computes it in ``ceil(share / cap)`` micro-batches, their gradients summed
by size into that of the whole share (as ``accumulate`` does): the same step, in the memory of
one cap's pass, and the shares still follow speed.

``auto`` measures the cap on each rank at start: the bytes autograd saves for the backward pass
(every tensor a forward pass keeps, counted once per storage, through
``torch.autograd.graph.saved_tensors_hooks``) at two batch sizes give the bytes per sample and
the fixed part; the memory left (a GPU's free memory, or on a CPU the cgroup's limit or
``memory_limit_gb`` less what the process holds) times :data:`AUTO_SHARE`, over the bytes per
sample, is the cap. Pure functions here, but for :func:`saved_bytes` and :func:`memory_left`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

AUTO_SHARE = 0.5  # of the memory left: gradients, optimizer state and transients take the rest
CGROUP_ROOT = Path("/sys/fs/cgroup")
_NO_LIMIT = 1 << 60  # cgroup v1 writes about 2^63 for "no limit"


def parse_max_rank_batch(text: str) -> str | tuple[int, ...] | None:
    """The ``max_rank_batch`` setting: None for ``none``, ``"auto"``, or the caps (one number
    for every rank, or one per rank).

    Raises:
        ValueError: anything else, naming the syntax.
    """
    t = text.strip().lower()
    if t in ("none", ""):
        return None
    if t == "auto":
        return "auto"
    try:
        caps = tuple(int(v) for v in t.split(","))
    except ValueError:
        caps = ()
    if not caps or min(caps) < 1:
        raise ValueError(
            f"max_rank_batch {text!r} is not none, auto, a number of samples >= 1 or one per "
            "rank (e.g. 256 or 512,128)"
        )
    return caps


def caps_for(spec: tuple[int, ...], ranks: int) -> list[int]:
    """One cap per rank from the parsed setting.

    Raises:
        ValueError: a list whose length is not the number of ranks.
    """
    if len(spec) == 1:
        return [spec[0]] * ranks
    if len(spec) != ranks:
        raise ValueError(
            f"max_rank_batch gives {len(spec)} caps for {ranks} rank{'s' if ranks != 1 else ''}; "
            "give one per rank, or one for all (--max-rank-batch)"
        )
    return list(spec)


def pieces(rows: int, cap: int | None, accumulate: int = 1) -> int:
    """Micro-batches for a share of ``rows`` samples: enough that none exceeds ``cap`` (None:
    no cap), and at least ``accumulate``."""
    need = 1 if cap is None or rows <= cap else math.ceil(rows / cap)
    return max(need, accumulate)


def cap_from(
    small: tuple[int, int], large: tuple[int, int], left: int, share: float = AUTO_SHARE
) -> int | None:
    """The cap that keeps a pass's saved bytes within ``share`` of ``left`` bytes, from the
    saved bytes at two batch sizes ``(rows, bytes)``; None where the bytes do not grow with the
    rows (nothing to cap).

    Raises:
        ValueError: not even one sample fits.
    """
    (b1, m1), (b2, m2) = small, large
    per = (m2 - m1) / (b2 - b1)
    if per <= 0:
        return None
    fixed = max(0.0, m1 - per * b1)
    cap = math.floor((share * left - fixed) / per)
    if cap < 1:
        raise ValueError(
            f"max_rank_batch auto: one sample's pass keeps {per / 2**20:.1f} MiB (and "
            f"{fixed / 2**20:.1f} MiB more whatever the batch), but only {left / 2**20:.0f} MiB "
            f"are left ({share:.0%} of it for the pass): give a smaller model, more memory, or "
            "memory_limit_gb"
        )
    return cap


def saved_bytes(run_pass: Callable[[int], None], rows: int) -> int:
    """The bytes autograd keeps for the backward pass of ``run_pass(rows)`` (a forward and
    backward of ``rows`` samples), each storage counted once."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run_pass(rows)
    return sum(seen.values())


def memory_left(device: torch.device, limit_gb: float = 0.0) -> int | None:
    """Bytes this rank may still allocate: a GPU's free memory; on a CPU ``limit_gb`` (or the
    cgroup's limit) less this process's resident memory; None when no limit is known."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    limit = int(limit_gb * 2**30) if limit_gb > 0 else cgroup_limit()
    if limit is None:
        return None
    return max(0, limit - _resident_bytes())


def cgroup_limit(own: str | None = None, root: Path = CGROUP_ROOT) -> int | None:
    """The memory limit of this process's cgroup: the least ``memory.max`` (v2) or
    ``memory.limit_in_bytes`` (v1) from its own cgroup up to the root, as
    ``/proc/self/cgroup`` (or ``own``, its text) places it; a batch system's job cgroup
    (SLURM's ``.../job_N/step_M``) limits from there. None: no limit anywhere on the way."""
    if own is None:
        try:
            own = Path("/proc/self/cgroup").read_text()
        except OSError:
            return None
    found = []
    for line in own.splitlines():
        _id, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if controllers == "" and (root / "cgroup.controllers").exists():
            found += _limits_up(root, path, "memory.max")  # v2: one unified hierarchy
        elif "memory" in controllers.split(","):
            found += _limits_up(root / "memory", path, "memory.limit_in_bytes")  # v1
    return min(found) if found else None


def _limits_up(mount: Path, path: str, name: str) -> list[int]:
    """The limits in file ``name`` of cgroup ``path`` under ``mount`` and of its ancestors."""
    parts = [p for p in path.strip().split("/") if p]
    out = []
    for depth in range(len(parts), -1, -1):
        try:
            text = (mount.joinpath(*parts[:depth]) / name).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < _NO_LIMIT:
            out.append(int(text))
    return out


def _resident_bytes() -> int:
    try:
        with open(f"/proc/{os.getpid()}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def describe_caps(caps: Sequence[int | None]) -> str:
    """``"256 / 64"``, with ``-`` for a rank without a cap."""
    return " / ".join("-" if c is None else str(c) for c in caps)


def measure_cap(
    model: torch.nn.Module,
    batch: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
    device: torch.device,
    *,
    rows: int,
    limit_gb: float = 0.0,
    sharing: int = 1,
) -> int | None:
    """This rank's ``auto`` cap: the saved bytes of forward passes of ``rows // 2`` and
    ``rows`` samples from ``batch(n)`` (at least 1 and 2), against :func:`memory_left`, of
    which a GPU shared by ``sharing`` ranks gives each its part. The model's buffers
    (BatchNorm's statistics) and the random streams are as they were after.

    Returns:
        The cap, or None where the saved bytes do not grow with the rows.

    Raises:
        ValueError: no memory limit is known (a CPU without a cgroup limit and without
            ``limit_gb``), or not one sample fits.
    """
    left = memory_left(device, limit_gb)
    if left is not None and device.type == "cuda":
        left //= max(1, sharing)  # each rank on the GPU measured the same free memory
    if left is None:
        raise ValueError(
            "max_rank_batch auto needs to know how much memory this rank may use: on a CPU, "
            "a cgroup memory limit (none is set here) or memory_limit_gb (--memory-limit-gb); "
            "or give the caps as numbers (max_rank_batch 256, or one per rank)"
        )
    buffers = {k: v.detach().clone() for k, v in model.state_dict().items()}
    cpu_rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state(device) if device.type == "cuda" else None

    def run_pass(n: int) -> None:
        x, _ = batch(n)
        model(x.to(device)).float().sum()  # the forward pass keeps what backward needs

    try:
        large = max(2, rows)
        small = max(1, large // 2)
        measured = [(n, saved_bytes(run_pass, n)) for n in (small, large)]
    finally:
        model.load_state_dict(buffers)
        torch.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state(cuda_rng, device)
    return cap_from(measured[0], measured[1], left)
