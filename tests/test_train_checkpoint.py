"""Checkpoints on disk: atomic, verified by sha256, the last K kept, corrupt ones skipped."""

from __future__ import annotations

import os
import pickle
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from hethpc.train import CheckpointError
from hethpc.train.keep.checkpoint import CheckpointManager, CheckpointWarning, decode, encode


def _state(step: int) -> dict:
    return {
        "step": step,
        "w": torch.arange(6, dtype=torch.float32).reshape(2, 3) * step,
        "sizes": np.array([3, 5], dtype=np.int64),
        "ewma": np.float64(0.5),
        "nested": [(1, 2), {"a": None}],
    }


def test_round_trip_keeps_types(tmp_path: Path) -> None:
    m = CheckpointManager(tmp_path, keep=2)
    m.save(_state(3), 3)
    got = m.read(3)
    assert torch.equal(got["w"], _state(3)["w"])
    np.testing.assert_array_equal(got["sizes"], [3, 5])
    assert got["sizes"].dtype == np.int64
    assert got["ewma"] == 0.5 and got["nested"] == [(1, 2), {"a": None}]


def test_keeps_only_the_last_k(tmp_path: Path) -> None:
    m = CheckpointManager(tmp_path, keep=2)
    for s in (10, 20, 30):
        m.save(_state(s), s)
    assert m.steps() == [20, 30]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "ckpt-000000020.pt",
        "ckpt-000000020.pt.sha256",
        "ckpt-000000030.pt",
        "ckpt-000000030.pt.sha256",
    ]
    assert m.load_latest()[0] == 30  # type: ignore[index]


def _flip_byte(p: Path) -> None:
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0x01
    p.write_bytes(bytes(data))


def _truncate(p: Path) -> None:
    p.write_bytes(p.read_bytes()[:100])


def _drop_sidecar(p: Path) -> None:
    p.with_name(p.name + ".sha256").unlink()


@pytest.mark.parametrize(
    ("damage", "match"),
    [(_flip_byte, "sha256"), (_truncate, "sha256"), (_drop_sidecar, "sidecar")],
    ids=["flipped-byte", "truncated", "no-sidecar"],
)
def test_damaged_latest_falls_back_to_previous_with_warning(tmp_path: Path, damage, match) -> None:
    m = CheckpointManager(tmp_path, keep=3)
    m.save(_state(1), 1)
    m.save(_state(2), 2)
    damage(m.path(2))
    with pytest.warns(CheckpointWarning, match=match):
        step, state = m.load_latest()  # type: ignore[misc]
    assert step == 1 and torch.equal(state["w"], _state(1)["w"])


def test_a_skipped_checkpoint_is_set_aside_and_keeps_no_slot(tmp_path: Path) -> None:
    m = CheckpointManager(tmp_path, keep=2)
    for step in (1, 2, 3):
        m.save(_state(step), step)
    _truncate(m.path(3))
    with pytest.warns(CheckpointWarning, match="set aside as ckpt-000000003.pt.corrupt"):
        assert m.load_latest()[0] == 2  # type: ignore[index]
    assert (tmp_path / "ckpt-000000003.pt.corrupt").is_file() and m.steps() == [2]
    m.save(_state(4), 4)  # the resumed run's next checkpoint: the valid 2 stays beside it
    assert m.steps() == [2, 4]


def test_all_damaged_raises_naming_the_files(tmp_path: Path) -> None:
    m = CheckpointManager(tmp_path)
    m.save(_state(1), 1)
    _truncate(m.path(1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CheckpointWarning)
        with pytest.raises(CheckpointError, match="ckpt-000000001.pt"):
            m.load_latest()


def test_empty_directory_has_no_checkpoint(tmp_path: Path) -> None:
    assert CheckpointManager(tmp_path / "none").load_latest() is None


class _Evil:
    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (os.system, ("touch pwned",))


def test_code_in_a_checkpoint_never_runs(tmp_path: Path) -> None:
    m = CheckpointManager(tmp_path)
    m.save(_state(1), 1)
    # A malicious file with a matching sidecar: the checksum passes, weights_only refuses it.
    payload = pickle.dumps({"x": _Evil()})
    import hashlib

    torch_file = m.path(2)
    torch_file.write_bytes(payload)
    torch_file.with_name(torch_file.name + ".sha256").write_text(
        hashlib.sha256(payload).hexdigest() + "  x\n"
    )
    with pytest.raises(CheckpointError, match="cannot be loaded safely"):
        m.read(2)
    with pytest.warns(CheckpointWarning):
        assert m.load_latest()[0] == 1  # type: ignore[index]
    assert not (tmp_path / "pwned").exists() and not Path("pwned").exists()


def test_no_temporary_files_left(tmp_path: Path) -> None:
    m = CheckpointManager(tmp_path)
    m.save(_state(1), 1)
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize(
    "value",
    [np.zeros((2, 2), np.float32), np.arange(3, dtype=np.uint8), [np.int64(4)], (np.bool_(True),)],
    ids=["float32", "uint8", "list-of-scalar", "tuple-of-bool"],
)
def test_encode_decode(value) -> None:
    got = decode(encode(value))
    if isinstance(value, np.ndarray):
        np.testing.assert_array_equal(got, value)
        assert got.dtype == value.dtype
    else:
        assert got == type(value)(v.item() for v in value)


def test_object_arrays_are_refused() -> None:
    with pytest.raises(CheckpointError, match="object arrays"):
        encode(np.array([{}], dtype=object))


def test_keep_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="keep"):
        CheckpointManager(tmp_path, keep=0)


def test_rng_state_round_trips_through_a_checkpoint_with_or_without_cuda() -> None:
    from hethpc.train.keep.rng import get_rng_state, set_rng_state

    state = get_rng_state()
    assert "cuda" in state  # None here: this process never used CUDA
    again = decode(encode(state))
    before = torch.rand(3)
    set_rng_state(again)
    assert torch.equal(torch.rand(3), before)
    older = {k: v for k, v in again.items() if k != "cuda"}  # checkpoints before the key
    set_rng_state(older)
    assert torch.equal(torch.rand(3), before)
