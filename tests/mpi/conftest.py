"""Distributed test harness: every rank runs the same tests; one failure ends them all.

Run with ``scripts/mpirun.sh -np N .venv/bin/python -m mpi4py -m pytest tests/mpi``, with
``HETHPC_TEST_TRANSPORT=horovod`` or ``mpi`` to choose the tensor transport (default: auto).
Under plain ``pytest`` the same tests run as a world of size 1.

A test that fails on one rank while the others go on would leave them waiting in the next
collective; so a failure on any rank aborts the job (after printing the report), and the
per-test timeout (thread method: the signal method cannot interrupt MPI calls) ends a hang.
"""

from __future__ import annotations

import os
import sys

import pytest

from hethpc import comm


@pytest.fixture(scope="module")
def world() -> tuple[int, int]:
    """This rank and the world's size (every test module's view of the job)."""
    comm.init()
    return comm.rank(), comm.size()


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    # The Makefile runs these tests once per transport (HETHPC_TEST_TRANSPORT): "auto" is
    # mpi4py alone on these CPU ranks, "horovod" starts Horovod.
    comm.init(transport=os.environ.get("HETHPC_TEST_TRANSPORT") or None)
    if comm.rank() != 0:
        # Only rank 0 speaks; the others report their failures through the abort below.
        reporter = config.pluginmanager.getplugin("terminalreporter")
        if reporter is not None:
            config.pluginmanager.unregister(reporter)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.failed and comm.size() > 1:
        sys.stderr.write(
            f"\n[rank {comm.rank()}] FAILED {report.nodeid} ({report.when})\n"
            f"{report.longreprtext}\n[rank {comm.rank()}] aborting all ranks\n"
        )
        sys.stderr.flush()
        comm.abort(1)
