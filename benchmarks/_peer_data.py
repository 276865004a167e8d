"""The peers' data (``peer_horovod.py``, ``peer_ddp.py``): the demo's MNIST-1D and each rank's
share of it, the same for both, so that they differ only in how they synchronise."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DistributedSampler, Sampler, TensorDataset

from hethpc.data import load_mnist1d
from hethpc.data.partition import LabelSkewPartitioner


class ShareSampler(Sampler[int]):
    """A fixed share of sample indices, in a new order each epoch (``seed + epoch``), repeated
    to ``length`` samples so that every rank takes as many steps as the largest share."""

    def __init__(self, indices: np.ndarray, length: int, seed: int) -> None:
        self.indices, self.length, self.seed, self.epoch = indices, length, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        order = np.random.default_rng(self.seed + self.epoch).permutation(self.indices)
        return iter(np.resize(order, self.length).tolist())

    def __len__(self) -> int:
        return self.length


def load_data(
    args: argparse.Namespace, rank: int, barrier: Callable[[], Any]
) -> tuple[TensorDataset, TensorDataset, np.ndarray]:
    """``(train, test, train labels)``: rank 0 generates the cached data, then the others read."""
    cache = os.environ.get("HETHPC_CACHE") or os.path.expanduser("~/.cache/hethpc")
    if rank == 0:
        load_mnist1d(num_samples=args.samples, seed=args.data_seed, cache_dir=cache)
    barrier()
    train, test = load_mnist1d(num_samples=args.samples, seed=args.data_seed, cache_dir=cache)
    return (
        TensorDataset(torch.from_numpy(train.x), torch.from_numpy(train.y)),
        TensorDataset(torch.from_numpy(test.x), torch.from_numpy(test.y)),
        train.y,
    )


def train_sampler(
    args: argparse.Namespace, train: TensorDataset, labels: np.ndarray, rank: int, size: int
) -> Any:
    """IID: torch's ``DistributedSampler``; labels: hethpc's label-skew partition, padded."""
    if args.partition == "iid":
        return DistributedSampler(train, num_replicas=size, rank=rank,
                                  shuffle=True, seed=args.seed)  # fmt: skip
    shares = LabelSkewPartitioner(labels_per_rank=args.labels_per_rank).all_indices(
        labels, size, args.seed
    )
    return ShareSampler(shares[rank], max(len(s) for s in shares), args.seed)
