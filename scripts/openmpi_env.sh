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
# hethpc's allreduce is Open MPI's nonblocking one (MPI_Iallreduce, in place). For in-place
# buffers, and on fewer than 4 ranks, Open MPI picks "binomial" for it: a reduce to one rank,
# then a broadcast back, so each link carries the buffer one way and then the other, never both
# at once. The ring (1) sends both ways at once: a 30 MB gradient over a 200 Mbit/s testbed link
# took 1.25 s against 2.46 s (2 ranks), and 11 ms against 19 on shared memory. It sends 2(p - 1)
# messages per allreduce; on many ranks with slow latency, recursive doubling (4) pays less for
# small buffers. hethpc.comm.init sets the same default where this file is not sourced.
export OMPI_MCA_coll_libnbc_iallreduce_algorithm=${OMPI_MCA_coll_libnbc_iallreduce_algorithm:-1}
