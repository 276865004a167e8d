"""The CUDA send poster: one thread that hands CUDA payloads to MPI once their bytes are ready.

Used by :mod:`hethpc.comm.p2p` for CUDA tensors only; CPU sends never meet it.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from hethpc.comm import staging


def buffer_of(t: torch.Tensor) -> Any:
    """What MPI reads or writes: a numpy view on the host, the CUDA tensor itself otherwise
    (mpi4py takes it by DLPack or the CUDA array interface)."""
    return t if t.is_cuda else t.numpy()


class Payload:
    """A CUDA send's bytes, posted to MPI by the poster once its fence has passed."""

    def __init__(
        self, comm: Any, buf: torch.Tensor, fence: staging.Fence, dest: int, tag: int,
        release: Callable[[], None] | None,
    ) -> None:  # fmt: skip
        self.comm, self.buf, self.fence, self.dest, self.tag = comm, buf, fence, dest, tag
        self.release = release
        self.request: Any = None
        self.error: BaseException | None = None  # what went wrong in the poster, if anything
        self.posted = threading.Event()


class Poster:
    """One thread that posts CUDA payloads, oldest first, each once its fence has passed.

    Posting strictly in call order keeps two sends to one peer with one tag in the order they
    were started, as MPI's matching requires. The thread sleeps in the fence's
    ``synchronize`` (a CUDA event: the GIL is released) and posts under
    ``MPI_THREAD_MULTIPLE``, which :func:`hethpc.comm.init` requires.
    """

    def __init__(self) -> None:
        self.queue: deque[Payload] = deque()
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None

    def put(self, payload: Payload) -> None:
        with self._cv:
            self.queue.append(payload)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="hethpc-p2p-poster", daemon=True
                )
                self._thread.start()
            self._cv.notify()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self.queue:
                    self._cv.wait()
                p = self.queue[0]
            try:
                p.fence.synchronize()
                p.request = p.comm.Isend(buffer_of(p.buf), dest=p.dest, tag=p.tag)
            except Exception as e:  # noqa: BLE001 - raised by the sender's test() or wait()
                p.error = e
            with self._cv:
                self.queue.popleft()
            p.posted.set()


poster = Poster()
