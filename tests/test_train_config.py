"""Settings: defaults, TOML, flags over TOML, validation, and the digest that ranks compare."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from hethpc.train import ConfigError, TrainConfig, load_toml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "jobs"))
import train as train_job  # noqa: E402


def test_toml_sections_and_dashes_are_read(tmp_path: Path) -> None:
    p = tmp_path / "run.toml"
    p.write_text('model = "mlp"\nbatch-size = 64\n[sync]\nsync = "selsync"\nthreshold = 0.5\n')
    assert load_toml(p) == {"model": "mlp", "batch_size": 64, "sync": "selsync", "threshold": 0.5}


@pytest.mark.parametrize(
    ("text", "match"),
    [("modle = 'mlp'\n", r"unknown setting\(s\) \['modle'\]"), ("model = \n", "cannot read")],
    ids=["unknown-key", "bad-syntax"],
)
def test_bad_toml_is_refused_naming_the_file(tmp_path: Path, text: str, match: str) -> None:
    p = tmp_path / "bad.toml"
    p.write_text(text)
    with pytest.raises(ConfigError, match=match) as e:
        load_toml(p)
    assert str(p) in str(e.value)


def test_flags_override_toml_which_overrides_defaults(tmp_path: Path) -> None:
    p = tmp_path / "run.toml"
    p.write_text('model = "mlp"\nepochs = 7\nlr = 0.2\n')
    cfg, _ = train_job.parse_config(["--config", str(p), "--epochs", "3", "--resume"])
    assert (cfg.model, cfg.epochs, cfg.lr, cfg.resume) == ("mlp", 3, 0.2, True)
    assert cfg.batch_size == TrainConfig().batch_size


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"sync": "sometimes"}, "sync = 'sometimes' is not one of"),
        ({"batch_size": 0}, "batch_size must be at least 1"),
        ({"inject_beta": 1.5}, r"inject_beta must be in \[0, 1\]"),
        ({"watchdog_s": -1.0}, "watchdog_s must not be negative"),
    ],
    ids=["choice", "positive", "fraction", "non-negative"],
)
def test_invalid_settings_are_named(kw: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        TrainConfig(**kw)


@pytest.mark.parametrize(
    ("other", "same"),
    [
        ({}, True),
        ({"cache_dir": "/elsewhere", "progress": False}, True),
        ({"seed": 1}, False),
        ({"threshold": 0.31}, False),
    ],
    ids=["equal", "node-local-settings-ignored", "seed", "threshold"],
)
def test_digest_compares_the_shared_settings(other: dict, same: bool) -> None:
    assert (TrainConfig().digest() == TrainConfig(**other).digest()) is same


def test_help_documents_every_setting(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        train_job.parse_config(["--help"])
    out = capsys.readouterr().out
    for name in TrainConfig().to_dict():
        assert "--" + name.replace("_", "-") in out
