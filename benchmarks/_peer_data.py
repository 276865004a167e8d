"""The peers' data (``peer_horovod.py``, ``peer_ddp.py``): the demo's MNIST-1D, the validation
split hethpc holds out, and each rank's share of the rest, the same for both, so that they
differ only in how they synchronise."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import numpy as np
import torch
from torch.utils.data import Dataset, DistributedSampler, Sampler, Subset, TensorDataset

from hethpc.data import load_mnist1d
from hethpc.data.holdout import holdout
from hethpc.data.partition.label_skew import LabelSkewPartitioner


class PeerData(NamedTuple):
    """The training and test splits; with a validation split, the training samples kept."""

    train: TensorDataset  # every training sample, the held-out ones included
    test: TensorDataset
    labels: np.ndarray  # the training labels
    kept: np.ndarray | None  # the training samples training may use; None: all
    val: TensorDataset | None  # the held-out validation split; None: none


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


def load_data(args: argparse.Namespace, rank: int, barrier: Callable[[], Any]) -> PeerData:
    """Rank 0 generates the cached data, then the others read; ``--val-fraction`` holds out
    hethpc's validation split (``hethpc.data.holdout`` on the same training arrays, drawn by
    ``--data-seed``: the samples a hethpc run with the same settings holds out)."""
    cache = os.environ.get("HETHPC_CACHE") or os.path.expanduser("~/.cache/hethpc")
    if rank == 0:
        load_mnist1d(num_samples=args.samples, seed=args.data_seed, cache_dir=cache)
    barrier()
    train, test = load_mnist1d(num_samples=args.samples, seed=args.data_seed, cache_dir=cache)
    kept = val = None
    if args.val_fraction:
        kept, held = holdout(train, args.val_fraction, args.data_seed)
        val = TensorDataset(torch.from_numpy(held.x), torch.from_numpy(held.y))
    return PeerData(
        TensorDataset(torch.from_numpy(train.x), torch.from_numpy(train.y)),
        TensorDataset(torch.from_numpy(test.x), torch.from_numpy(test.y)),
        train.y,
        kept,
        val,
    )


def train_split(
    args: argparse.Namespace, data: PeerData, rank: int, size: int
) -> tuple[Dataset[Any], Any]:
    """``(dataset, sampler)`` of this rank's training samples, none held out. IID: torch's
    ``DistributedSampler`` over the kept samples; labels: hethpc's label-skew partition of all
    samples, less the held-out ones (as hethpc draws it), padded to the largest share."""
    if args.partition == "iid":
        train = data.train if data.kept is None else Subset(data.train, data.kept.tolist())
        sampler: DistributedSampler[Any] = DistributedSampler(
            train, num_replicas=size, rank=rank, shuffle=True, seed=args.seed
        )
        return train, sampler
    shares = LabelSkewPartitioner(labels_per_rank=args.labels_per_rank).all_indices(
        data.labels, size, args.seed
    )
    if data.kept is not None:
        shares = [s[np.isin(s, data.kept)] for s in shares]
    return data.train, ShareSampler(shares[rank], max(len(s) for s in shares), args.seed)
