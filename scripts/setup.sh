#!/usr/bin/env bash
# One-command, idempotent setup: Open MPI, the .venv, and a cached Horovod wheel.
#
# Environment (all optional):
#   HETHPC_CACHE   where built wheels are kept (default: ~/.cache/hethpc)
#   PYTHON         the interpreter that creates .venv (default: python3)
#   HETHPC_GPU     1: build Horovod for the GPU (NCCL) even without nvidia-smi; 0: never
#   CUDA_HOME, NCCL_HOME  a site's CUDA and NCCL (module load); else PyPI's are used
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
venv="$root/.venv"
py="$venv/bin/python"
cache="${HETHPC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hethpc}"
horovod_version=0.28.1
torch_version=2.13.0
stamp="$venv/.hethpc-setup-ok"

say() { printf '[setup] %s\n' "$*"; }
die() { printf '[setup] ERROR: %s\n' "$*" >&2; exit 1; }
# A failed Horovod build: the first errors (CMake's or the compiler's, far above pip's traceback)
# and the end of the log, which is kept.
build_failed() {
  local kept=$cache/horovod-build.log
  mkdir -p "$cache" && cp "$1" "$kept"
  grep -n -m 3 -A 12 -E 'CMake Error|: error:|fatal error' "$1" >&2 || tail -n 40 "$1" >&2
  die "Horovod build failed (its first errors above; the whole log: $kept)"
}

# Whether .venv imports this tree's hethpc (-I: not from the current directory, which would
# hide an uninstalled package).
hethpc_imports() {
  "$py" -I -c 'import pathlib, sys, hethpc
sys.exit(pathlib.Path(hethpc.__file__).resolve().parents[1] != pathlib.Path(sys.argv[1]).resolve())' \
    "$root" 2>/dev/null
}

# Fast path: nothing changed since the last successful setup, and hethpc still imports.
if [[ -f "$stamp" && "$stamp" -nt setup.cfg && "$stamp" -nt scripts/setup.sh \
      && "$stamp" -nt scripts/setup_plan.py ]] \
    && command -v mpirun >/dev/null && command -v mpicc >/dev/null; then
  if hethpc_imports; then
    exit 0
  fi
  say "$py cannot import hethpc from $root (uninstalled or broken); reinstalling"
  rm -f "$stamp"
fi

# 1. MPI: a site module on PATH wins; otherwise the distro's Open MPI.
if command -v mpirun >/dev/null && command -v mpicc >/dev/null; then
  say "MPI: using $(command -v mpirun) ($(mpirun --version 2>&1 | head -n 1))"
elif [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
  say "MPI: none on PATH; installing Open MPI from the distro packages"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq openmpi-bin libopenmpi-dev >/dev/null
elif [[ $(id -u) -eq 0 ]] && command -v dnf >/dev/null; then
  say "MPI: none on PATH; installing Open MPI from the distro packages"
  dnf install -y -q openmpi openmpi-devel
  export PATH="/usr/lib64/openmpi/bin:$PATH"
else
  die "no MPI found (mpirun and mpicc must be on PATH).
  On a cluster: 'module load openmpi' (or your site's MPI module), then rerun.
  On Debian/Ubuntu: sudo apt-get install openmpi-bin libopenmpi-dev
  On RHEL/Fedora:   sudo dnf install openmpi openmpi-devel && module load mpi/openmpi-x86_64"
fi

# 2. The virtual environment with torch (the CPU build when it is on local disk).
if [[ ! -x "$py" ]]; then
  say "creating $venv"
  "${PYTHON:-python3}" -m venv "$venv"
fi
"$py" -m pip install -q --upgrade pip setuptools wheel
if ! "$py" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$torch_version')" 2>/dev/null; then
  say "installing torch==$torch_version"
  "$py" -m pip install -q "torch==$torch_version"
fi

# 3. What to build here: Horovod for the CPU (MPI), or for the GPU (NCCL) on a GPU node.
#    scripts/setup_plan.py decides (tests/test_setup_plan.py checks its decisions on CPU).
mpitag=$(mpicc --showme:version 2>/dev/null | tr -cd '[:alnum:].' | cut -c1-40 || echo mpi)
plan() {
  local out
  out=$("$py" scripts/setup_plan.py --horovod "$horovod_version" --torch "$torch_version" \
    --mpitag "$mpitag") || die "scripts/setup_plan.py failed (above)"
  eval "$out"
}
plan
gpu_env=""
if ((plan_gpu)); then
  say "GPU build: $plan_reason"
  if ((plan_reinstall_torch)); then
    say "replacing torch's CPU build by PyPI's CUDA build of torch==$torch_version"
    "$py" -m pip install -q --force-reinstall --index-url https://pypi.org/simple \
      "torch==$torch_version"
    plan
    if ((plan_reinstall_torch)); then
      die "pip installed a CPU build of torch again ($("$py" -c 'import torch; print(torch.__version__)')):" \
        "a find-links or extra index in your pip configuration ('pip config list') offers a" \
        "'+cpu' build, which pip prefers; remove it for this setup, or install PyPI's CUDA build" \
        "of torch==$torch_version into .venv yourself and run make setup again"
    fi
  fi
  if [[ -n "$plan_pip_packages" ]]; then
    say "installing the CUDA build tools from PyPI: $plan_pip_packages"
    set -f  # the pins hold '*' (13.0.*)
    # shellcheck disable=SC2086
    "$py" -m pip install -q $plan_pip_packages
    set +f
  fi
  site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  gpu_env=${plan_horovod_env//\{site\}/$site}
  # The names CMake looks for beside the wheels' own (lib64, libcudart.so, libnccl.so).
  for pair in ${plan_links//\{site\}/$site}; do
    link=${pair%%=*} to=${pair#*=}
    if [[ ! -e $link && -e $(dirname "$link")/$to ]]; then ln -s "$to" "$link"; fi
  done
else
  say "CPU build: $plan_reason"
fi

# 4. Horovod, built once into the cache: the release hard-codes C++14, torch needs C++17.
wheeldir="$cache/wheels/$plan_wheel_key"
have_horovod() {
  if ((plan_gpu)); then
    "$py" -c "import horovod.torch as h, sys; sys.exit(not h.nccl_built())" 2>/dev/null
  else
    "$py" -c "import horovod.torch" 2>/dev/null
  fi
}
if ! have_horovod; then
  if ! ls "$wheeldir"/horovod-*.whl >/dev/null 2>&1; then
    say "building Horovod $horovod_version with PyTorch and MPI (a few minutes, once; cached in $wheeldir)"
    build=$(mktemp -d)
    trap 'rm -rf "$build"' EXIT
    "$py" -m pip install -q cmake
    "$py" -m pip download -q --no-deps --no-binary :all: "horovod==$horovod_version" -d "$build"
    tar -xzf "$build/horovod-$horovod_version.tar.gz" -C "$build"
    src="$build/horovod-$horovod_version"
    # C++17 for torch's headers, and for the CUDA kernels (CUDA 13's headers refuse C++11)
    "$py" scripts/horovod_build.py patch "$src" || die "could not patch Horovod's sources (above)"
    # shellcheck disable=SC2086
    env $gpu_env PATH="$venv/bin:$PATH" MAKEFLAGS="-j$(nproc)" HOROVOD_WITH_PYTORCH=1 \
      HOROVOD_WITH_MPI=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
      HOROVOD_WITHOUT_GLOO=1 "$py" -m pip wheel -q --no-deps --no-build-isolation "$src" -w "$build/out" \
      > "$build/build.log" 2>&1 || build_failed "$build/build.log"
    mkdir -p "$wheeldir"
    mv "$build"/out/horovod-*.whl "$wheeldir/"
  fi
  say "installing Horovod from $wheeldir"
  "$py" -m pip install -q --no-deps --force-reinstall "$wheeldir"/horovod-*.whl
  "$py" -m pip install -q cloudpickle psutil pyyaml packaging cffi
fi

# 5. mpi4py against this MPI (not a wheel built for another), then hethpc and its dev tools.
if ! "$py" -c "import mpi4py.MPI" 2>/dev/null; then
  say "building mpi4py against $(command -v mpicc)"
  "$py" -m pip install -q --no-binary mpi4py "mpi4py>=4.0,<5"
fi
say "installing hethpc (editable) with its dev extra"
"$py" -m pip install -q --no-build-isolation -e ".[dev]"

# 6. Check it: Horovod imports with MPI built in, and a 2-rank allreduce sums correctly.
"$py" - <<'PY' || die "Horovod is installed but not usable (see above)"
import horovod.torch as hvd
assert hvd.mpi_built(), "Horovod was built without MPI"
PY
out=$(scripts/mpirun.sh -np 2 "$py" -c '
import torch, horovod.torch as hvd
hvd.init()
s = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum)
sums = hvd.allgather_object(int(s.item()))
if hvd.rank() == 0:
    print("allreduce sums", *sums)
' 2>&1) || { echo "$out" >&2; die "2-rank Horovod allreduce failed"; }
grep -q '^allreduce sums 3 3$' <<<"$out" \
  || { echo "$out" >&2; die "2-rank Horovod allreduce gave a wrong sum (expected 3 on both ranks)"; }
if ((plan_gpu)); then  # NCCL: one rank per GPU, so two ranks need two GPUs
  ngpu=$("$py" -c 'import torch; print(torch.cuda.device_count())')
  if ((ngpu >= 2)); then
    out=$(scripts/mpirun.sh -np 2 "$py" -c '
import torch, horovod.torch as hvd
hvd.init()
torch.cuda.set_device(hvd.local_rank())
s = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)], device="cuda"), op=hvd.Sum)
sums = hvd.allgather_object(int(s.item()))
if hvd.rank() == 0:
    print("nccl allreduce sums", *sums)
' 2>&1) || { echo "$out" >&2; die "2-rank NCCL allreduce failed"; }
    grep -q '^nccl allreduce sums 3 3$' <<<"$out" \
      || { echo "$out" >&2; die "2-rank NCCL allreduce gave a wrong sum (expected 3 on both)"; }
    say "ok: NCCL allreduce on 2 GPUs = 3"
  else
    say "NCCL allreduce not checked: $ngpu GPU(s) here, NCCL needs one per rank (2 ranks)"
  fi
fi
say "ok: Horovod $horovod_version ($( ((plan_gpu)) && echo MPI+NCCL || echo MPI)), mpi4py, torch $torch_version; 2-rank allreduce = 3"
touch "$stamp"
