"""Plot one or more hethpc runs and print their summary table.

    .venv/bin/python jobs/report.py runs/demo
    .venv/bin/python jobs/report.py runs/bsp runs/selsync --out plots/compare

The program is :mod:`hethpc.cli.report`, installed as ``hethpc-report``.
"""

import sys

from hethpc.cli.report import main

if __name__ == "__main__":
    sys.exit(main())
