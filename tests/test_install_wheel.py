"""A wheel built from the repository installs commands that work without the source tree.

The wheel goes into a fresh virtual environment. Its dependencies (torch, Horovod, ...) come
from this interpreter's site-packages, offline: a folder of links to everything there but
hethpc itself (an editable install of the checkout would be the source tree again), named by a
``.pth`` file of the new environment. The commands then run from a folder outside the
repository, without ``PYTHONPATH``.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# What setup.cfg builds the package from (README.md is its long description).
PROJECT_FILES = ("pyproject.toml", "setup.cfg", "README.md", "LICENSE")

pytestmark = pytest.mark.skipif(
    not all(importlib.util.find_spec(m) for m in ("venv", "pip", "setuptools")),
    reason="needs venv, pip and setuptools in this interpreter to build and install a wheel",
)


def _hides_hethpc(name: str) -> bool:
    """Whether a site-packages entry is (or may import) an installed hethpc."""
    return name.startswith(("hethpc", "__editable__", "__pycache__")) or name.endswith(
        (".pth", ".egg-link")
    )


def _env() -> dict[str, str]:
    skip = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
    env = {k: v for k, v in os.environ.items() if k not in skip}
    # No user site (it may hold a hethpc); no bytecode written into the linked dependencies.
    return {**env, "PYTHONNOUSERSITE": "1", "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1"}


def _run(*argv: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=120,
                          cwd=cwd, env=_env())  # fmt: skip
    assert proc.returncode == 0, f"{argv}:\n{proc.stdout}{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment with hethpc installed from a wheel of the repository."""
    tmp = tmp_path_factory.mktemp("install")
    src = tmp / "src"  # the build writes build/ and *.egg-info beside its sources
    shutil.copytree(ROOT / "hethpc", src / "hethpc", ignore=shutil.ignore_patterns("__pycache__"))
    for name in PROJECT_FILES:
        shutil.copy(ROOT / name, src)
    deps = tmp / "deps"
    deps.mkdir()
    for site in sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}):
        for entry in Path(site).iterdir():
            if not _hides_hethpc(entry.name) and not (deps / entry.name).exists():
                (deps / entry.name).symlink_to(entry)
    env = tmp / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", env, cwd=tmp)
    python = env / "bin" / "python"
    purelib = _run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                   cwd=tmp).stdout.strip()  # fmt: skip
    (Path(purelib) / "hethpc-deps.pth").write_text(f"{deps}\n")
    pip = (python, "-m", "pip", "--disable-pip-version-check", "--no-input", "-q")
    _run(*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", tmp / "dist", src,
         cwd=tmp)  # fmt: skip
    (wheel,) = (tmp / "dist").glob("hethpc-*.whl")
    _run(*pip, "install", "--no-deps", "--no-index", wheel, cwd=tmp)
    return env


def test_hethpc_is_imported_from_the_new_environment(venv: Path) -> None:
    code = "import hethpc, hethpc.cli.train as t; print(hethpc.__file__); print(t.__file__)"
    out = _run(venv / "bin" / "python", "-c", code, cwd=venv.parent).stdout.split()
    assert len(out) == 2 and all(Path(f).is_relative_to(venv) for f in out), out


@pytest.mark.parametrize(
    ("command", "expect"),
    [
        ("hethpc-train", "--run-dir"),
        ("hethpc-report", "run directories"),
        ("hethpc-convert", "cifar"),
        ("hethpc-inspect", "--partition"),
        ("hethpc-testbed", "Node keys"),
    ],
    ids=["train", "report", "convert", "inspect", "testbed"],
)
def test_each_installed_command_prints_its_help(venv: Path, command: str, expect: str) -> None:
    proc = _run(venv / "bin" / command, "--help", cwd=venv.parent)
    assert "usage:" in proc.stdout and expect in proc.stdout, proc.stdout


def test_installed_commands_train_and_report(venv: Path) -> None:
    run_dir = venv.parent / "run"
    _run(venv / "bin" / "hethpc-train", "--model", "mlp", "--samples", "500", "--epochs", "1",
         "--progress", "false", "--run-dir", run_dir, "--cache-dir", venv.parent / "cache",
         cwd=venv.parent)  # fmt: skip
    assert (run_dir / "summary.json").is_file()
    proc = _run(venv / "bin" / "hethpc-report", run_dir, cwd=venv.parent)
    assert f"plots written to {run_dir}/plots/" in proc.stdout, proc.stdout
    assert (run_dir / "plots" / "curves.png").is_file()
