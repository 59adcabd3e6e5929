"""Each default once: every RADT_* setting is defined in radt/settings.py, and the reference page's table is that list as it is."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from radt import options, settings

ROOT = Path(__file__).resolve().parents[1]


REFERENCE = ROOT / "docs" / "reference.md"


def test_the_reference_page_lists_every_setting_with_its_default():
    page = REFERENCE.read_text()
    section = page.split("\n## Settings\n", 1)[-1].split("\n## ", 1)[0] if "\n## Settings\n" in page else ""
    assert settings.reference() in section, (
        "the settings table under '## Settings' in docs/reference.md differs from radt/settings.py: paste settings.reference() into it"
    )


def test_the_settings_table_has_one_home():
    """The README links to the reference; a second copy of the table would go stale beside it."""
    first_row = settings.reference().splitlines()[2]
    assert first_row not in (ROOT / "README.md").read_text()


def test_settings_are_defined_in_radt_settings_only():
    """A Setting made anywhere else (the dashboard's cache switches were made in app/view/cache.py) is a second place for defaults."""
    made = []
    for path in ROOT.rglob("*.py"):
        if ".venv" in path.parts or "tests" in path.parts or path.name == "settings.py":
            continue
        if re.search(r"^\s*[A-Z_]+\s*=\s*Setting\(", path.read_text(), re.MULTILINE):
            made.append(str(path.relative_to(ROOT)))
    assert made == []


@pytest.mark.parametrize(("variable", "option", "value"), [("RADT_INTERVAL", "interval", 0.5), ("RADT_FLUSH_TIMEOUT", "flush_timeout", 7.0)])
def test_recording_options_take_their_default_from_the_variable(monkeypatch, variable, option, value):
    monkeypatch.setenv(variable, str(value))
    parser = options.recording_parent()
    assert getattr(parser.parse_args([]), option) == value
    monkeypatch.delenv(variable)
    assert getattr(options.recording_parent().parse_args([]), option) == getattr(settings, variable.removeprefix("RADT_")).default


def test_an_interval_below_the_floor_is_refused_in_one_line(monkeypatch):
    monkeypatch.setenv("RADT_INTERVAL", "0.01")
    with pytest.raises(settings.SettingError, match=r"RADT_INTERVAL='0.01' is out of range; give seconds from 0.1 to 3600 \(default 1\)"):
        settings.check_settings()
