"""The one palette of the dashboard and its exports: a run's colour comes from the run, never from its place in a selection.

A run's id picks its slot among PALETTE's first ten colours (a stable hash, the same in every process); two runs of one view
that land on the same slot are told apart by probing on to the next free one, in the order of the runs' own start times
(then ids; the last ten colours once the first ten are taken), so
the same runs get the same colours on Explore, Live, Comparison and in every export, whichever order they were ticked in.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable

import plotly.graph_objects as go
import plotly.io as pio

# 20 colours that stay apart on white and in print (Tableau 10 and its darker companions; no pale tints, no two greys)
PALETTE = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f",
    "#393b79", "#ad494a", "#637939", "#8c6d31", "#7b4173", "#3182bd", "#e6550d", "#31a354", "#756bb1", "#843c39",
)  # fmt: skip
PRIMARY = 10  # the first ten are used first: a view of up to ten runs gets ten well-separated colours
SCREEN = "radt"  # the theme of every chart drawn on a page (Explore, Live): plotly_white's grid, radt's colours
PAPER = "radt_paper"  # the same theme for figures made to be printed (comparison, export): simple_white's axes, no grid
SERIES_DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")  # a run's GPUs, nodes and slices: one colour, a dash each


def slot(key: str) -> int:
    """The palette slot a run (or workload) id asks for: crc32, so every process and every page agrees."""
    return zlib.crc32(str(key).encode("utf-8")) % len(PALETTE)


def color_of(key: str) -> str:
    """The colour an id has when nothing else in the view asks for its slot (as colors() gives a view of one)."""
    return PALETTE[slot(key) % PRIMARY]


def colors(keys: Iterable[tuple[str, float | None]]) -> dict[str, str]:
    """id -> colour for the ids of one view, given as (id, start time ms or None): distinct while there are no more ids than
    colours. Each id asks for its slot among the first ten (the most distinct) and, when that is taken, the next free one
    (earliest start first); the other ten are used once the first ten are; beyond twenty, ids share on their own slot."""

    def order(item: tuple[str, float | None]) -> tuple:
        start = item[1]
        unknown = start is None or start != start  # None or NaN: after every run with a start
        return (unknown, 0.0 if unknown else start, item[0])

    taken: set[int] = set()
    out: dict[str, str] = {}
    for key, _start in sorted(dict(keys).items(), key=order):
        want = slot(key) % PRIMARY
        if len(taken) >= len(PALETTE):
            out[key] = PALETTE[slot(key)]
            continue
        for step in range(len(PALETTE)):
            candidate = (want + step) % PRIMARY if step < PRIMARY else PRIMARY + (want + step) % (len(PALETTE) - PRIMARY)
            if candidate not in taken:
                break
        taken.add(candidate)
        out[key] = PALETTE[candidate]
    return out


def run_colors(runs) -> dict[str, str]:
    """run_id -> colour for a runs frame (run_id, start_time), as every page and export colours them."""
    if runs is None or len(runs) == 0:
        return {}
    ids = runs["run_id"] if "run_id" in runs else runs.index.to_series()
    starts = runs["start_time"] if "start_time" in runs else [None] * len(runs)
    return colors((str(r), None if s is None else float(s)) for r, s in zip(ids, starts, strict=False))


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
