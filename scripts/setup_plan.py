"""What scripts/setup.sh builds on this machine: CPU or GPU (NCCL) Horovod, and its cache key.

    .venv/bin/python scripts/setup_plan.py          # prints shell assignments for setup.sh
    .venv/bin/python scripts/setup_plan.py --json   # the same plan as one JSON object

The decisions are a pure function of what it probes (:func:`plan`), so they are tested on a
CPU machine without building anything:

- **GPU or not**: ``HETHPC_GPU=1`` or ``0`` decides; otherwise a GPU is there when
  ``nvidia-smi -L`` lists one.
- **CPU**: exactly the build of before (Horovod with MPI, no GPU operations), under the same
  wheel cache key ``horovod-<v>-torch<v>-<python>-<mpi>``.
- **GPU**: torch must be a CUDA build (``torch.version.cuda``); a CPU build is replaced by
  PyPI's CUDA build of the same version. Horovod is built with
  ``HOROVOD_GPU_OPERATIONS=NCCL`` against the site's CUDA and NCCL when their modules are
  loaded (``CUDA_HOME``/``CUDA_PATH`` with ``bin/nvcc``; ``NCCL_HOME``/``NCCL_ROOT``), otherwise
  against PyPI's: the ``nvidia-nccl-cu<major>`` wheel torch already depends on, and the
  compiler of torch's CUDA release: ``nvidia-cuda-nvcc-cu12`` for CUDA 12; for CUDA 13 (whose
  packages dropped the suffix: ``nvidia-cuda-nvcc-cu13`` is an empty placeholder)
  ``nvidia-cuda-nvcc``, ``nvidia-nvvm``, ``nvidia-cuda-crt`` and ``nvidia-cuda-cccl`` pinned to
  torch's ``13.x``, all in ``nvidia/cu13``. CMake looks for ``libcudart.so``, ``lib64`` and
  ``libnccl.so``, which the wheels ship only as ``libcudart.so.13``, ``lib`` and
  ``libnccl.so.2``: the plan lists the links setup.sh makes (``links``). The cache key adds the
  CUDA and NCCL versions, so a wheel never meets another CUDA.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Probe:
    """What the machine has, as far as the build cares."""

    gpu_env: str | None  # HETHPC_GPU, if set
    gpus: int  # GPUs that nvidia-smi lists (0: none, or no nvidia-smi)
    torch_cuda: str | None  # torch.version.cuda; None for a CPU build or no torch
    cuda_home: str | None  # a site CUDA with bin/nvcc (CUDA_HOME or CUDA_PATH)
    nccl_home: str | None  # a site NCCL (NCCL_HOME or NCCL_ROOT)
    nccl_version: str | None  # the NCCL torch was built with, "2.27.3"
    pip_nccl: str | None  # the nvidia/nccl directory of PyPI's wheel, if installed


@dataclass(frozen=True)
class Plan:
    """What to build, and under which cache key."""

    gpu: bool
    reason: str
    wheel_key: str
    reinstall_torch: bool = False
    pip_packages: list[str] = field(default_factory=list)
    horovod_env: dict[str, str] = field(default_factory=dict)
    links: list[tuple[str, str]] = field(default_factory=list)  # (link, what it points to)


# PyPI's CUDA 13 compiler: nvcc, its NVVM (cicc) and C runtime headers, and CCCL's headers
# (nv/target, which cuda_fp16.h includes), each pinned to torch's CUDA release.
CUDA13_COMPILER = ("nvidia-cuda-nvcc", "nvidia-nvvm", "nvidia-cuda-crt", "nvidia-cuda-cccl")


def wants_gpu(p: Probe) -> tuple[bool, str]:
    """Whether to build for the GPU, and why."""
    if p.gpu_env is not None and p.gpu_env.strip() != "":
        on = p.gpu_env.strip().lower() in ("1", "true", "yes", "on")
        return on, f"HETHPC_GPU={p.gpu_env}"
    if p.gpus > 0:
        return True, f"nvidia-smi lists {p.gpus} GPU(s)"
    return False, "no GPU (nvidia-smi lists none; HETHPC_GPU=1 forces a GPU build)"


def plan(p: Probe, *, horovod: str, torch: str, pytag: str, mpitag: str) -> Plan:
    """The build for ``p``: see the module docstring."""
    gpu, reason = wants_gpu(p)
    key = f"horovod-{horovod}-torch{torch}-{pytag}-{mpitag}"
    if not gpu:
        return Plan(gpu=False, reason=reason, wheel_key=key)
    cuda = p.torch_cuda or "12"
    major = cuda.split(".")[0]
    packages: list[str] = []
    links: list[tuple[str, str]] = []
    env = {"HOROVOD_GPU_OPERATIONS": "NCCL", "HOROVOD_NCCL_LINK": "SHARED"}
    if p.cuda_home:
        env["HOROVOD_CUDA_HOME"] = p.cuda_home
    elif int(major) >= 13:
        release = ".".join(cuda.split(".")[:2])  # "13.0": the compiler of torch's own CUDA
        packages += [f"{name}=={release}.*" for name in CUDA13_COMPILER]
        home = f"{{site}}/nvidia/cu{major}"  # {site}: filled in by setup.sh once installed
        env["HOROVOD_CUDA_HOME"] = home
        links += [(f"{home}/lib64", "lib"), (f"{home}/lib/libcudart.so", f"libcudart.so.{major}")]
    else:
        packages.append(f"nvidia-cuda-nvcc-cu{major}")
        env["HOROVOD_CUDA_HOME"] = "{site}/nvidia/cuda_nvcc"
    # torch's extension helpers (which Horovod's CMake asks for torch's library folders) find
    # cudart under CUDA_HOME, else under the nvcc on PATH, else /usr/local/cuda.
    env["CUDA_HOME"] = env["HOROVOD_CUDA_HOME"]
    if p.nccl_home:
        env["HOROVOD_NCCL_HOME"] = p.nccl_home
    else:
        if not p.pip_nccl:
            packages.append(f"nvidia-nccl-cu{major}")
        env["HOROVOD_NCCL_HOME"] = p.pip_nccl or "{site}/nvidia/nccl"
        links.append((env["HOROVOD_NCCL_HOME"] + "/lib/libnccl.so", "libnccl.so.2"))
    nccl = p.nccl_version or "unknown"
    return Plan(
        gpu=True,
        reason=reason,
        wheel_key=f"{key}-cuda{cuda}-nccl{nccl}",
        reinstall_torch=p.torch_cuda is None,
        pip_packages=packages,
        horovod_env=env,
        links=links,
    )


def _gpus() -> int:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def _torch() -> tuple[str | None, str | None]:
    try:
        import torch
    except ImportError:
        return None, None
    nccl = None
    if torch.version.cuda is not None:
        try:
            v = torch.cuda.nccl.version()
            nccl = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
        except Exception:  # noqa: BLE001 - a CUDA build without a usable NCCL
            nccl = None
    return torch.version.cuda, nccl


def _site_home(*names: str, need: str) -> str | None:
    for name in names:
        home = os.environ.get(name)
        if home and (Path(home) / need).exists():
            return home
    return None


def _pip_nccl() -> str | None:
    for entry in sys.path:
        d = Path(entry) / "nvidia" / "nccl"
        if (d / "include" / "nccl.h").is_file():
            return str(d)
    return None


def probe() -> Probe:
    """Probe this machine."""
    cuda, nccl = _torch()
    return Probe(
        gpu_env=os.environ.get("HETHPC_GPU"),
        gpus=_gpus(),
        torch_cuda=cuda,
        cuda_home=_site_home("CUDA_HOME", "CUDA_PATH", need="bin/nvcc"),
        nccl_home=_site_home("NCCL_HOME", "NCCL_ROOT", need="include/nccl.h"),
        nccl_version=nccl,
        pip_nccl=_pip_nccl(),
    )


def shell(pl: Plan) -> str:
    """The plan as ``NAME='value'`` lines for ``eval`` in setup.sh."""

    def q(v: str) -> str:
        return "'" + v.replace("'", "'\\''") + "'"

    lines = [
        f"plan_gpu={int(pl.gpu)}",
        f"plan_reason={q(pl.reason)}",
        f"plan_wheel_key={q(pl.wheel_key)}",
        f"plan_reinstall_torch={int(pl.reinstall_torch)}",
        f"plan_pip_packages={q(' '.join(pl.pip_packages))}",
        f"plan_horovod_env={q(' '.join(f'{k}={v}' for k, v in pl.horovod_env.items()))}",
        f"plan_links={q(' '.join(f'{link}={to}' for link, to in pl.links))}",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--horovod", default="0.28.1")
    ap.add_argument("--torch", default="2.13.0")
    ap.add_argument("--mpitag", default="mpi")
    ap.add_argument("--json", action="store_true", help="print the probe and plan as JSON")
    args = ap.parse_args(argv)
    pytag = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    p = probe()
    pl = plan(p, horovod=args.horovod, torch=args.torch, pytag=pytag, mpitag=args.mpitag)
    print(json.dumps({"probe": asdict(p), "plan": asdict(pl)}) if args.json else shell(pl))
    return 0


if __name__ == "__main__":
    sys.exit(main())
