#!/usr/bin/env bash
# One prepared check of hethpc on a GPU machine, made for one with no package registry: the
# machine's own Python and torch, hethpc from this working tree, what the machine lacks from
# the carried folder .device/ (scripts/device_prep.sh fills it here). About 5 minutes (a budget
# of 300 s shared by the steps, each with its own limit); the last stdout line is one JSON
# object of results, the exit code 0 when no step failed. Steps: docs/gpu.md, "The device check".
#
#   scripts/device_check.sh --out DIR  # JSON and logs also in DIR (default: $OUT when set)
#   scripts/device_check.sh --cpu      # the same steps on CPU; GPU-only items "skipped: no GPU"
#   scripts/device_check.sh --small    # tiny sizes (tests/test_device_check.py: --cpu --small)
#   scripts/device_check.sh --help     # every option
#
# Environment: PYTHON (default: .venv/bin/python when there, else python3 on PATH).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [[ -n ${PYTHON:-} ]]; then
  py=$PYTHON
elif [[ -x $root/.venv/bin/python ]]; then
  py=$root/.venv/bin/python
else
  py=$(command -v python3 || true)
fi
if [[ -z $py ]] || ! "$py" -c "import torch" 2>/dev/null; then
  echo "device_check: no Python with torch (tried ${py:-python3}); set PYTHON, or run" \
    "'make setup' (scripts/setup.sh) first" >&2
  exit 2
fi
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} PYTHONUNBUFFERED=1
# A plain python process: the steps launch their own ranks with scripts/mpirun.sh. The check
# keeps to its budget; this bound only catches a driver that hangs.
exec timeout 420 "$py" "$root/scripts/device_check.py" "$@"
