"""Horovod 0.28.1's source made to build against today's torch and CUDA, and its build with NCCL
on a GPU machine with no package registry, from a carried sdist.

    python scripts/horovod_build.py patch SRC                  # what scripts/setup.sh runs
    python scripts/horovod_build.py build SDIST PREFIX [LIMIT_S] # by hand, in the foreground

``patch`` edits an unpacked source tree (:data:`PATCHES`). The device check
(scripts/device_check.py) starts :func:`start` in the background when Horovod is missing, a
``horovod-*.tar.gz`` lies in the carried folder (``.device/``, filled by
``scripts/device_prep.sh``) and nvcc is there; it builds within a time limit and installs into
the check's own prefix (nothing of the machine's Python is touched). What it needs from the
machine: the Python with torch (a CUDA build), CMake, a C++ compiler, nvcc, NCCL's headers and
library (torch's ``nvidia-nccl`` wheel), an MPI C++ wrapper (``mpicxx``: hethpc runs Horovod on
MPI, so a Gloo-only build would be of no use), and Horovod's Python needs (cloudpickle, psutil,
pyyaml, packaging).

The release needs three edits to build against today's torch and CUDA (:func:`patch_cmake`):
C++17 instead of C++14 (torch's headers), and C++17 for the CUDA kernels (CUDA 13's headers
refuse C++11). The device check compiles the GPU's own architecture alone
(``HOROVOD_BUILD_CUDA_CC_LIST``), not every one nvcc knows, which would take several times as
long; setup.sh, whose wheel serves every GPU of a cluster, compiles them all.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

# (file inside the sdist, pattern, replacement); each must match once.
PATCHES = (
    ("CMakeLists.txt", r"set\(CMAKE_CXX_STANDARD 14\)", "set(CMAKE_CXX_STANDARD 17)"),
    (
        "horovod/torch/CMakeLists.txt",
        r"set\(CMAKE_CXX_STANDARD 14\)",
        "set(CMAKE_CXX_STANDARD 17)",
    ),  # fmt: skip
    (
        "horovod/common/ops/cuda/CMakeLists.txt",
        r"set\(CMAKE_CUDA_STANDARD 11\)",
        "set(CMAKE_CUDA_STANDARD 17)",
    ),  # fmt: skip
)


class BuildError(RuntimeError):
    """The build cannot start here (a missing tool or file); the message says which."""


def patch_cmake(name: str, text: str) -> str:
    """``text`` of the sdist's file ``name`` with its patch applied.

    Raises:
        BuildError: the file's pattern is not there (another Horovod release).
    """
    for file, pattern, new in PATCHES:
        if file == name:
            patched, n = re.subn(pattern, new, text)
            if n != 1:
                raise BuildError(f"{name}: expected one '{pattern}' to patch, found {n}")
            return patched
    return text


def patch_tree(src: Path) -> None:
    """Apply :data:`PATCHES` to the unpacked source tree ``src``.

    Raises:
        BuildError: a file to patch, or its pattern, is not there (another Horovod release).
    """
    for name, _, _ in PATCHES:
        path = src / name
        if not path.is_file():
            raise BuildError(f"{src}: no {name} to patch (another Horovod release?)")
        path.write_text(patch_cmake(name, path.read_text()))


def build_env(
    *,
    cuda_home: str | None,
    nccl_include: str | None,
    nccl_lib: str | None,
    capability: tuple[int, int] | None,
    mpicxx: str,
    jobs: int,
) -> dict[str, str]:
    """The environment Horovod's setup.py reads: frameworks, controller, GPU operations.

    Args:
        cuda_home: the CUDA toolkit (``bin/nvcc`` inside); None builds for the CPU only.
        nccl_include, nccl_lib: folders holding ``nccl.h`` and ``libnccl.so``.
        capability: the GPU's compute capability, ``(9, 0)`` for an H100; the kernels are
            compiled for it alone.
        mpicxx: the MPI C++ wrapper Horovod's MPI controller is built with.
        jobs: parallel compile jobs.
    """
    env = {"HOROVOD_WITH_PYTORCH": "1", "HOROVOD_WITHOUT_TENSORFLOW": "1",
           "HOROVOD_WITHOUT_MXNET": "1", "HOROVOD_WITH_MPI": "1", "HOROVOD_WITHOUT_GLOO": "1",
           "MPI_CXX_COMPILER": mpicxx, "MAKEFLAGS": f"-j{jobs}"}  # fmt: skip
    if cuda_home:
        # CUDA_HOME: where torch's extension helpers look for cudart (Horovod's CMake asks them)
        env |= {"HOROVOD_GPU_OPERATIONS": "NCCL", "HOROVOD_CUDA_HOME": cuda_home,
                "CUDA_HOME": cuda_home, "HOROVOD_NCCL_LINK": "SHARED"}  # fmt: skip
        if nccl_include and nccl_lib:
            env |= {"HOROVOD_NCCL_INCLUDE": nccl_include, "HOROVOD_NCCL_LIB": nccl_lib}
        if capability:
            env["HOROVOD_BUILD_CUDA_CC_LIST"] = f"{capability[0]}{capability[1]}"
    return env


def find_nccl(search: list[str], shim: Path) -> tuple[str, str] | None:
    """NCCL's include folder and a library folder with ``libnccl.so`` in it.

    torch's ``nvidia-nccl`` wheel ships ``libnccl.so.2`` alone, and CMake looks for
    ``libnccl.so``: a link to it is made in ``shim``.
    """
    for entry in search:
        home = Path(entry) / "nvidia" / "nccl"
        lib = home / "lib" / "libnccl.so.2"
        if (home / "include" / "nccl.h").is_file() and lib.is_file():
            shim.mkdir(parents=True, exist_ok=True)
            link = shim / "libnccl.so"
            if not link.exists():
                link.symlink_to(lib)
            return str(home / "include"), str(shim)
    return None


def find_cuda_home() -> str | None:
    """The CUDA toolkit of the ``nvcc`` on PATH, else ``/usr/local/cuda``."""
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    return str(Path(nvcc).resolve().parents[1]) if Path(nvcc).is_file() else None


@dataclass
class Build:
    """One background build: its process, log and where it installs."""

    proc: subprocess.Popen[bytes]
    log: Path
    prefix: Path
    started: float
    limit_s: float
    env: dict[str, str] = field(default_factory=dict)

    def stop(self) -> None:
        """End the build and every process it started (its own process group)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def wait(self, deadline: float) -> dict[str, object]:
        """Wait for the build until its own limit or ``deadline`` (monotonic); the outcome."""
        end = min(self.started + self.limit_s, deadline)
        try:
            rc = self.proc.wait(timeout=max(0.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.stop()
            rc = None
        took = round(time.monotonic() - self.started, 1)
        tail = self.log.read_text(errors="replace").strip().splitlines()[-8:]
        if rc is None:
            return {
                "built": False,
                "seconds": took,
                "why": f"not done within {self.limit_s:.0f} s (stopped)",
                "log_tail": tail,
            }
        if rc != 0:
            return {"built": False, "seconds": took, "why": f"build exited {rc}",
                    "log_tail": tail}  # fmt: skip
        return {"built": True, "seconds": took}


def start(
    sdist: Path, *, python: str, prefix: Path, work: Path, log: Path, limit_s: float,
    env: dict[str, str], nice: int = 10,
) -> Build:  # fmt: skip
    """Unpack and patch ``sdist`` under ``work``, then build and install it in the background.

    The wheel is installed with ``pip --prefix`` (no index, no dependencies), so its modules
    land in ``prefix``'s site-packages, beside the check's other carried packages.

    Raises:
        BuildError: the sdist cannot be unpacked or patched.
    """
    work.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(sdist) as tar:
            tar.extractall(work, filter="data")
    except (OSError, tarfile.TarError) as e:
        raise BuildError(f"{sdist}: cannot unpack ({e})") from e
    srcs = [p for p in work.iterdir() if p.is_dir() and p.name.startswith("horovod-")]
    if len(srcs) != 1:
        raise BuildError(f"{sdist}: expected one horovod-* folder inside, found {len(srcs)}")
    src = srcs[0]
    patch_tree(src)
    wheels = work / "wheel"
    pip = f"{python} -m pip"
    script = (
        f"set -e; {pip} wheel -v --no-deps --no-build-isolation --no-index {src} -w {wheels}; "
        f"{pip} install --no-deps --no-index --no-compile --prefix {prefix} {wheels}/horovod-*.whl"
    )
    fh = log.open("w")
    fh.write(f"# environment: {env}\n# {script}\n")
    fh.flush()
    proc = subprocess.Popen(["nice", "-n", str(nice), "bash", "-c", script], stdout=fh,
                            stderr=subprocess.STDOUT, env={**os.environ, **env},
                            start_new_session=True)  # fmt: skip
    return Build(proc=proc, log=log, prefix=prefix, started=time.monotonic(), limit_s=limit_s,
                 env=env)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv[:1] == ["patch"] and len(argv) == 2:
            patch_tree(Path(argv[1]))
            return 0
        if argv[:1] == ["build"] and len(argv) in (3, 4):
            return _build(Path(argv[1]), Path(argv[2]).resolve(),
                          float(argv[3]) if len(argv) == 4 else 600.0)  # fmt: skip
    except BuildError as e:
        print(f"horovod_build: {e}", file=sys.stderr)
        return 1
    print(__doc__.split("\n\n")[1], file=sys.stderr)
    return 2


def _build(sdist: Path, prefix: Path, limit: float) -> int:
    """Build ``sdist`` in the foreground into ``prefix`` (trying the recipe by hand)."""
    mpicxx = shutil.which("mpicxx")
    if mpicxx is None:
        print("no mpicxx on PATH: Horovod's MPI controller cannot be built", file=sys.stderr)
        return 2
    nccl = find_nccl([p for p in sys.path if p], prefix / "nccl-shim")
    env = build_env(cuda_home=find_cuda_home(), nccl_include=nccl and nccl[0],
                    nccl_lib=nccl and nccl[1], capability=None, mpicxx=mpicxx,
                    jobs=os.cpu_count() or 1)  # fmt: skip
    b = start(sdist, python=sys.executable, prefix=prefix, work=prefix / "build",
              log=prefix / "build.log", limit_s=limit, env=env)  # fmt: skip
    result = b.wait(float("inf"))
    print(result)
    return 0 if result["built"] else 1


if __name__ == "__main__":
    sys.exit(main())
