"""The validation split held out of the training samples (no MPI)."""

from __future__ import annotations

import numpy as np
import pytest

from hethpc.data import ArrayDataset, DatasetError
from hethpc.data.holdout import holdout, holdout_indices


def test_the_split_is_a_partition_of_the_given_size_and_a_function_of_the_seed() -> None:
    kept, held = holdout_indices(1000, 0.1, seed=3)
    assert len(held) == 100 and len(kept) == 900
    assert np.array_equal(np.sort(np.concatenate([kept, held])), np.arange(1000))
    assert np.all(np.diff(kept) > 0) and np.all(np.diff(held) > 0)
    again = holdout_indices(1000, 0.1, seed=3)
    assert np.array_equal(again[1], held)
    assert not np.array_equal(holdout_indices(1000, 0.1, seed=4)[1], held)


def test_no_split_keeps_everything() -> None:
    kept, held = holdout_indices(10, 0.0, seed=0)
    assert np.array_equal(kept, np.arange(10)) and len(held) == 0


def test_a_split_that_empties_a_side_is_named() -> None:
    with pytest.raises(DatasetError, match=r"val_fraction"):
        holdout_indices(4, 0.01, seed=0)


def test_the_held_samples_are_read_with_their_labels() -> None:
    x = np.arange(40, dtype=np.float32).reshape(20, 2)
    data = ArrayDataset(x, np.arange(20) % 4, 4)
    kept, val = holdout(data, 0.25, seed=1)
    assert len(val) == 5 and len(kept) == 15 and val.num_classes == 4
    held = np.setdiff1d(np.arange(20), kept)
    assert np.array_equal(val.x, x[held]) and np.array_equal(val.y, held % 4)
