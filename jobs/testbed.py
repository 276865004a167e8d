"""A heterogeneous cluster on this host, enforced by the kernel: bring it up, run on it, down.

    hethpc-testbed up --node cpu=1,link=1gbit --node cpu=0.5,link=200mbit
    hethpc-testbed run -- scripts/mpirun.sh -np 2 .venv/bin/python jobs/train.py --epochs 2
    hethpc-testbed status
    hethpc-testbed link node1 50mbit        # or: down, up, none
    hethpc-testbed down

(``python jobs/testbed.py`` is the same program.) The program is :mod:`hethpc.cli.testbed`.
"""

import sys

from hethpc.cli.testbed import main

if __name__ == "__main__":
    sys.exit(main())
