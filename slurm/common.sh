# Sourced by every script in slurm/ after it has set $root (the repository). It sizes each rank
# from the allocation, sets the MPI settings of scripts/mpirun.sh that apply on a cluster, picks
# the run directory, and defines `launch`, which runs or prints a command. Nothing here starts a process of its own except the CMA probe.
#
# Settings (environment): HETHPC_PYTHON (default $root/.venv/bin/python), HETHPC_RUN_DIR (a run
# directory to share across jobs: resumed when it holds a run with the same settings),
# HETHPC_DRY_RUN=1 (print the launch instead of running it), and any OMPI_MCA_* setting, which
# wins over the defaults below.

python=${HETHPC_PYTHON:-$root/.venv/bin/python}
if [[ ${HETHPC_DRY_RUN:-0} == 0 && ! -x $python ]]; then
  echo "hethpc: no Python at $python: run 'make setup' in $root first, or set HETHPC_PYTHON" >&2
  exit 2
fi

# One thread per CPU of the task (sbatch --cpus-per-task); a job without it gets one.
export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}
# A rank that stops answering ends the job instead of holding the allocation.
export HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=${HOROVOD_STALL_SHUTDOWN_TIME_SECONDS:-600}
# Ranks that yield their core while they wait in MPI, and TCP in 1 MB pieces (the same as
# scripts/mpirun.sh).
source "$root/scripts/openmpi_env.sh"
# Large messages within a node by one copy (CMA) where the host allows it (scripts/probe_cma.py).
if [[ -z ${OMPI_MCA_btl_vader_single_copy_mechanism:-} ]]; then
  OMPI_MCA_btl_vader_single_copy_mechanism=none
  if [[ ${HETHPC_DRY_RUN:-0} == 0 ]] && "$python" "$root/scripts/probe_cma.py"; then
    OMPI_MCA_btl_vader_single_copy_mechanism=cma
  fi
  export OMPI_MCA_btl_vader_single_copy_mechanism
fi

# The run directory: runs/slurm-<cluster>-<job id>, or with a suffix .2, .3, ... when a job of the
# same id ran before (job ids restart on a new cluster). A fresh job takes the first free name and
# creates it; a requeued job (SLURM_RESTART_COUNT > 0) resumes the newest one, its own.
resume=()
if [[ -n ${HETHPC_RUN_DIR:-} ]]; then
  run_dir=$HETHPC_RUN_DIR
  resume=(--resume)
else
  base=$root/runs/slurm-${SLURM_CLUSTER_NAME:-local}-${SLURM_JOB_ID:-local}
  run_dir=$base
  n=1
  while [[ -e $run_dir ]]; do
    n=$((n + 1))
    run_dir=$base.$n
  done
  if [[ ${SLURM_RESTART_COUNT:-0} -gt 0 && $n -gt 1 ]]; then
    run_dir=$base
    if [[ $n -gt 2 ]]; then run_dir=$base.$((n - 1)); fi
    resume=(--resume)
  elif [[ ${HETHPC_DRY_RUN:-0} == 0 ]]; then
    mkdir -p "$run_dir"
  fi
fi
job=("$python" "$root/jobs/train.py" --run-dir "$run_dir" "${resume[@]}" --progress false)

# Run the command given, from the repository; with HETHPC_DRY_RUN=1 print it instead.
launch() {
  if [[ ${HETHPC_DRY_RUN:-0} != 0 ]]; then
    echo "OMP_NUM_THREADS=$OMP_NUM_THREADS $*"
    exit 0
  fi
  cd "$root"
  echo "hethpc: $*"
  exec "$@"
}
