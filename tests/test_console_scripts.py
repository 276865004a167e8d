"""The console scripts (installed by the setup) and jobs/, data_tools/ run hethpc.cli's programs."""

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


@pytest.mark.parametrize(
    ("script", "argv", "hint"),
    [
        ("hethpc-train", ["--epoch", "2"], "arguments: --epoch 2; did you mean --epochs?"),
        ("hethpc-report", ["run", "--ou", "x"], "arguments: --ou x; did you mean --out?"),
        ("hethpc-convert", ["synthetic", "--out", "o", "--sampl", "5"], "did you mean --samples?"),
        ("hethpc-inspect", ["data", "--verif"], "did you mean --verify?"),
        ("hethpc-testbed", ["up", "--nod", "cpu=1"], "did you mean --node or --nodes?"),
    ],
    ids=["train", "report", "convert", "inspect", "testbed"],
)  # fmt: skip
def test_no_console_script_takes_an_abbreviated_flag(
    tmp_path: Path, script: str, argv: list[str], hint: str
) -> None:
    # argparse's default reads a flag's beginning as the flag: --epoch 2 ran as --epochs 2.
    proc = subprocess.run([str(BIN / script), *argv], capture_output=True, text=True, timeout=60,
                          cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 2 and hint in proc.stderr, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr


ROOT = Path(__file__).resolve().parents[1]
PROGRAMS = sorted(
    p.relative_to(ROOT).as_posix()
    for d in ("benchmarks", "jobs", "data_tools")
    for p in (ROOT / d).glob("*.py")
    if not p.name.startswith("_")
)


@pytest.mark.parametrize("program", PROGRAMS)
def test_every_program_prints_its_help(program: str) -> None:
    # A stray '%' in an argparse help string only fails when someone asks for --help.
    proc = subprocess.run([sys.executable, str(ROOT / program), "--help"], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)  # fmt: skip
    assert proc.returncode == 0 and "usage:" in proc.stdout, proc.stdout + proc.stderr
