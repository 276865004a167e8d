"""scripts/setup_plan.py: what the setup builds on CPU and GPU machines, decided unbuilt."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import setup_plan  # noqa: E402
from setup_plan import Probe, plan  # noqa: E402

CPU = Probe(gpu_env=None, gpus=0, torch_cuda=None, cuda_home=None, nccl_home=None,
            nccl_version=None, pip_nccl=None)  # fmt: skip
KW = {"horovod": "0.28.1", "torch": "2.13.0", "pytag": "cp311", "mpitag": "4.1.4"}


def test_a_cpu_machine_builds_as_before_under_the_same_cache_key() -> None:
    pl = plan(CPU, **KW)
    assert not pl.gpu and not pl.reinstall_torch and pl.pip_packages == []
    assert pl.horovod_env == {}
    assert pl.wheel_key == "horovod-0.28.1-torch2.13.0-cp311-4.1.4"  # the key of every setup so far
    assert "nvidia-smi lists none" in pl.reason


def test_a_gpu_node_with_pypi_packages() -> None:
    node = Probe(gpu_env=None, gpus=4, torch_cuda="12.8", cuda_home=None, nccl_home=None,
                 nccl_version="2.27.3", pip_nccl="/v/site/nvidia/nccl")  # fmt: skip
    pl = plan(node, **KW)
    assert pl.gpu and "4 GPU(s)" in pl.reason and not pl.reinstall_torch
    assert pl.horovod_env["HOROVOD_GPU_OPERATIONS"] == "NCCL"
    assert pl.horovod_env["HOROVOD_NCCL_HOME"] == "/v/site/nvidia/nccl"  # torch's own NCCL wheel
    assert pl.pip_packages == ["nvidia-cuda-nvcc-cu12"]  # the compiler; NCCL is already there
    assert pl.wheel_key == "horovod-0.28.1-torch2.13.0-cp311-4.1.4-cuda12.8-nccl2.27.3"


def test_a_cuda13_node_gets_the_suffixless_compiler_packages_and_links() -> None:
    """CUDA 13's wheels dropped the -cu13 suffix (nvidia-cuda-nvcc-cu13 is an empty
    placeholder) and live in nvidia/cu13; CMake needs lib64, libcudart.so and libnccl.so."""
    node = Probe(gpu_env=None, gpus=1, torch_cuda="13.0", cuda_home=None, nccl_home=None,
                 nccl_version="2.29.7", pip_nccl="/v/site/nvidia/nccl")  # fmt: skip
    pl = plan(node, **KW)
    assert pl.pip_packages == ["nvidia-cuda-nvcc==13.0.*", "nvidia-nvvm==13.0.*",
                               "nvidia-cuda-crt==13.0.*", "nvidia-cuda-cccl==13.0.*"]  # fmt: skip
    assert pl.horovod_env["HOROVOD_CUDA_HOME"] == "{site}/nvidia/cu13"
    assert pl.links == [("{site}/nvidia/cu13/lib64", "lib"),
                        ("{site}/nvidia/cu13/lib/libcudart.so", "libcudart.so.13"),
                        ("/v/site/nvidia/nccl/lib/libnccl.so", "libnccl.so.2")]  # fmt: skip
    assert pl.wheel_key.endswith("-cuda13.0-nccl2.29.7")
    lines = setup_plan.shell(pl)
    assert "plan_links='{site}/nvidia/cu13/lib64=lib " in lines


def test_site_modules_win_and_a_cpu_torch_is_replaced() -> None:
    node = Probe(gpu_env="1", gpus=0, torch_cuda=None, cuda_home="/opt/cuda-12.4",
                 nccl_home="/opt/nccl", nccl_version=None, pip_nccl=None)  # fmt: skip
    pl = plan(node, **KW)
    assert pl.gpu and pl.reason == "HETHPC_GPU=1" and pl.reinstall_torch
    assert pl.pip_packages == []
    assert pl.horovod_env["HOROVOD_CUDA_HOME"] == "/opt/cuda-12.4"
    assert pl.horovod_env["HOROVOD_NCCL_HOME"] == "/opt/nccl"
    assert pl.links == []  # a site's CUDA and NCCL are used as they are


@pytest.mark.parametrize(("value", "gpu"), [("0", False), ("off", False), ("1", True),
                                            ("yes", True), ("", True)])  # fmt: skip
def test_hethpc_gpu_decides(value: str, gpu: bool) -> None:
    node = Probe(gpu_env=value, gpus=2, torch_cuda="12.8", cuda_home=None, nccl_home=None,
                 nccl_version="2.27.3", pip_nccl=None)  # fmt: skip
    assert plan(node, **KW).gpu is gpu  # "" (unset in effect): the 2 GPUs decide


def test_this_machine_and_the_shell_lines(tmp_path: Path) -> None:
    """Run as setup.sh runs it; a fake nvidia-smi on PATH makes it a GPU node."""
    env = {k: v for k, v in os.environ.items() if k != "HETHPC_GPU"}
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "setup_plan.py"), "--json"],
                         capture_output=True, text=True, env=env, check=True).stdout  # fmt: skip
    here = json.loads(out)
    if here["probe"]["gpus"] == 0:  # this CPU machine: the plan of before
        assert here["plan"]["gpu"] is False
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: GPU-x)'\n")
    smi.chmod(0o755)
    env["PATH"] = f"{tmp_path}:{env['PATH']}"
    lines = subprocess.run([sys.executable, str(ROOT / "scripts" / "setup_plan.py")],
                           capture_output=True, text=True, env=env, check=True).stdout  # fmt: skip
    assert "plan_gpu=1" in lines and "HOROVOD_GPU_OPERATIONS=NCCL" in lines
    assert "plan_wheel_key='horovod-0.28.1-torch2.13.0-" in lines and "-cuda" in lines
    shown = subprocess.run(["bash", "-c", "eval \"$1\"; echo $plan_gpu $plan_reason", "-", lines],
                           capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert shown.strip() == "1 nvidia-smi lists 1 GPU(s)"
    assert setup_plan.shell(plan(CPU, **KW)).startswith("plan_gpu=0\n")


def test_the_fast_path_reinstalls_a_hethpc_that_no_longer_imports(tmp_path: Path) -> None:
    """setup.sh's stamp alone does not end it: .venv must still import the tree's hethpc."""
    tree = tmp_path / "tree"
    (tree / "scripts").mkdir(parents=True)
    for name in ("scripts/setup.sh", "scripts/setup_plan.py", "setup.cfg"):
        (tree / name).write_bytes((ROOT / name).read_bytes())
    (tree / "hethpc").mkdir()
    (tree / "hethpc" / "__init__.py").write_text("")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tree / ".venv")],
                   check=True)  # fmt: skip
    site = subprocess.run([str(tree / ".venv" / "bin" / "python"), "-c",
                           "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    installed = Path(site) / "hethpc-tree.pth"  # as an editable install points at the tree
    installed.write_text(f"{tree}\n")
    stamp = tree / ".venv" / ".hethpc-setup-ok"
    stamp.touch()
    later = (tree / "setup.cfg").stat().st_mtime + 10
    os.utime(stamp, (later, later))
    bin_dir = tmp_path / "bin"  # an MPI on PATH, so that no step installs one
    bin_dir.mkdir()
    for tool in ("mpirun", "mpicc"):
        (bin_dir / tool).write_text("#!/bin/sh\necho 'mpirun (Open MPI) 4.1.4'\n")
        (bin_dir / tool).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}

    def setup() -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", str(tree / "scripts" / "setup.sh")], capture_output=True,
                              text=True, env=env, cwd=tree, timeout=60)  # fmt: skip

    done = setup()
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    installed.unlink()  # pip uninstall hethpc
    broken = setup()
    assert broken.stdout.startswith(
        f"[setup] {tree}/.venv/bin/python cannot import hethpc from {tree} (uninstalled or "
        "broken); reinstalling\n"
    ), broken.stdout
    assert broken.returncode != 0  # this venv has no pip: the reinstall stops there
    assert not stamp.exists()
