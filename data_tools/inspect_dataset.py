"""Summarise, verify and plot an HDF5-sharded dataset, per shard and per rank of a partition.

    python data_tools/inspect_dataset.py data/mnist1d/train
    python data_tools/inspect_dataset.py data/mnist1d/train --verify
    python data_tools/inspect_dataset.py data/mnist1d/train --partition dirichlet \\
        --dirichlet-alpha 0.3 --world-size 4 --plot ranks.png
    python data_tools/inspect_dataset.py data/mnist1d/train --partition labels \\
        --labels-per-rank 5 --world-size 2

The program is :mod:`hethpc.cli.inspect_dataset`, installed as ``hethpc-inspect``.
"""

import sys

from hethpc.cli.inspect_dataset import main

if __name__ == "__main__":
    sys.exit(main())
