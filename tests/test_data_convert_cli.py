"""convert.py's answer to a user's mistake: one line on stderr, exit code 2, nothing written."""

from __future__ import annotations

import gzip
import os
import pickle
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from hethpc.cli import convert
from hethpc.data import sources

ROOT = Path(__file__).resolve().parents[1]

RNG = np.random.default_rng(2)


class Evil:
    def __reduce__(self) -> tuple[object, ...]:
        return os.system, (f"touch {Path.cwd() / 'marker'}",)


def _npz(d: Path, **arrays: np.ndarray) -> str:
    arrays = {"x": RNG.standard_normal((6, 2)), "y": np.arange(6) % 3, **arrays}
    np.savez(d / "a.npz", **arrays)  # type: ignore[arg-type]
    return str(d / "a.npz")


def _write(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


def _idx(d: Path, shape: tuple[int, ...], data: bytes, *, gz: bool = False) -> str:
    raw = bytes([0, 0, 8, len(shape)]) + b"".join(struct.pack(">I", s) for s in shape) + data
    return _write(d / "imgs", gzip.compress(raw) if gz else raw)


def _labels(d: Path, n: int) -> str:
    return _write(d / "labs", bytes([0, 0, 8, 1]) + struct.pack(">I", n) + bytes(n))


# (id, argv from the tmp dir, the line's text after "convert.py: error: ")
MISTAKES: list[tuple[str, Callable[[Path], list[str]], str]] = [
    ("missing-file", lambda d: ["npz", str(d / "nope.npz")],
     "{d}/nope.npz: No such file or directory; check that the path exists"),
    ("npz-garbage", lambda d: ["npz", _write(d / "g.npz", b"\x00garbage")],
     "{d}/g.npz: is not an .npz (zip) archive; expected an archive saved by numpy.savez"),
    ("npz-key", lambda d: ["npz", _npz(d), "--x-key", "feats"],
     "{d}/a.npz: has no array ['feats']; it holds ['x', 'y']"),
    ("npz-objects", lambda d: ["npz", _npz(d, x=np.array([None, None], object))],
     "{d}/a.npz: array 'x' holds Python objects (dtype object), refused"),
    ("npy-garbage", lambda d: ["npy", _write(d / "x.npy", b"junk"), _write(d / "y.npy", b"")],
     "{d}/x.npy: has no .npy header; expected an array saved by numpy.save"),
    ("idx-truncated", lambda d: ["idx", _idx(d, (4, 2, 2), bytes(10)), _labels(d, 4)],
     "{d}/imgs: is truncated: its header claims shape (4, 2, 2) of uint8 (16 data bytes) but it "
     "holds 10 data bytes"),
    ("idx-huge-gzip", lambda d: ["idx", _idx(d, (10**9, 28, 28), bytes(99), gz=True),
                                 _labels(d, 4)],
     "{d}/imgs: is truncated: its header claims shape (1000000000, 28, 28) of uint8 "
     "(784000000000 data bytes) but it holds 99 decompressed data bytes"),
    ("idx-not-idx", lambda d: ["idx", _write(d / "imgs", b"\x1f\x8bnot gzip"), _labels(d, 4)],
     "{d}/imgs: corrupt gzip stream"),
    ("idx-count", lambda d: ["idx", _idx(d, (3, 2), bytes(6)), _labels(d, 4)],
     "{d}/imgs: the image array holds 3 samples but {d}/labs: the label array holds 4 labels"),
    ("cifar-code", lambda d: ["cifar", _write(d / "data_batch_1", pickle.dumps({b"x": Evil()}))],
     "{d}/data_batch_1: names the forbidden global " + os.system.__module__ + ".system"),
    ("cifar-directory", lambda d: ["cifar", str(d)], "{d}: Is a directory"),
    ("shard-samples-0", lambda d: ["synthetic", "--shard-samples", "0"],
     "--shard-samples 0: must be >= 1; pass the number of samples per shard file"),
    ("chunk-samples-0", lambda d: ["synthetic", "--chunk-samples", "-3"],
     "--chunk-samples -3: must be >= 1"),
    ("num-classes-0", lambda d: ["npz", _npz(d), "--num-classes", "0"],
     "--num-classes 0: must be >= 1"),
    ("negative-labels", lambda d: ["npz", _npz(d, y=np.array([0, 1, -1, 2, -1, -3]))],
     "{d}/a.npz: array 'y': negative labels (-3: 1 sample, -1: 2 samples); class labels count "
     "from 0, and no --num-classes covers a negative one: map the labels to 0, 1, 2, ... first"),
    ("labels-beyond-num-classes", lambda d: ["npz", _npz(d), "--num-classes", "2"],
     "{d}/a.npz: array 'y': labels beyond --num-classes 2 (0..1): 2: 2 samples; pass "
     "--num-classes 3 if they are classes, or drop those samples"),
    ("labels-beyond-mnist", lambda d: ["idx", _idx(d, (2, 2), bytes(4)),
                                       _write(d / "labs", bytes([0, 0, 8, 1, 0, 0, 0, 2, 3, 12]))],
     "{d}/labs: labels beyond the 10 classes of MNIST (0..9): 12: 1 sample; pass --num-classes "
     "13 if they are classes"),
    ("classes-0", lambda d: ["synthetic", "--classes", "0"], "--classes 0: must be >= 1"),
    ("samples-0", lambda d: ["synthetic", "--samples", "0"], "--samples 0: must be >= 1"),
    ("shape-0", lambda d: ["synthetic", "--shape", "3", "0"],
     "--shape 3 0: every size must be >= 1"),
    ("mnist1d-samples", lambda d: ["mnist1d", "--samples", "5"], "--samples 5: must be >= 10"),
    ("seed-negative", lambda d: ["synthetic", "--seed", "-1"], "--seed -1: must be >= 0"),
    ("fraction-1", lambda d: ["synthetic", "--test-fraction", "1"],
     "--test-fraction 1.0: must be finite and in [0, 1); pass e.g. 0.2, or 0 for no test split"),
    ("fraction-negative", lambda d: ["npz", _npz(d), "--test-fraction", "-0.1"],
     "--test-fraction -0.1: must be finite and in [0, 1)"),
    ("fraction-nan", lambda d: ["synthetic", "--test-fraction", "nan"],
     "--test-fraction nan: must be finite"),
    ("fraction-inf", lambda d: ["digits", "--test-fraction", "inf"],
     "--test-fraction inf: must be finite"),
    ("fraction-empties-test", lambda d: ["npz", _npz(d), "--test-fraction", "0.01"],
     "--test-fraction 0.01: of 6 samples leaves 6 to train and 0 to test"),
    ("split-and-fraction", lambda d: ["synthetic", "--split", "val", "--test-fraction", "0.3"],
     "--split val: writes one split, so --test-fraction 0.3 cannot hold out a test split"),
    ("split-path", lambda d: ["synthetic", "--split", "../x"], "--split '../x': not a directory"),
    ("cifar-test-and-fraction", lambda d: ["cifar", "b1", "--test", "b2", "--test-fraction", "0.1"],
     "--test-fraction 0.1: the --test files are the test split already"),
]


@pytest.mark.parametrize(("name", "argv", "line"), MISTAKES, ids=[m[0] for m in MISTAKES])
def test_user_mistake_is_one_line_and_exit_2(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    argv: Callable[[Path], list[str]],
    line: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    assert convert.main([*argv(tmp_path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"convert.py: error: {line.format(d=tmp_path)}"), err
    assert err.count("\n") == 1 and err.endswith("\n"), err
    assert "; " in err, "the line says what was expected or how to fix it"
    assert not out.exists(), "nothing is written"
    assert not (tmp_path / "marker").exists()


BAD_COMMAND_LINES = [
    ("not-a-number", ["synthetic", "--shard-samples", "abc", "--out", "o"],
     "convert.py: error: argument --shard-samples: invalid int value: 'abc'; "
     "see convert.py synthetic --help"),
    ("no-out", ["npz", "a.npz"],
     "convert.py: error: the following arguments are required: --out; see convert.py npz --help"),
    ("no-source", [], "convert.py: error: the following arguments are required: source; "
     "see convert.py --help"),
    # An abbreviation was read as the flag it begins: a typo passed unnoticed.
    ("abbreviated-flag", ["synthetic", "--out", "o", "--sampl", "5"],
     "convert.py: error: unrecognized arguments: --sampl 5; did you mean --samples?; "
     "see convert.py --help"),
]


@pytest.mark.parametrize(("name", "argv", "line"), BAD_COMMAND_LINES,
                         ids=[b[0] for b in BAD_COMMAND_LINES])
def test_bad_command_line_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], name: str, argv: list[str], line: str
) -> None:
    with pytest.raises(SystemExit) as e:
        convert.main(argv)
    assert e.value.code == 2
    assert capsys.readouterr().err == line + "\n"


def test_bad_test_file_leaves_no_train_split(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = tmp_path / "data_batch_1"
    with open(good, "wb") as f:
        pickle.dump({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 1]}, f)
    bad = _write(tmp_path / "test_batch", b"nope")
    out = tmp_path / "out"
    assert convert.main(["cifar", str(good), "--test", bad, "--out", str(out)]) == 2
    assert f"{bad}: is not a CIFAR python batch" in capsys.readouterr().err
    assert not out.exists()


def test_a_real_bug_still_shows_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object, **kwargs: object) -> object:
        raise RuntimeError("a bug in the reader")

    monkeypatch.setattr(sources, "read_npz", broken)
    with pytest.raises(RuntimeError, match="a bug in the reader"):
        convert.main(["npz", _npz(tmp_path), "--out", str(tmp_path / "out")])


def test_script_prints_one_line_and_exits_2(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, str(ROOT / "data_tools" / "convert.py"), "idx",
                        str(tmp_path / "imgs"), str(tmp_path / "labs"), "--out",
                        str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 2, r.stderr
    assert r.stderr == (f"convert.py: error: {tmp_path}/imgs: No such file or directory; check "
                        "that the path exists and that its permissions allow this\n")


def test_a_stray_label_is_named_with_every_label_count(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    y = np.array([0, 1, 2, 3] * 5 + [7])
    path = _npz(tmp_path, x=RNG.standard_normal((21, 2)), y=y)
    assert convert.main(["npz", path, "--out", str(tmp_path / "o")]) == 0
    err = capsys.readouterr().err
    assert err == (
        f"convert.py: warning: {path}: array 'y': the largest label, 7, makes 8 classes, but 3 "
        "of them have no samples (labels 4, 5, 6); label counts: 0: 5 samples, 1: 5 samples, "
        "2: 5 samples, 3: 5 samples, 7: 1 sample. If a label is stray, drop its samples; if the "
        "classes are right, pass --num-classes 8\n"
    )
    assert convert.main(["npz", path, "--out", str(tmp_path / "p"), "--num-classes", "8"]) == 0
    assert capsys.readouterr().err == ""


def test_through_hethpc_convert_errors_name_the_command_and_its_flags(tmp_path: Path) -> None:
    args = ["synthetic", "--samples", "20", "--out", str(tmp_path / "s")]
    run = [sys.executable, "-c", "import sys; sys.argv[0] = 'hethpc-convert'; "
           "from hethpc.cli.convert import main; sys.exit(main())"]  # fmt: skip
    assert subprocess.run([*run, *args], capture_output=True).returncode == 0
    again = subprocess.run([*run, *args], capture_output=True, text=True)
    assert (again.returncode, again.stderr) == (
        2, f"hethpc-convert: error: {tmp_path}/s/train already exists; pass --force to replace "
        "it\n"
    )
