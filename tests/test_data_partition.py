"""Partitioners: pure functions of (labels, world size, rank, seed), checked without MPI."""

from __future__ import annotations

import re

import numpy as np
import pytest

from hethpc.data import PartitionError, make_partitioner
from hethpc.data.partition import (
    DirichletPartitioner,
    IIDPartitioner,
    LabelSkewPartitioner,
    Partitioner,
    SelDPPartitioner,
)

LABELS = np.random.default_rng(1).integers(0, 10, 1000)

CASES = [
    ("iid", IIDPartitioner(), 3),
    ("iid-7", IIDPartitioner(), 7),
    ("seldp", SelDPPartitioner(), 4),
    ("label_skew-k1", LabelSkewPartitioner(labels_per_rank=1), 10),
    ("label_skew-k3", LabelSkewPartitioner(labels_per_rank=3), 4),
    ("label_skew-k2-uneven", LabelSkewPartitioner(labels_per_rank=2), 6),
    ("dirichlet-0.1", DirichletPartitioner(alpha=0.1, min_size=5), 4),
    ("dirichlet-100", DirichletPartitioner(alpha=100.0, min_size=5), 4),
]
IDS = [c[0] for c in CASES]


@pytest.mark.parametrize(("name", "part", "n"), CASES, ids=IDS)
def test_every_rank_computes_the_same_assignment(name: str, part: Partitioner, n: int) -> None:
    whole = part.all_indices(LABELS, n, seed=5)
    for r in range(n):
        np.testing.assert_array_equal(part.indices(LABELS, n, r, seed=5), whole[r])
    other = part.all_indices(LABELS, n, seed=6)
    changed = any(not np.array_equal(a, b) for a, b in zip(whole, other, strict=True))
    # Label skew with one holder per label is the same whatever the seed.
    assert changed or name == "label_skew-k1"


@pytest.mark.parametrize(("name", "part", "n"), CASES, ids=IDS)
def test_no_sample_lost_and_disjoint_where_promised(name: str, part: Partitioner, n: int) -> None:
    parts = part.all_indices(LABELS, n, seed=0)
    if part.disjoint:
        allidx = np.concatenate(parts)
        assert len(allidx) == len(np.unique(allidx)), "shares overlap"
        np.testing.assert_array_equal(np.sort(allidx), np.arange(len(LABELS)))
    else:  # SelDP: every rank holds the whole dataset, rotated
        for p in parts:
            np.testing.assert_array_equal(np.sort(p), np.arange(len(LABELS)))


def test_iid_shares_are_equal_within_one() -> None:
    sizes = [len(p) for p in IIDPartitioner().all_indices(LABELS, 7, 0)]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == 1000


def test_seldp_rank_r_starts_at_chunk_r() -> None:
    parts = SelDPPartitioner().all_indices(LABELS, 4, 0)
    chunks = np.array_split(parts[0], 4)
    for r in range(4):
        np.testing.assert_array_equal(parts[r][: len(chunks[r])], chunks[r])


@pytest.mark.parametrize(
    ("k", "n", "expected"),
    [
        (1, 10, [[c] for c in range(10)]),
        (3, 4, [[0, 1, 2], [3, 4, 5], [6, 7, 8], [0, 1, 9]]),
        (2, 6, [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [0, 1]]),
    ],
    ids=["k1-n10", "k3-n4-wraps", "k2-n6-shared"],
)
def test_label_skew_holds_k_labels(k: int, n: int, expected: list[list[int]]) -> None:
    p = LabelSkewPartitioner(labels_per_rank=k)
    assert p.rank_labels(n, 10) == expected
    for r, idx in enumerate(p.all_indices(LABELS, n, 0)):
        assert sorted(set(LABELS[idx].tolist())) == expected[r]


# (k, ranks, the classes named, the smallest k that covers all 10 classes on that many ranks)
UNCOVERED = [
    (2, 2, "classes [4, 5, 6, 7, 8, 9]", 5),
    (1, 3, "classes [3, 4, 5, 6, 7, 8, 9]", 4),
    (3, 3, "class 9", 4),
    (1, 9, "class 9", 2),
    (1, 1, "classes [1, 2, 3, 4, 5, 6, 7, 8, 9]", 10),
]
UNCOVERED_IDS = [f"k{k}-n{n}" for k, n, _, _ in UNCOVERED]


@pytest.mark.parametrize(("k", "n", "classes", "fix"), UNCOVERED, ids=UNCOVERED_IDS)
def test_label_skew_refuses_classes_on_no_rank(k: int, n: int, classes: str, fix: int) -> None:
    ranks = f"{n} rank" + ("" if n == 1 else "s")
    lost = int(np.isin(LABELS, range(n * k, 10)).sum())
    match = (rf"labels_per_rank={k} on {ranks} leaves {re.escape(classes)} on no rank "
             rf"\({lost} of 1000 samples would never be trained on\); --labels-per-rank {fix} "
             rf"or more covers all 10 classes on {ranks}, or pass allow_uncovered=True")
    with pytest.raises(PartitionError, match=match):
        LabelSkewPartitioner(labels_per_rank=k).all_indices(LABELS, n, 0)
    with pytest.raises(PartitionError, match=match):
        make_partitioner("labels", labels_per_rank=k).indices(LABELS, n, 0, 0)
    # The k it names is the smallest that covers every class.
    LabelSkewPartitioner(labels_per_rank=fix).all_indices(LABELS, n, 0)
    if fix > 1:
        with pytest.raises(PartitionError, match="on no rank"):
            LabelSkewPartitioner(labels_per_rank=fix - 1).all_indices(LABELS, n, 0)


@pytest.mark.parametrize(("k", "n", "classes", "fix"), UNCOVERED, ids=UNCOVERED_IDS)
def test_label_skew_allow_uncovered_leaves_them_out(k: int, n: int, classes: str, fix: int) -> None:
    held_labels = set(range(n * k))
    for part in (LabelSkewPartitioner(labels_per_rank=k, allow_uncovered=True),
                 make_partitioner("labels", labels_per_rank=k, allow_uncovered=True)):
        held = np.concatenate(part.all_indices(LABELS, n, 0))
        assert set(LABELS[held].tolist()) == held_labels
        assert len(held) == len(np.unique(held)) == int(np.isin(LABELS, list(held_labels)).sum())


def test_label_skew_ignores_classes_without_samples() -> None:
    labels = LABELS % 4  # classes 4..9 of 10 have no samples: nothing to leave out
    parts = LabelSkewPartitioner(labels_per_rank=1, num_classes=10).all_indices(labels, 4, 0)
    assert [sorted(set(labels[p].tolist())) for p in parts] == [[0], [1], [2], [3]]


def test_label_skew_refuses_labels_outside_num_classes() -> None:
    with pytest.raises(PartitionError, match=r"labels \[8, 9\] are outside 0..7 \(num_classes=8\)"):
        LabelSkewPartitioner(labels_per_rank=4, num_classes=8).all_indices(LABELS, 2, 0)


@pytest.mark.parametrize("alpha", [0.001, 0.05, 0.5], ids=lambda a: f"alpha-{a}")
@pytest.mark.parametrize("seed", range(5), ids=lambda s: f"seed-{s}")
def test_dirichlet_leaves_no_class_on_no_rank(alpha: float, seed: int) -> None:
    # A class of one sample, and shares so skewed that most classes sit on one rank (assign,
    # not all_indices: a rank may get nothing here, which all_indices would refuse).
    labels = np.concatenate([LABELS[:200], [10]])
    parts = DirichletPartitioner(alpha=alpha, min_size=0).assign(labels, 8, seed)
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(len(labels)))


def test_dirichlet_alpha_controls_skew() -> None:
    def skew(alpha: float) -> float:
        parts = DirichletPartitioner(alpha=alpha, min_size=1).all_indices(LABELS, 4, 0)
        h = np.array([np.bincount(LABELS[p], minlength=10) / len(p) for p in parts])
        return float(np.abs(h - np.bincount(LABELS) / len(LABELS)).sum(1).mean())

    assert skew(0.1) > 3 * skew(100.0)
    parts = DirichletPartitioner(alpha=0.1, min_size=20).all_indices(LABELS, 4, 0)
    assert min(len(p) for p in parts) >= 20


BAD = [
    ("empty-rank", lambda: IIDPartitioner().indices(np.zeros(2, int), 3, 0, 0),
     r"leaves rank\(s\) \[2\] with no samples"),
    ("dirichlet-min-size", lambda: DirichletPartitioner(alpha=0.05, min_size=200,
                                                        max_retries=3).indices(LABELS, 8, 0, 0),
     "fewer than min_size=200 samples in 3 draws"),
    ("dirichlet-alpha", lambda: DirichletPartitioner(alpha=0.0), "alpha must be > 0"),
    ("k-too-large", lambda: LabelSkewPartitioner(labels_per_rank=11).indices(LABELS, 2, 0, 0),
     "exceeds the 10 classes of the dataset; use at most 10"),
    ("dirichlet-covers-always", lambda: make_partitioner("dirichlet", allow_uncovered=True),
     r"does not take \['allow_uncovered'\]"),
    ("rank-out-of-range", lambda: IIDPartitioner().indices(LABELS, 2, 2, 0), "rank 2 is outside"),
    ("unknown-name", lambda: make_partitioner("random"), "unknown partitioner 'random'"),
    ("bad-setting", lambda: make_partitioner("iid", alpha=1), "does not take"),
]


@pytest.mark.parametrize(("name", "call", "match"), BAD, ids=[b[0] for b in BAD])
def test_bad_input(name: str, call: object, match: str) -> None:
    with pytest.raises(PartitionError, match=match):
        call()  # type: ignore[operator]


def test_make_partitioner_by_name() -> None:
    p = make_partitioner("labels", labels_per_rank=2)
    assert isinstance(p, LabelSkewPartitioner) and p.labels_per_rank == 2
    assert p.allow_uncovered is False
    p = make_partitioner("labels", labels_per_rank=2, allow_uncovered=True)
    assert isinstance(p, LabelSkewPartitioner) and p.allow_uncovered is True
    assert isinstance(make_partitioner("dirichlet", alpha=0.3, min_size=1), DirichletPartitioner)
    with pytest.raises(PartitionError, match=r"unknown partitioner 'label_skew'; choose one of"):
        make_partitioner("label_skew")  # the setting's name, "labels", is the one name


def test_the_partitioners_are_named_as_the_partition_setting_and_the_inspector_name_them() -> None:
    from hethpc.cli.inspect_dataset import PARTITIONS
    from hethpc.data.partition import PARTITIONERS
    from hethpc.train import TrainConfig

    choices = TrainConfig.__dataclass_fields__["partition"].metadata["choices"]
    assert tuple(PARTITIONERS) == PARTITIONS == tuple(choices)
