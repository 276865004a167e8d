"""The run directory: hethpc writes only where it may, and never loses a user's file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hethpc.cli import train as train_job
from hethpc.train.keep.rundir import MARKER, RunDirError, claim, is_run_dir, next_run_dir

USER_FILES = {
    "config.json": b'{"mine": true}\n',
    "summary.json": b"my own summary\n",
    "metrics/rank0.jsonl": b"my metrics\n",
    "notes.txt": b"\x00\x01 binary notes",
}


def _user_dir(path: Path) -> Path:
    for name, data in USER_FILES.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_bytes(data)
    return path


def _unchanged(path: Path) -> None:
    for name, data in USER_FILES.items():
        assert (path / name).read_bytes() == data, name
    assert not (path / MARKER).exists()


@pytest.mark.parametrize(
    ("resume", "overwrite"),
    [(False, False), (False, True), (True, False), (True, True)],
    ids=["fresh", "overwrite", "resume", "both"],
)
def test_a_directory_of_user_files_is_refused_untouched(
    tmp_path: Path, resume: bool, overwrite: bool
) -> None:
    d = _user_dir(tmp_path / "mine")
    with pytest.raises(RunDirError, match=f"{d} is not empty and was not made by hethpc"):
        claim(d, digest="x", resume=resume, overwrite=overwrite)
    _unchanged(d)


def test_new_and_empty_directories_are_claimed_marker_first(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    for d in (tmp_path / "new" / "deeper", tmp_path / "empty"):
        claim(d, digest="abc", resume=False, overwrite=False)
        assert is_run_dir(d) and '"config_digest": "abc"' in (d / MARKER).read_text()


def test_overwrite_replaces_only_hethpcs_own_files(tmp_path: Path) -> None:
    d = tmp_path / "run"
    claim(d, digest="a", resume=False, overwrite=False)
    (d / "config.json").write_text("{}")
    (d / "checkpoints").mkdir()
    (d / "checkpoints" / "ckpt-000000010.pt").write_bytes(b"old")
    (d / "my-notes.txt").write_bytes(b"keep me")
    (d / "plots").mkdir()
    (d / "plots" / "mine.png").write_bytes(b"png")
    with pytest.raises(RunDirError, match="already holds a run; pass --resume"):
        claim(d, digest="b", resume=False, overwrite=False)
    assert (d / "checkpoints" / "ckpt-000000010.pt").exists()
    claim(d, digest="b", resume=False, overwrite=True)
    assert not (d / "config.json").exists() and not (d / "checkpoints").exists()
    assert (d / "my-notes.txt").read_bytes() == b"keep me"
    assert (d / "plots" / "mine.png").read_bytes() == b"png"


def test_overwrite_keeps_user_files_in_hethpcs_folders_and_clears_csv_and_tensorboard(
    tmp_path: Path,
) -> None:
    d = tmp_path / "run"
    claim(d, digest="a", resume=False, overwrite=False)
    ours = ["config.json", "metrics/rank0.jsonl", "checkpoints/ckpt-000000010.pt",
            "checkpoints/ckpt-000000010.pt.sha256", "checkpoints/ckpt-000000020.pt.corrupt",
            "checkpoints/ckpt-000000020.pt.sha256.corrupt", "heartbeat/rank1.json",
            "heartbeat/stacks-rank0.txt", "csv/metrics.csv",
            "tensorboard/events.out.tfevents.1.host.2.0"]  # fmt: skip
    theirs = ["metrics/my-notes.txt", "checkpoints/pretrained.pt", "csv/mine.csv"]
    for name in ours + theirs:
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        (d / name).write_bytes(name.encode())
    claim(d, digest="b", resume=False, overwrite=True)
    assert [n for n in ours if (d / n).exists()] == []  # an old CSV would get the new rows
    assert [(d / n).read_bytes() for n in theirs] == [n.encode() for n in theirs]
    assert not (d / "heartbeat").exists() and not (d / "tensorboard").exists()


def test_resume_keeps_the_run(tmp_path: Path) -> None:
    d = tmp_path / "run"
    claim(d, digest="a", resume=False, overwrite=False)
    (d / "config.json").write_text("{}")
    claim(d, digest="a", resume=True, overwrite=False)
    assert (d / "config.json").read_text() == "{}"


def test_a_file_is_not_a_run_directory(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(RunDirError, match="is a file"):
        claim(tmp_path / "f", digest="a", resume=False, overwrite=False)


def test_a_directory_that_cannot_be_written_is_named(tmp_path: Path) -> None:
    # Below a file (mkdir fails), or read-only for a user who is not root: one RunDirError
    # naming the directory, not an OSError traceback.
    (tmp_path / "file").write_text("mine")
    with pytest.raises(RunDirError, match="run-dir .*file/run: cannot write into it"):
        claim(tmp_path / "file" / "run", digest="x", resume=False, overwrite=False)
    assert (tmp_path / "file").read_text() == "mine"
    if os.geteuid() != 0:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o555)
        try:
            with pytest.raises(RunDirError, match="cannot write into it.*Permission denied"):
                claim(ro, digest="x", resume=False, overwrite=False)
        finally:
            ro.chmod(0o755)


def test_next_run_dir_counts_up(tmp_path: Path) -> None:
    assert next_run_dir(tmp_path) == tmp_path / "run-1"
    (tmp_path / "run-1").mkdir()
    (tmp_path / "run-2").write_text("")
    assert next_run_dir(tmp_path) == tmp_path / "run-3"


def _job(tmp_path: Path, *extra: str) -> list[str]:
    return [
        "--samples", "600", "--batch-size", "50", "--epochs", "1", "--max-steps", "3",
        "--model", "mlp", "--cache-dir", str(tmp_path / "cache"), "--progress", "false",
        *extra,
    ]  # fmt: skip


def test_the_job_leaves_a_users_directory_byte_identical(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = _user_dir(tmp_path / "mine")
    for extra in ([], ["--overwrite"], ["--resume"]):
        with pytest.raises(SystemExit) as e:
            train_job.main(_job(tmp_path, "--run-dir", str(d), *extra))
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert "was not made by hethpc" in err and "Traceback" not in err, err
        _unchanged(d)


def test_a_run_without_run_dir_gets_a_new_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    for n in (1, 2):
        assert train_job.main(_job(tmp_path)) == 0
        assert f"run directory runs/run-{n}" in capsys.readouterr().out
        assert is_run_dir(tmp_path / "runs" / f"run-{n}")
