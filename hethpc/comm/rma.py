"""One-sided communication: a parameter vector and per-rank clocks that any rank reads and
updates at any time, without the others taking part (MPI RMA, passive target).

``SharedState`` keeps, in memory of one host rank (rank 0 of the group), a float32 vector
(the shared parameters) and a few int64 counters per rank (clocks), in two MPI windows. Each
rank adds its updates to the vector (``MPI_Accumulate`` with ``MPI_SUM``: element-wise atomic,
so concurrent adds from several ranks all land), reads it (``MPI_Get_accumulate`` with
``MPI_NO_OP``: an atomic read, never half of a concurrent add), and sets and reads the counters
the same way, each under a shared lock of the host's window. No other rank has to call
anything for an operation to complete: with Open MPI on one node the windows are shared memory
(``osc/sm``) and the origin does the work itself; across nodes the RDMA component
(``osc/rdma``, ``osc/ucx``) does.

With link emulation on (:func:`hethpc.comm.link.set_link`), a read or an add of ``n`` bytes lasts at
least ``n / bandwidth + latency`` (a point-to-point transfer to or from the host).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from hethpc.comm.groups import Group, resolve
from hethpc.comm.link import current_link, wait_out
from hethpc.comm.runtime import state


class SharedState:
    """A shared float32 vector and ``counters`` int64 counters per rank, hosted by the group's
    first rank.

    Creating and :meth:`close`-ing it are collective over ``group``; everything else is
    one-sided. In a size-1 world it is plain memory.

    Args:
        initial: the vector's starting value; the host's copy is used (equal on every rank
            when the caller broadcast it).
        group: the ranks that share it (default: the world).
        counters: counters per rank, all starting at 0.
    """

    def __init__(
        self, initial: np.ndarray, *, group: Group | None = None, counters: int = 1
    ) -> None:
        g = resolve(group)
        self._g = g
        self.size = g.size
        self.n = int(initial.size)
        self.k = int(counters)
        self._local: np.ndarray | None = None
        self._clocks_local: np.ndarray | None = None
        if g.size == 1 or g.mpi_comm is None:
            self._local = np.array(initial, dtype=np.float32).ravel()
            self._clocks_local = np.zeros((self.k, 1), dtype=np.int64)
            return
        MPI = state().mpi
        self._MPI = MPI
        c = g.mpi_comm
        host = c.Get_rank() == 0
        self._vec = MPI.Win.Allocate(self.n * 4 if host else 0, 4, comm=c)
        self._clk = MPI.Win.Allocate(self.k * g.size * 8 if host else 0, 8, comm=c)
        if host:
            vec = np.frombuffer(self._vec.tomemory(), dtype=np.float32)
            clk = np.frombuffer(self._clk.tomemory(), dtype=np.int64)
            self._vec.Lock(0, MPI.LOCK_EXCLUSIVE)
            vec[:] = np.asarray(initial, dtype=np.float32).ravel()
            self._vec.Unlock(0)
            self._clk.Lock(0, MPI.LOCK_EXCLUSIVE)
            clk[:] = 0
            self._clk.Unlock(0)
        c.Barrier()
        self._me = c.Get_rank()
        self._origin = np.zeros(self.n, dtype=np.float32)  # ignored by NO_OP reads
        self._clk_origin = np.zeros(self.k * g.size, dtype=np.int64)

    def _emulate(self, t0: float, nbytes: int) -> None:
        link = current_link()
        if link is not None:
            wait_out(t0, link.p2p_s(nbytes), nbytes)

    def add(self, delta: np.ndarray) -> None:
        """Add ``delta`` (float32, ``n`` elements) to the shared vector, atomically per element."""
        d = np.ascontiguousarray(delta, dtype=np.float32).ravel()
        if self._local is not None:
            self._local += d
            return
        MPI = self._MPI
        t0 = time.perf_counter()
        self._vec.Lock(0, MPI.LOCK_SHARED)
        self._vec.Accumulate(d, 0, target=(0, self.n, MPI.FLOAT), op=MPI.SUM)
        self._vec.Unlock(0)
        self._emulate(t0, d.nbytes)

    def read(self, out: np.ndarray | None = None) -> np.ndarray:
        """The shared vector now (float32), into ``out`` when given."""
        buf = np.empty(self.n, dtype=np.float32) if out is None else out
        if self._local is not None:
            buf[:] = self._local
            return buf
        MPI = self._MPI
        t0 = time.perf_counter()
        self._vec.Lock(0, MPI.LOCK_SHARED)
        # NO_OP: an atomic read; the origin buffer is ignored (MPI wants it apart from the result).
        target = (0, self.n, MPI.FLOAT)
        self._vec.Get_accumulate(self._origin, buf, 0, target=target, op=MPI.NO_OP)
        self._vec.Unlock(0)
        self._emulate(t0, buf.nbytes)
        return buf

    def set_counter(self, which: int, value: int) -> None:
        """Publish this rank's counter number ``which``."""
        if self._clocks_local is not None:
            self._clocks_local[which, 0] = value
            return
        MPI = self._MPI
        v = np.array([value], dtype=np.int64)
        at = which * self.size + self._me
        self._clk.Lock(0, MPI.LOCK_SHARED)
        self._clk.Accumulate(v, 0, target=(at, 1, MPI.INT64_T), op=MPI.REPLACE)
        self._clk.Unlock(0)

    def counters(self) -> np.ndarray:
        """Every rank's counters now: shape ``(counters, ranks)``."""
        if self._clocks_local is not None:
            return self._clocks_local.copy()
        MPI = self._MPI
        out = np.empty(self.k * self.size, dtype=np.int64)
        target = (0, out.size, MPI.INT64_T)
        self._clk.Lock(0, MPI.LOCK_SHARED)
        self._clk.Get_accumulate(self._clk_origin, out, 0, target=target, op=MPI.NO_OP)
        self._clk.Unlock(0)
        return out.reshape(self.k, self.size)

    def barrier(self) -> None:
        """Wait until every rank of the group gets here (collective)."""
        if self._local is None:
            self._g.mpi_comm.Barrier()

    def close(self) -> None:
        """Free the windows (collective over the group); idempotent."""
        if self._local is None and getattr(self, "_vec", None) is not None:
            self._g.mpi_comm.Barrier()
            self._vec.Free()
            self._clk.Free()
            self._vec = None

    def __enter__(self) -> SharedState:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
