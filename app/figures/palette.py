"""The one palette of the dashboard and its exports: a run's colour is its place in the view.

A view keeps its runs in the order they were added (the link keeps that order) and gives the first PALETTE[0], the second
PALETTE[1], and so on: adding runs never changes the colour of a run already shown, and the same view is coloured the same
on Explore, in its legend, the comparison figures and every export. PALETTE's twenty colours are pairwise apart (CIEDE2000
at least 16, Tableau 10's own closest pair); past twenty runs the colours repeat in the same order. A page that shows runs
coming and going (Live) keeps the colours it gave (`colors(..., kept=...)`), a new run taking the first free one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import plotly.graph_objects as go
import plotly.io as pio

# 20 colours that stay apart on white and in print: Tableau 10, then ten picked greedily for the largest CIEDE2000 distance
# to every colour before them (lightness 30-70, chroma at least 30: a 1.5 px line on white, no grey); no pair closer than 16
PALETTE = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f",
    "#005533", "#665500", "#880066", "#0011ff", "#88aaff", "#aa8844", "#444477", "#ee8888", "#228877", "#dd1177",
)  # fmt: skip
PRIMARY = 10  # Tableau 10: the colourway of a figure's traces that carry no colour of their own (comparison categories)
SCREEN = "radt"  # the theme of every chart drawn on a page (Explore, Live): plotly_white's grid, radt's colours
PAPER = "radt_paper"  # the same theme for figures made to be printed (comparison, export): simple_white's axes, no grid
SERIES_DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")  # a run's GPUs, nodes and slices: one colour, a dash each


def colors(keys: Iterable[str], kept: Mapping[str, str] | None = None) -> dict[str, str]:
    """id -> colour for the ids of one view, in their order: each the first colour of PALETTE that no id before it (nor any
    in `kept`, the colours a page already shows) has; an id in `kept` keeps its own. Without `kept`: PALETTE in order."""
    kept = dict(kept or {})
    out: dict[str, str] = {}
    used = set(kept.values())
    for key in dict.fromkeys(str(k) for k in keys):
        if key in kept:
            out[key] = kept[key]
            continue
        free = next((c for c in PALETTE if c not in used), None)
        out[key] = free if free is not None else PALETTE[len(out) % len(PALETTE)]  # past twenty: the palette again, in order
        used.add(out[key])
    return out


def run_colors(runs, kept: Mapping[str, str] | None = None) -> dict[str, str]:
    """run_id -> colour for a runs frame in the view's order (views.view_runs keeps it), as every page and export colours them."""
    if runs is None or len(runs) == 0:
        return {}
    ids = runs["run_id"] if "run_id" in runs else runs.index.to_series()
    return colors((str(r) for r in ids), kept)


def dash_of(position: int) -> str:
    """The dash style of a run's `position`-th device (0: solid)."""
    return SERIES_DASHES[position % len(SERIES_DASHES)]


def themed(fig: go.Figure, name: str) -> go.Figure:
    """FIG in the registered template NAME, set as Plotly sets its default template: validated once when registered, not
    again for every figure (7-9 ms a figure, most of an empty figure's cost; the JSON is the same)."""
    layout = fig.layout
    layout._validate = False
    try:
        layout.template = pio.templates[name]
    finally:
        layout._validate = True
    return fig


def _register_templates() -> None:
    """SCREEN and PAPER as Plotly templates: one colourway (the palette's first ten), so a trace without its own colour
    (a comparison figure's category) is coloured as the runs are everywhere else. Copied without validating again what
    Plotly validated when it loaded the base (0.1 s of every process's start; the JSON is the same)."""
    for name, base in ((SCREEN, "plotly_white"), (PAPER, "simple_white")):
        template = go.layout.Template(pio.templates[base], _validate=False)
        template.layout.colorway = list(PALETTE[:PRIMARY])
        pio.templates[name] = template


_register_templates()
