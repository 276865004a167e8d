"""Convert data into hethpc's HDF5-sharded format (one directory per split).

    python data_tools/convert.py mnist1d --out data/mnist1d --samples 20000
    python data_tools/convert.py digits --out data/digits
    python data_tools/convert.py npz data.npz --out data/mine
    python data_tools/convert.py npy x.npy y.npy --out data/mine --test-fraction 0.1 --seed 3
    python data_tools/convert.py idx train-images.gz train-labels.gz --out data/mnist
    python data_tools/convert.py cifar cifar-10/data_batch_* --test cifar-10/test_batch --out c10
    python data_tools/convert.py synthetic --out /tmp/synth --samples 100000 --shape 1024
    python data_tools/convert.py text --out data/stdlib

The program is :mod:`hethpc.cli.convert`, installed as ``hethpc-convert``.
"""

import sys

from hethpc.cli.convert import main

if __name__ == "__main__":
    sys.exit(main())
