"""Exit 0 when this host lets one process read another's memory (Linux CMA), else 1.

    python3 scripts/probe_cma.py [-v]

Open MPI's shared-memory transport (vader) moves a large message with one copy by
``process_vm_readv`` when it can (``btl_vader_single_copy_mechanism=cma``): the receiver copies
the whole message as soon as it matches the send, while the sender computes. Without it, large
messages go through shared-memory fragments that only move while both ranks call into MPI. Some
containers forbid the system call (seccomp, no ptrace rights), and Open MPI then fails at the
first large message instead of falling back; scripts/mpirun.sh runs this probe to choose.
Standard library only: it runs before any environment is set up.
"""

from __future__ import annotations

import ctypes
import os
import sys

_MARK = b"hethpc-cma-probe"


class _IOVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def cma_works() -> tuple[bool, str]:
    """Fork a child and read a buffer from its memory; (works, why not)."""
    if not sys.platform.startswith("linux"):
        return False, f"not Linux ({sys.platform})"
    libc = ctypes.CDLL(None, use_errno=True)
    if not hasattr(libc, "process_vm_readv"):
        return False, "libc has no process_vm_readv"
    src = ctypes.create_string_buffer(_MARK, len(_MARK))
    ready_r, ready_w = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child holds its copy of src until the parent has read it
        os.close(ready_r)
        os.close(done_w)
        os.write(ready_w, b"1")
        os.read(done_r, 1)
        os._exit(0)
    os.close(ready_w)
    os.close(done_r)
    try:
        os.read(ready_r, 1)
        dst = ctypes.create_string_buffer(len(_MARK))
        local = _IOVec(ctypes.addressof(dst), len(_MARK))
        remote = _IOVec(ctypes.addressof(src), len(_MARK))
        libc.process_vm_readv.restype = ctypes.c_ssize_t
        n = libc.process_vm_readv(
            pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, ctypes.c_ulong(0)
        )
        err = ctypes.get_errno()
    finally:
        os.write(done_w, b"1")
        os.waitpid(pid, 0)
        os.close(ready_r)
        os.close(done_w)
    if n != len(_MARK) or dst.raw != _MARK:
        return False, f"process_vm_readv returned {n} ({os.strerror(err) if n < 0 else 'short'})"
    return True, ""


def main() -> int:
    ok, why = cma_works()
    if "-v" in sys.argv[1:]:
        print("CMA works" if ok else f"CMA unavailable: {why}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
