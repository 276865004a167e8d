"""The names that console scripts installed before the commands moved to :mod:`hethpc.cli` call.

An install's launchers (``.venv/bin/hethpc-train``) import the functions its entry points named
then; these keep them working until ``pip install -e .`` (``scripts/setup.sh`` reruns it when
``setup.cfg`` changes) writes launchers that call ``hethpc.cli.<command>:main``.
"""

from __future__ import annotations


def train() -> int:
    """``hethpc-train``: :func:`hethpc.cli.train.main`."""
    from hethpc.cli.train import main

    return main()


def report() -> int:
    """``hethpc-report``: :func:`hethpc.cli.report.main`."""
    from hethpc.cli.report import main

    return main()


def convert() -> int:
    """``hethpc-convert``: :func:`hethpc.cli.convert.main`."""
    from hethpc.cli.convert import main

    return main()


def inspect() -> int:
    """``hethpc-inspect``: :func:`hethpc.cli.inspect_dataset.main`."""
    from hethpc.cli.inspect_dataset import main

    return main()


def testbed() -> int:
    """``hethpc-testbed``: :func:`hethpc.cli.testbed.main`."""
    from hethpc.cli.testbed import main

    return main()
