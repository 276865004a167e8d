"""The device check's steps that run in their own processes (scripts/device_check.py starts
them): what the machine has, a step time, and the ranks' allreduce and pipeline checks.

    python scripts/device_steps.py probe
    python scripts/device_steps.py steptime cpu|cuda [--small]
    scripts/mpirun.sh -np 2 python scripts/device_steps.py allreduce cpu|cuda mpi|horovod
    scripts/mpirun.sh -np 2 python scripts/device_steps.py pipeline cpu|cuda [--small]

Each prints one line ``RESULT {...}`` (on rank 0); ``right`` in it says whether the answer was
the expected one.
"""

from __future__ import annotations

import copy
import json
import platform
import shutil
import subprocess
import sys
import time
from typing import Any


def _versions() -> dict[str, str | None]:
    from importlib import metadata

    out: dict[str, str | None] = {"python": platform.python_version()}
    for dist in ("torch", "numpy", "h5py", "mpi4py", "mnist1d", "horovod", "scipy", "tqdm"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


# Tools whose answer goes into the environment step: (name, command).
TOOLS = {
    "nvidia_smi": ["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                   "--format=csv,noheader"],
    "nvcc": ["nvcc", "--version"],
    "mpirun": ["mpirun", "--version"],
    "cmake": ["cmake", "--version"],
}  # fmt: skip


def _first_line(text: str) -> str:
    lines = text.replace("\0", "").strip().splitlines()
    return lines[0].strip() if lines else ""


def _tool(cmd: list[str]) -> str:
    """The tool's answer (the last line of nvcc's), or why there is none."""
    if shutil.which(cmd[0]) is None:
        return "not on PATH"
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        return f"failed: {e}"
    text = (p.stdout or p.stderr).replace("\0", "").strip()
    if cmd[0] == "nvcc":
        return text.splitlines()[-1] if text else ""
    return " | ".join(line.strip() for line in text.splitlines()[:2] if line.strip())


def probe_environment() -> dict[str, Any]:
    """Versions, the GPUs torch sees (with a matrix product checked against the CPU), mpi4py's
    build and library, and whether that MPI is CUDA-aware."""
    import torch

    out: dict[str, Any] = {"versions": _versions(), "torch_cuda": torch.version.cuda,
                           "executable": sys.executable, "sys_path": sys.path}  # fmt: skip
    gpus = torch.cuda.device_count()
    cuda: dict[str, Any] = {"available": torch.cuda.is_available(), "gpus": gpus}
    if gpus:
        p = torch.cuda.get_device_properties(0)
        cuda |= {"names": [torch.cuda.get_device_name(i) for i in range(gpus)],
                 "capability": list(torch.cuda.get_device_capability(0)),
                 "memory_gib": round(p.total_memory / 2**30, 1),
                 "multiprocessors": p.multi_processor_count}  # fmt: skip
        g = torch.Generator().manual_seed(0)
        a, b = torch.randn(512, 512, generator=g), torch.randn(512, 512, generator=g)
        on_gpu = (a.cuda() @ b.cuda()).cpu()
        cuda["matmul_matches_cpu"] = bool(torch.allclose(on_gpu, a @ b, rtol=1e-3, atol=1e-3))
        try:
            v = torch.cuda.nccl.version()
            cuda["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        except Exception as e:  # noqa: BLE001 - reported, not raised
            cuda["nccl"] = f"none ({e})"
    out["cuda"] = cuda
    out["tools"] = {name: _tool(cmd) for name, cmd in TOOLS.items()}
    try:
        import mpi4py
        from mpi4py import MPI

        from hethpc.comm import cuda_aware

        aware = cuda_aware.probe(MPI)
        out["mpi"] = {"mpi4py": mpi4py.__file__,
                      "mpi4py_config": {k: str(v) for k, v in mpi4py.get_config().items()},
                      "vendor": str(MPI.get_vendor()),
                      "library": _first_line(MPI.Get_library_version()),
                      "thread_multiple": MPI.Query_thread() == MPI.THREAD_MULTIPLE,
                      "cuda_aware": aware.aware, "cuda_aware_source": aware.source}  # fmt: skip
    except Exception as e:  # noqa: BLE001 - reported, not raised
        out["mpi"] = {"error": f"{type(e).__name__}: {e}"}
    return out


def step_time(device: str, small: bool) -> dict[str, Any]:
    """Median time of one training step of the demo's model (``cnn1d_wide``, batch 128,
    MNIST-1D's 40 inputs) on this device, one process, after warm-up steps."""
    import torch
    from torch import nn

    from hethpc.models import build_model

    dev = torch.device(device)
    torch.manual_seed(0)
    model = build_model("cnn1d_wide", (40,), 10).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(128, 40, device=dev), torch.randint(0, 10, (128,), device=dev)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    warm, timed = (2, 5) if small else (10, 40)
    times = []
    for i in range(warm + timed):
        sync()
        t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        sync()
        if i >= warm:
            times.append(time.perf_counter() - t)
    times.sort()
    return {"device": str(dev), "steps": timed, "median_ms": round(1e3 * times[timed // 2], 3),
            "torch_threads": torch.get_num_threads()}  # fmt: skip


def _rank_device(setting: str, transport: str) -> Any:
    from hethpc import comm
    from hethpc.train import this_device

    comm.init(transport=transport)
    return this_device(setting, comm.local_rank())


def rank_allreduce(setting: str, transport: str) -> dict[str, Any]:
    """Each rank contributes ``rank + 1``: the sum is ``n (n + 1) / 2`` on every rank."""
    import torch

    from hethpc import comm

    dev = _rank_device(setting, transport)
    n = comm.size()
    t = torch.full((1024,), float(comm.rank() + 1), device=dev)
    via = f"hethpc.comm.allreduce ({transport})"
    if n > 1:
        out = comm.allreduce(t, comm.ReduceOp.SUM)
    elif transport == "horovod":
        # hethpc makes no collective call on one rank; ask Horovod itself, so its build runs an
        # allreduce (NCCL on a GPU) even on a machine with one GPU.
        import horovod.torch as hvd

        out, via = hvd.allreduce(t, op=hvd.Sum, name="device_check"), "horovod (1 rank)"
    else:
        out, via = t.clone(), "none (1 rank)"
    want = n * (n + 1) / 2
    right = bool(torch.all(out == want))
    res = {"ranks": n, "device": str(dev), "via": via, "sum": float(out[0]), "expected": want,
           "right": right, "transfers": comm.transfers().as_dict()}  # fmt: skip
    if transport == "horovod":
        import horovod.torch as hvd

        res |= {"nccl_built": bool(hvd.nccl_built()), "mpi_built": bool(hvd.mpi_built())}
    return res


def rank_pipeline(setting: str, small: bool) -> dict[str, Any]:
    """A 2-stage pipeline's loss and first-layer gradient against the whole model on rank 0."""
    import torch
    from torch import nn

    from hethpc import comm
    from hethpc.pipeline import Pipeline

    dev = _rank_device(setting, "mpi")
    width, rows = (32, 64) if small else (512, 1024)
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(4):
        layers += [nn.Linear(width, width), nn.Tanh()]
    model = nn.Sequential(*layers)
    ref = copy.deepcopy(model).to(dev)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(rows, width, generator=g), torch.randn(rows, width, generator=g)
    loss_fn = nn.functional.mse_loss
    pipe = Pipeline(model, balance=[4, 4], micro_batches=4, stage_group=comm.world(), device=dev)
    loss = pipe.train_step(x, y, loss_fn)
    # Every stage's first parameter's gradient, gathered on rank 0 beside the reference's.
    grads = comm.allgather_object(next(pipe.module.parameters()).grad.cpu())
    out: dict[str, Any] = {"ranks": comm.size(), "device": str(dev),
                           "transfers": comm.transfers().as_dict()}  # fmt: skip
    losses = comm.allgather_object(loss)
    if comm.rank() == 0:
        ref_loss = loss_fn(ref(x.to(dev)), y.to(dev))
        ref_loss.backward()
        want = [ref[0].weight.grad.cpu(), ref[4].weight.grad.cpu()]
        pipe_loss = losses[-1]
        out["pipeline_loss"] = float(pipe_loss)
        out["one_process_loss"] = float(ref_loss)
        out["same_loss"] = abs(float(pipe_loss) - float(ref_loss)) <= 1e-5 * max(
            1.0, abs(float(ref_loss))
        )
        out["same_gradients"] = all(
            torch.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in zip(grads, want, strict=True)
        )
        out["right"] = out["same_loss"] and out["same_gradients"]
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in ("probe", "steptime", "allreduce", "pipeline"):
        print(__doc__, file=sys.stderr)
        return 2
    if argv[0] == "probe":
        print("RESULT " + json.dumps(probe_environment()), flush=True)
        return 0
    if argv[0] == "steptime":
        print("RESULT " + json.dumps(step_time(argv[1], "--small" in argv)), flush=True)
        return 0
    step, setting, rest = argv[0], argv[1], argv[2:]
    if step == "allreduce":
        result = rank_allreduce(setting, rest[0])
    else:
        result = rank_pipeline(setting, "--small" in rest)
    from hethpc import comm

    if comm.rank() == 0:
        print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
