"""The console scripts run the programs of jobs/ and data_tools/ (installed by the setup)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent


@pytest.mark.parametrize(
    ("script", "expect"),
    [
        ("hethpc-train", "--run-dir"),
        ("hethpc-report", "run directories"),
        ("hethpc-convert", "cifar"),
        ("hethpc-inspect", "--partition"),
    ],
    ids=["train", "report", "convert", "inspect"],
)
def test_each_console_script_runs_its_program(script: str, expect: str) -> None:
    path = BIN / script
    assert path.exists(), f"{path} is missing: run 'make setup' (pip install -e .)"
    proc = subprocess.run([str(path), "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and expect in proc.stdout, proc.stdout + proc.stderr


def test_a_user_error_through_a_console_script_is_one_line(tmp_path: Path) -> None:
    proc = subprocess.run([str(BIN / "hethpc-train"), "--epcohs", "3"], capture_output=True,
                          text=True, timeout=60, cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "did you mean --epochs?" in proc.stderr and "Traceback" not in proc.stderr
