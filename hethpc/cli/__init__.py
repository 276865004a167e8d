"""hethpc's commands: one module per program, each with ``main(argv=None) -> int``.

``hethpc-train`` (:mod:`hethpc.cli.train`), ``hethpc-report`` (:mod:`~hethpc.cli.report`),
``hethpc-convert`` (:mod:`~hethpc.cli.convert`), ``hethpc-inspect``
(:mod:`~hethpc.cli.inspect_dataset`) and ``hethpc-testbed`` (:mod:`~hethpc.cli.testbed`); the
scripts of ``jobs/`` and ``data_tools/`` run the same ``main``. This is the one part of hethpc
that reads ``sys.argv`` or takes settings from the environment; the library below it takes
them as arguments. Importing this package loads none of the programs.
"""

from __future__ import annotations

from hethpc.cli.parser import ArgumentParser, command_name, flag_hint

__all__ = ["ArgumentParser", "command_name", "flag_hint"]
