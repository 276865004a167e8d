"""The gradient weight of a rank: batch share in IID modes, partition share in non-IID ones."""

from __future__ import annotations

import numpy as np
import pytest

from hethpc.train.run.shares import gradient_weight


@pytest.mark.parametrize(
    "partition,sizes,lengths,expected",
    [
        ("iid", [96, 32], None, [0.75, 0.25]),
        ("seldp", [100, 28], [8000, 8000], [100 / 128, 28 / 128]),
        # A fast rank holding most of the batch must not outweigh the other rank's labels.
        ("labels", [112, 16], [8000, 8000], [0.5, 0.5]),
        ("dirichlet", [64, 64], [6000, 2000], [0.75, 0.25]),
        ("labels", [40, 40, 48], [1, 1, 2], [0.25, 0.25, 0.5]),
    ],
    ids=["iid-batch-share", "seldp-batch-share", "labels-partition-share",
         "dirichlet-unequal-partitions", "three-ranks"],  # fmt: skip
)
def test_gradient_weight(
    partition: str, sizes: list[int], lengths: list[int] | None, expected: list[float]
) -> None:
    got = [
        gradient_weight(
            partition,
            rank=r,
            batch_sizes=np.array(sizes),
            partition_lengths=None if lengths is None else np.array(lengths),
        )
        for r in range(len(sizes))
    ]
    assert got == pytest.approx(expected)
    assert sum(got) == pytest.approx(1.0)
