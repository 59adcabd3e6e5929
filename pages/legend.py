"""The explore charts' legend as HTML above the grid: sticky, so it stays in view however far the charts scroll.

Plotly's own legend sits at the top of one tall figure and scrolls away; this one is a row of entries
(a colour swatch and the series' name) that point at a run or workload by id. assets/page.js makes
hovering an entry call ``window.radtCharts.highlight(id)`` and a click keep the highlight.
"""

from __future__ import annotations

from html import unescape

from dash import html


def children(found: list[dict]) -> list:
    """The entries of figures.legend_entries: one per series: a swatch in its colour and dash, its name; data-id is what the highlight gets."""
    return [
        html.Button(
            [
                html.Span(
                    className="legend-swatch",
                    style={"borderTopColor": e["color"], "borderTopStyle": "dashed" if e.get("dash") not in (None, "solid") else "solid"},
                ),
                unescape(e["name"]),  # the figure's names are escaped for Plotly's pseudo-HTML; here they are text
            ],
            className="legend-entry",
            title=f"{unescape(e['name'])}: hover to highlight, click to keep it highlighted",
            **{"data-id": e["id"]},
        )
        for e in found
    ]
