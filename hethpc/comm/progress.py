"""Keep point-to-point transfers moving while the caller computes (a pipeline stage).

Large MPI messages use a rendezvous: data moves only while both sides are inside MPI calls.
A stage that posts a send and then computes for a whole micro-batch would hold its neighbour
back by that long. Here receives are posted ahead of need, and a light thread tests every
pending transfer each ``interval`` seconds (sleeping, not spinning, in between), so a
message usually has arrived by the time its stage asks for it.

A stage waiting for a message also tests and sleeps rather than blocking in ``MPI_Wait``:
a blocked MPI wait polls (spins or yields) on its core, which on a machine with as many
cores as ranks takes the CPU from the neighbour stage that is computing the very message
awaited (measured on 2 cores, 2 stages: 1.0x -> 1.6x one rank's throughput).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from types import TracebackType

import torch

from hethpc.comm.groups import Group
from hethpc.comm.p2p import RecvRequest, Request, irecv_tensor, isend_tensor

# "auto" progress interval: this share of a forward or backward pass, within these bounds. Each
# test of the pending transfers takes the core from the stage computing on it (measured on 2
# cores, 512-row micro-batches of ~35 ms: 0.5 ms tests cost the stages 10-20 % of their speed,
# 5 ms ones nothing measurable), while a transfer left untested for a tenth of a pass delays
# the neighbour by at most that much.
AUTO_SHARE = 0.1
AUTO_MIN_S = 0.0005
AUTO_MAX_S = 0.01


def auto_interval(task_s: float | None) -> float:
    """The progress thread's interval for passes of ``task_s`` seconds (None: not yet timed).

    Returns:
        ``AUTO_SHARE * task_s`` clamped to ``[AUTO_MIN_S, AUTO_MAX_S]``; ``AUTO_MIN_S`` when
        ``task_s`` is None or not a positive number.
    """
    if task_s is None or not task_s > 0:
        return AUTO_MIN_S
    return min(AUTO_MAX_S, max(AUTO_MIN_S, AUTO_SHARE * task_s))


class Progress:
    """Context manager: tracks sends and pre-posted receives, progressing them in the
    background; every send is complete when the block exits without an error.

    Args:
        interval: seconds between tests of the pending transfers by the background thread;
            None runs no thread (transfers then move only while a stage waits for a message,
            enough when MPI moves large messages with one copy, e.g. Open MPI's CMA).
        wait_sleep: seconds :meth:`take` sleeps between tests of the receive it waits for
            (0 blocks in ``MPI_Wait`` instead, which spins or yields on the core).
    """

    def __init__(
        self, *, interval: float | None = 0.0005, wait_sleep: float = 0.00005
    ) -> None:
        self.interval = interval
        self.wait_sleep = wait_sleep
        self.wait_s = 0.0  # seconds spent in take(): waiting for messages
        self._sends: list[Request] = []
        self._recvs: list[RecvRequest] = []
        self._lock = threading.Lock()  # MPI requests are used by one thread at a time
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def send(self, tensor: torch.Tensor, dest: int, *, tag: int, group: Group) -> None:
        """Start sending ``tensor`` to group rank ``dest``."""
        with self._lock:
            self._sends = [r for r in self._sends if not r.test()]  # frees sent buffers
            self._sends.append(isend_tensor(tensor, dest, tag=tag, group=group))

    def post(
        self, source: int, *, tag: int, device: torch.device, group: Group
    ) -> RecvRequest:
        """Post a receive now; :meth:`take` it later."""
        with self._lock:
            req = irecv_tensor(source, tag=tag, device=device, group=group)
            self._recvs.append(req)
        return req

    def take(self, request: RecvRequest) -> torch.Tensor:
        """Wait for a posted receive and return its tensor (time spent adds to ``wait_s``)."""
        t0 = time.perf_counter()
        if self.wait_sleep > 0:
            # Each test drives MPI's progress for every pending request, sends included;
            # sleeping in between leaves the core to the neighbour stage (and its threads).
            while True:
                with self._lock:
                    if request.test():
                        break
                time.sleep(self.wait_sleep)
        with self._lock:
            out = request.wait()  # returns at once when the test above succeeded
            self._recvs.remove(request)
        self.wait_s += time.perf_counter() - t0
        return out

    def _run(self) -> None:
        assert self.interval is not None
        while not self._stop.wait(self.interval):
            with self._lock:
                self._sends = [r for r in self._sends if not r.test()]
                for r in self._recvs:
                    r.test()

    def __enter__(self) -> Progress:
        self._stop.clear()
        if self.interval is not None:
            self._thread = threading.Thread(
                target=self._run, name="hethpc-p2p-progress", daemon=True
            )
            self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        sends, self._sends = self._sends, []
        if exc_type is None:
            if self._recvs:
                raise RuntimeError(f"{len(self._recvs)} posted receives were never taken")
            if self.wait_sleep > 0:
                while sends:
                    sends = [r for r in sends if not r.test()]
                    if sends:
                        time.sleep(self.wait_sleep)
            for r in sends:
                r.wait()
        self._recvs = []


class Lookahead:
    """Receives of one direction, posted up to ``depth`` ahead of the order they are needed in.

    Args:
        progress: where the receives are posted.
        order: micro-batches in the order this stage consumes them.
        tag_of: the message tag of each micro-batch.
        source: the sending group rank.
        device: where received tensors go.
        group: the pipeline's group.
        depth: receives kept posted ahead.
    """

    def __init__(
        self,
        progress: Progress,
        order: Sequence[int],
        tag_of: dict[int, int],
        *,
        source: int,
        device: torch.device,
        group: Group,
        depth: int,
    ) -> None:
        self._progress = progress
        self._order = list(order)
        self._tag_of = tag_of
        self._device = device
        self._group = group
        self._source = source
        self._posted: dict[int, RecvRequest] = {}
        self._next = 0
        for _ in range(depth):
            self._post_next()

    def _post_next(self) -> None:
        if self._next < len(self._order):
            i = self._order[self._next]
            self._posted[i] = self._progress.post(
                self._source, tag=self._tag_of[i], device=self._device, group=self._group
            )
            self._next += 1

    def take(self, micro_batch: int) -> torch.Tensor:
        """The tensor of ``micro_batch`` (which must be the next one in ``order``)."""
        req = self._posted.pop(micro_batch)
        self._post_next()
        return self._progress.take(req)
