"""One palette, one theme: every figure of the page, Live, the comparison and the export takes radt's template (app/figures/palette.py),
never one of Plotly's by name, so a colour or a font changes in one place."""

from __future__ import annotations

import re
from pathlib import Path

import plotly.graph_objects as go
import plotly.io as pio
import pytest

from radt.app.figures import figures
from radt.app.figures.palette import PALETTE, PAPER, PRIMARY, SCREEN, themed

ROOT = Path(__file__).resolve().parents[1]


def test_no_figure_names_a_plotly_template_of_its_own():
    named = []
    for folder in ("app", "pages"):
        for path in (ROOT / folder).rglob("*.py"):
            if path.name != "palette.py" and re.search(r"\btemplate\s*=\s*[\"']", path.read_text()):
                named.append(path.name)
    assert named == []


def test_both_variants_colour_as_the_runs_are_coloured():
    for name in (SCREEN, PAPER):
        assert list(pio.templates[name].layout.colorway) == list(PALETTE[:PRIMARY])
    assert figures.empty_figure("nothing").layout.template.layout.colorway == pio.templates[SCREEN].layout.colorway


def test_a_themed_figure_is_what_plotly_makes_of_the_templates_name():
    """themed() sets the registered template without validating it again (as Plotly sets its default): the figure the
    browser gets is the same as `update_layout(template=NAME)`'s, for both variants, with the figure's own layout kept."""
    for name in (SCREEN, PAPER):
        fast = themed(go.Figure(go.Scatter(x=[0, 1], y=[2, 3])), name).update_layout(height=260, xaxis={"visible": False})
        slow = go.Figure(go.Scatter(x=[0, 1], y=[2, 3])).update_layout(template=name, height=260, xaxis={"visible": False})
        assert fast.to_json() == slow.to_json(), name
        assert fast.layout.template.layout.colorway == pio.templates[name].layout.colorway
        fast.update_layout(title={"text": "still validated"})
        with pytest.raises(ValueError):
            fast.update_layout(height="tall")  # the figure's own properties are still checked
