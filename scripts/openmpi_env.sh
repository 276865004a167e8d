# Sourced by scripts/mpirun.sh and slurm/common.sh: the Open MPI settings hethpc's ranks run best
# with, each only where the environment does not set it already (an exported OMPI_MCA_* wins).

# Ranks that wait in MPI yield the core instead of spinning: on a workstation the ranks, Horovod's
# background threads and the loaders share few cores (a 10x step time difference on 2 cores; on
# a loaded 2-CPU node 10.2 s against 14.6-40.5 s). Set it to 0 on dedicated nodes for the lowest
# latency.
export OMPI_MCA_mpi_yield_when_idle=${OMPI_MCA_mpi_yield_when_idle:-1}
# Between nodes over TCP: messages in 1 MB pieces through 4 MB socket buffers (Open MPI's
# defaults: 64 KB, 128 KB pieces, the system's buffers). hethpc's ranks wait without spinning,
# and a transfer moves only while its rank tests it: fewer, larger pieces need fewer tests. A
# 423 KB allreduce over a 200 Mbit/s testbed link: 15.0 ms against 16.0 (benchmarks/bench_wait.py).
export OMPI_MCA_btl_tcp_eager_limit=${OMPI_MCA_btl_tcp_eager_limit:-1048576}
export OMPI_MCA_btl_tcp_rndv_eager_limit=${OMPI_MCA_btl_tcp_rndv_eager_limit:-1048576}
export OMPI_MCA_btl_tcp_max_send_size=${OMPI_MCA_btl_tcp_max_send_size:-1048576}
export OMPI_MCA_btl_tcp_sndbuf=${OMPI_MCA_btl_tcp_sndbuf:-4194304}
export OMPI_MCA_btl_tcp_rcvbuf=${OMPI_MCA_btl_tcp_rcvbuf:-4194304}
