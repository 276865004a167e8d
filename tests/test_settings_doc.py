"""docs/settings.md: every setting of TrainConfig, current with its fields, defaults and help."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from hethpc.train import config_fields, config_sections
from hethpc.train.settings.doc import settings_markdown

ROOT = Path(__file__).resolve().parents[1]


def test_the_reference_is_current() -> None:
    text = (ROOT / "docs" / "settings.md").read_text()
    assert text == settings_markdown(), "docs/settings.md is stale: run `make docs`"


def test_every_setting_is_in_exactly_one_section() -> None:
    grouped = [f.name for _, fields in config_sections() for f in fields]
    assert grouped == [f.name for f in config_fields()]
    assert [s for s, _ in config_sections()][0] == "data"


@pytest.mark.parametrize("f", config_fields(), ids=lambda f: f.name)
def test_each_setting_has_its_row_with_its_whole_help(f: dataclasses.Field[Any]) -> None:
    flag = "--" + f.name.replace("_", "-")
    rows = [r for r in settings_markdown().splitlines() if r.startswith(f"| `{flag}` ")]
    assert len(rows) == 1, flag
    assert f"`{f.name}`" in rows[0] and f.metadata["help"].replace("|", "\\|") in rows[0]
