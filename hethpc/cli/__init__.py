"""hethpc's commands: one module per program, each with ``main(argv=None) -> int``.

``hethpc-train`` (:mod:`hethpc.cli.train`), ``hethpc-report`` (:mod:`~hethpc.cli.report`),
``hethpc-convert`` (:mod:`~hethpc.cli.convert`), ``hethpc-inspect``
(:mod:`~hethpc.cli.inspect_dataset`) and ``hethpc-testbed`` (:mod:`~hethpc.cli.testbed`); the
scripts of ``jobs/`` and ``data_tools/`` run the same ``main``. This is the one part of hethpc
that reads ``sys.argv`` or takes settings from the environment; the library below it takes
them as arguments. Importing this package loads none of the programs, and it exports nothing:
the programs are run, not imported (their shared parser is :mod:`hethpc.cli.parser`).
"""
