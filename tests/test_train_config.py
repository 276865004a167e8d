"""Settings: defaults, TOML, flags over TOML, validation, and the digest that ranks compare."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from hethpc.cli import train as train_job
from hethpc.cli.parser import command_name, flag_hint
from hethpc.train import ConfigError, TrainConfig, config_tables, load_toml
from hethpc.train.parts.capabilities import make_controller
from hethpc.train.settings.compare import resume_differences

ROOT = Path(__file__).resolve().parents[1]


def test_toml_sections_and_dashes_are_read(tmp_path: Path) -> None:
    p = tmp_path / "run.toml"
    p.write_text('model = "mlp"\nbatch-size = 64\n[sync]\nsync = "selsync"\nthreshold = 0.5\n')
    assert load_toml(p) == {"model": "mlp", "batch_size": 64, "sync": "selsync", "threshold": 0.5}


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("modle = 'mlp'\n", r"unknown setting\(s\) \['modle'\]"),
        ("model = \n", "cannot read"),
        # One setting in two tables (or spelt two ways) was silently the later one.
        ("epochs = 2\n[data]\nepochs = 3\n", r"epochs is set twice \(epochs and \[data\] epochs\)"),
        ("batch_size = 2\nbatch-size = 3\n", r"batch_size is set twice \(batch_size and batch-"),
    ],
    ids=["unknown-key", "bad-syntax", "two-tables", "dash-and-underscore"],
)
def test_bad_toml_is_refused_naming_the_file(tmp_path: Path, text: str, match: str) -> None:
    p = tmp_path / "bad.toml"
    p.write_text(text)
    with pytest.raises(ConfigError, match=match) as e:
        load_toml(p)
    assert str(p) in str(e.value)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("epochs = 2\nepoch = 3\n", r"unknown setting\(s\) \['epoch'\]: epoch \(line 2; did you "
         r"mean 'epochs'\?\)"),
        ("[sync]\ntreshold = 0.5\n", r"\[sync\] treshold \(line 2; did you mean 'threshold'\?\)"),
        ("batch-sise = 64\n", r"batch-sise \(line 1; did you mean 'batch_size'\?\)"),
        ("[batching]\nsync = 'bsp'\n", r"line 2: sync is under \[batching\], but belongs to "
         r"\[sync\]; move it there, or to the top"),
        ("[data]\nthreshold = 0.5\n", r"threshold is under \[data\], but belongs to \[sync\]"),
        ("[sycn]\nsync = 'bsp'\n", r"line 1: unknown table \[sycn\] \(did you mean \[sync\]\?\); "
         r"the tables are \[data\], \[model\], \[sync\], \[batching\], \[pipeline\], \[output\]"),
    ],
    ids=["misspelt-key", "misspelt-key-in-table", "misspelt-dashed-key", "key-in-another-table",
         "key-in-another-table-2", "misspelt-table"],
)  # fmt: skip
def test_a_toml_mistake_names_the_file_key_and_line(tmp_path: Path, text: str, match: str) -> None:
    p = tmp_path / "run.toml"
    p.write_text(text)
    with pytest.raises(ConfigError, match=match) as e:
        train_job.parse_config(["--config", str(p)])
    assert str(e.value).startswith(str(p)), e.value


def test_every_key_is_accepted_at_the_top_and_under_its_own_table(tmp_path: Path) -> None:
    tables = config_tables()
    defaults = TrainConfig().to_dict()
    top = [f"{n} = {json.dumps(defaults[n])}" for n in tables]
    grouped = [f"[{t}]\n" + "\n".join(
        f"{n} = {json.dumps(defaults[n])}" for n in tables if tables[n] == t
    ) for t in dict.fromkeys(tables.values())]  # fmt: skip
    for text in ("\n".join(top), "\n".join(grouped)):
        p = tmp_path / "all.toml"
        p.write_text(text + "\n")
        assert load_toml(p) == defaults


TOMLS = sorted((ROOT / "jobs").glob("**/*.toml")) + sorted((ROOT / "examples").glob("**/*.toml"))


@pytest.mark.parametrize("path", TOMLS, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_shipped_toml_files_load(path: Path) -> None:
    cfg, _ = train_job.parse_config(["--config", str(path)])
    assert cfg.to_dict().items() >= load_toml(path).items()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--epoch", "2"], "unrecognized arguments: --epoch 2; did you mean --epochs?"),
        (["--epoch=2"], "unrecognized arguments: --epoch=2; did you mean --epochs?"),
        (["--sync-w", "5"], "unrecognized arguments: --sync-w 5; did you mean --sync-window?"),
        (["--eval", "2"], "did you mean --eval-every or --eval-every-steps?"),
        (["--epcohs", "2"], "unrecognized arguments: --epcohs 2; did you mean --epochs?"),
    ],
    ids=["abbreviation", "abbreviation-with-equals", "abbreviation-of-a-longer-flag",
         "ambiguous-abbreviation", "misspelt"],
)  # fmt: skip
def test_an_abbreviated_or_misspelt_flag_is_refused_with_a_suggestion(
    flags: list[str], message: str
) -> None:
    with pytest.raises(train_job.UsageError) as e:
        train_job.parse_config(flags)
    assert message in f"{e.value}{flag_hint(train_job.build_parser(), str(e.value))}"


def test_each_flag_states_one_default() -> None:
    for action in train_job.build_parser()._actions:
        assert (action.help or "").count("default") <= 1, (action.option_strings, action.help)


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
    ("kw", "match"),
    [
        ({"pipeline_balance": "speed"}, r"pipeline_balance 'speed' is not params, time or the "
         r"layers per chunk"),
        ({"pipeline_balance": "14,0", "pipeline_stages": 2}, "each at least 1"),
        ({"pipeline_balance": "14,12"}, r"lists 2 chunk\(s\), but pipeline_stages = 1 with "
         r"schedule 1f1b cuts the model into 1 \(one per stage\); give 1 layer counts"),
        ({"pipeline_balance": "14,12", "pipeline_stages": 2, "schedule": "zbv"},
         r"into 4 \(two chunks per stage\)"),
    ],
    ids=["unknown-word", "empty-chunk", "count-vs-stages", "count-vs-v"],
)  # fmt: skip
def test_a_bad_pipeline_balance_is_named(kw: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as e:
        TrainConfig(**kw)
    assert e.value.key == "pipeline_balance"


def test_a_given_pipeline_balance_is_kept_without_spaces() -> None:
    cfg = TrainConfig(pipeline_balance=" 14, 12 ", pipeline_stages=2)
    assert cfg.pipeline_balance == "14,12"
    assert TrainConfig(pipeline_balance="Time").pipeline_balance == "time"


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


@pytest.mark.parametrize(
    ("toml", "match"),
    [
        ('resume = "false"\n', r"resume = 'false': expected true or false .*line 2"),
        ('batch_size = "64"\n', r"batch_size = '64': expected an integer .*line 2"),
        ('lr = "fast"\n', r"lr = 'fast': expected a finite number .*line 2"),
        ("epochs = 1.5\n", r"epochs = 1.5: expected an integer .*line 2"),
        ("[sync]\nthreshold = nan\n", r"threshold = nan: expected a finite number .*line 3"),
        ("progress = 1\n", r"progress = 1: expected true or false"),
        ("resume_changes = 'lr,epoch'\n", r"unknown setting\(s\) \['epoch'\]"),
    ],
    ids=["bool-as-string", "int-as-string", "float-as-string", "fractional-count", "nan",
         "int-as-bool", "unknown-resume-change"],
)  # fmt: skip
def test_toml_values_are_type_checked_naming_key_and_line(
    tmp_path: Path, toml: str, match: str
) -> None:
    p = tmp_path / "run.toml"
    p.write_text('model = "mlp"\n' + toml)
    with pytest.raises(ConfigError, match=match) as e:
        train_job.parse_config(["--config", str(p)])
    assert str(p) in str(e.value)


@pytest.mark.parametrize(
    ("flags", "match"),
    [
        (["--lr", "nan"], r"lr = nan: expected a finite number \(set by --lr\)"),
        (["--lr", "inf"], r"lr = inf: expected a finite number"),
        (["--lr", "0"], "lr must be positive"),
        (["--momentum", "nan"], "momentum = nan"),
        (["--momentum", "1"], r"momentum must be in \[0, 1\)"),
        (["--weight-decay", "nan"], "weight_decay = nan"),
        (["--watchdog-s", "nan"], "watchdog_s = nan"),
        (["--watchdog-s", "inf"], "watchdog_s = inf"),
        (["--watchdog-s", "60", "--watchdog-max-s", "30"], "ceiling must be at least the floor"),
        (["--b-min", "200"], "b_min = 200 is larger than batch_size = 128"),
        (["--b-min", "-1"], r"b_min must be at least 1, or 0 for auto, got -1"),
        (["--weights", "1,x", "--batching", "static"], r"weights = '1,x': expected comma-sep"),
        (["--weights", "1,-2", "--batching", "static"], r"weights = '1,-2': expected comma-sep"),
        (["--weights", "1,2"], r"would be ignored with batching 'uniform'.*\(set by --weights\)"),
        (["--labels-per-rank", "0"], "labels_per_rank must be at least 1"),
        (["--samples", "5"], r"samples must be at least 10 .*got 5 \(set by --samples\)"),
    ],
    ids=["lr-nan", "lr-inf", "lr-zero", "momentum-nan", "momentum-one", "weight-decay-nan",
         "watchdog-nan", "watchdog-inf", "watchdog-ceiling", "b-min", "b-min-negative",
         "weights-not-numbers", "weights-negative", "weights-ignored", "labels-per-rank",
         "samples"],
)  # fmt: skip
def test_flags_are_range_checked_naming_the_flag(flags: list[str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        train_job.parse_config(flags)


def test_toml_booleans_are_booleans(tmp_path: Path) -> None:
    p = tmp_path / "run.toml"
    p.write_text("resume = false\nprogress = true\nlr = 1\n")
    cfg, _ = train_job.parse_config(["--config", str(p)])
    assert (cfg.resume, cfg.progress, cfg.lr) == (False, True, 1.0)
    assert isinstance(cfg.lr, float)


@pytest.mark.parametrize(
    ("saved", "now", "changed"),
    [
        ({}, {}, []),
        ({"lr": 0.1}, {"lr": 0.5}, ["lr: 0.1 -> 0.5"]),
        ({"optimizer": "sgd"}, {"optimizer": "adam"}, ["optimizer: 'sgd' -> 'adam'"]),
        ({"lr": 0.1}, {"lr": 0.5, "resume_changes": "lr"}, []),
        ({"epochs": 2}, {"epochs": 4, "resume_changes": "epochs,lr-schedule"}, []),
        ({"checkpoint_every": 5, "watchdog_s": 9.0}, {"checkpoint_every": 7}, []),
    ],
    ids=["same", "lr", "optimizer", "lr-allowed", "epochs-allowed", "operational-free"],
)
def test_resume_differences(saved: dict, now: dict, changed: list[str]) -> None:
    base = TrainConfig().to_dict()
    assert resume_differences({**base, **saved}, TrainConfig(**now)) == changed


def test_a_setting_unknown_to_an_old_checkpoint_counts_only_off_its_default() -> None:
    old = {k: v for k, v in TrainConfig().to_dict().items() if k != "sync_window"}
    assert resume_differences(old, TrainConfig()) == []
    assert resume_differences(old, TrainConfig(sync_window=9)) == ["sync_window: 25 -> 9"]


@pytest.mark.parametrize(
    ("kw", "floor"),
    [
        ({"batching": "dynamic"}, 16),
        ({"batching": "dynamic", "partition": "labels"}, 32),
        ({"batching": "dynamic", "b_min": 5}, 5),
        ({"batching": "static", "weights": "1"}, 1),
        ({"batching": "uniform"}, 1),
    ],
    ids=["dynamic-auto-iid", "dynamic-auto-skewed", "dynamic-explicit",
         "static-keeps-its-weights", "uniform"],
)
def test_the_controllers_smallest_batch(kw: dict, floor: int) -> None:
    ctl = make_controller(TrainConfig(batch_size=128, **kw))  # one process: one replica
    assert ctl.settings.b_min == floor


def test_weights_must_match_the_data_parallel_ranks() -> None:
    cfg = TrainConfig(batch_size=128, batching="static", weights="1,2")
    with pytest.raises(ConfigError, match=r"gives 2 weight\(s\), but 1 data-parallel rank"):
        make_controller(cfg)  # one process: one rank


@pytest.mark.parametrize(
    ("argv0", "name"),
    [
        ("jobs/train.py", "default"),  # python jobs/train.py: the program's own name
        ("/opt/venv/bin/hethpc-train", "hethpc-train"),  # the console script
        ("/srv/hethpc/jobs/train.py", "default"),  # an sbatch script's absolute path
    ],
)
def test_messages_name_the_command_as_the_user_ran_it(
    monkeypatch: pytest.MonkeyPatch, argv0: str, name: str
) -> None:
    monkeypatch.setattr(sys, "argv", [argv0, "--epochs", "1"])
    assert command_name(None, "default") == name
    assert command_name(["--epochs", "1"], "default") == "default"  # called with an argv
