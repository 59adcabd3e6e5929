"""One palette, one theme: every figure of the page, Live, the comparison and the export takes radt's template (app/palette.py),
never one of Plotly's by name, so a colour or a font changes in one place."""

from __future__ import annotations

import re
from pathlib import Path

import plotly.io as pio

from radt.app import figures
from radt.app.palette import PALETTE, PAPER, PRIMARY, SCREEN

ROOT = Path(__file__).resolve().parents[1]


def test_no_figure_names_a_plotly_template_of_its_own():
    named = []
    for folder in ("app", "pages"):
        for path in (ROOT / folder).glob("*.py"):
            if path.name != "palette.py" and re.search(r"\btemplate\s*=\s*[\"']", path.read_text()):
                named.append(path.name)
    assert named == []


def test_both_variants_colour_as_the_runs_are_coloured():
    for name in (SCREEN, PAPER):
        assert list(pio.templates[name].layout.colorway) == list(PALETTE[:PRIMARY])
    assert figures.empty_figure("nothing").layout.template.layout.colorway == pio.templates[SCREEN].layout.colorway
