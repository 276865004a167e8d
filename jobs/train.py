"""Train a model across MPI ranks with hethpc: data, batching, sync and checkpoints in one job.

    scripts/mpirun.sh -np 2 .venv/bin/python jobs/train.py --epochs 5
    scripts/mpirun.sh -np 2 .venv/bin/python jobs/train.py --config run.toml --sync selsync

The program is :mod:`hethpc.cli.train`, installed as ``hethpc-train``; ``--help`` shows every
setting.
"""

import sys

from hethpc.cli.train import main

if __name__ == "__main__":
    sys.exit(main())
