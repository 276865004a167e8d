#!/usr/bin/env bash
# One prepared check of hethpc on this machine's GPU, under 5 minutes on one GPU machine:
# the GPU build (setup plan, torch.version.cuda, Horovod's NCCL), an NCCL allreduce with the
# right sum, jobs/train.py on CUDA (data-parallel, dynamic batching), a 2-stage pipeline with
# the same loss as one process, and benchmarks/bench_pipeline.py --quick (samples/s, speedup).
# The last stdout line is one JSON object of results; the exit code is 0 when no step failed.
#
#   scripts/device_check.sh            # GPU steps where a GPU is visible, else on CPU
#   scripts/device_check.sh --cpu      # the same steps on CPU; GPU-only items "skipped: no GPU"
#   scripts/device_check.sh --small    # tiny sizes (tests/test_device_check.py: --cpu --small)
#
# Environment: PYTHON (default .venv/bin/python). Each step has its own time limit.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
py=${PYTHON:-$root/.venv/bin/python}
if [[ ! -x $py ]]; then
  echo "device_check: no $py; run 'make setup' (scripts/setup.sh) first" >&2
  exit 2
fi
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# A plain python process: the steps launch their own ranks with scripts/mpirun.sh.
exec timeout 300 "$py" "$root/scripts/device_check.py" "$@"
