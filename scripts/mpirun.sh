#!/usr/bin/env bash
# mpirun with the settings hethpc needs on a workstation: root allowed under Open MPI,
# more ranks than cores, and a wall-clock bound so nothing can hang forever.
#
#   scripts/mpirun.sh -np 2 .venv/bin/python jobs/train.py ...
#
# Environment: HETHPC_MPIRUN_TIMEOUT (seconds, default 0 = no bound), MPIRUN (the launcher),
# PYTHON (runs scripts/probe_cma.py, default python3), and any OMPI_MCA_* setting, which wins.
set -euo pipefail
launcher=${MPIRUN:-mpirun}
args=()
if "$launcher" --version 2>&1 | grep -q "Open MPI"; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  export OMPI_MCA_rmaps_base_oversubscribe=1
  # Large messages between ranks of a node: one copy by CMA (the receiver takes the whole
  # message while the sender computes) where the host allows it; some containers forbid it, and
  # Open MPI then fails at the first large message, so a probe decides (two copies otherwise).
  if [[ -z ${OMPI_MCA_btl_vader_single_copy_mechanism:-} ]]; then
    mechanism=none
    if "${PYTHON:-python3}" "$(dirname "${BASH_SOURCE[0]}")/probe_cma.py"; then mechanism=cma; fi
    export OMPI_MCA_btl_vader_single_copy_mechanism=$mechanism
  fi
  source "$(dirname "${BASH_SOURCE[0]}")/openmpi_env.sh"  # yield when idle, TCP pieces
  # A node that drops off the network (cable, switch, power) sends no reset: mpirun hears of it
  # only by TCP keepalive, after 300 s by default, and until then the job hangs. Probing every
  # 5 s, 5 times, ends it about 30 s after the cut, naming the node (docs/testbed.md); a short
  # outage (20 s) is ridden out.
  export OMPI_MCA_oob_tcp_keepalive_time=${OMPI_MCA_oob_tcp_keepalive_time:-5}
  export OMPI_MCA_oob_tcp_keepalive_intvl=${OMPI_MCA_oob_tcp_keepalive_intvl:-5}
  export OMPI_MCA_oob_tcp_keepalive_probes=${OMPI_MCA_oob_tcp_keepalive_probes:-5}
  args+=(--oversubscribe --bind-to none)
  if [[ ${HETHPC_MPIRUN_TIMEOUT:-0} != 0 ]]; then
    args+=(--timeout "$HETHPC_MPIRUN_TIMEOUT")
  fi
fi
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
exec "$launcher" "${args[@]}" "$@"
