"""The explore charts' legend as an HTML table above the grid: sticky, so it stays in view however far the charts scroll.

One row per run (Grafana's table legend): its colour, its name (its command on hover), and per chart the mean / max /
last of the shown window, so an idle GPU reads 0.000 even where its line lies on the axis. A multi-GPU run's devices
(each in its dash style: the small key of which line is which GPU, node or slice) are rows under it, shown on demand
("per GPU", assets/charts.js keeps the choice). The max and last columns show where the table fits its box (with the 8
default charts at 1440 px all three did not: 1,703 px in 1,062, the last three charts' figures out of sight; mean and max
do, each name over its chart's shown columns) and on demand ("max", "last"); the mean always shows. assets/page.js makes hovering a row call
``window.radtCharts.highlight(id)`` and a click keep it.
"""

from __future__ import annotations

import math
from html import unescape

from dash import html

DEVICES_TOGGLE = "legend-devices-toggle"  # the button assets/charts.js listens to (body class radt-legend-devices)
STAT_TOGGLE = "legend-stat-toggle"  # "max", "last": assets/charts.js shows or hides that column (body class radt-legend-no-max...)


def value_text(value: float | None, fmt: str, decimals: int | None = None) -> str:
    """A legend number: ratios with 3 decimals, counts and states with none, the rest with the `decimals` of its column
    (column_decimals: every row of a chart's column alike, 50.20 beside 50.06, never 50.2), '–' for none."""
    if value is None or not isinstance(value, int | float) or not math.isfinite(value):
        return "–"
    if fmt == ".3f":
        return f"{value:.3f}"
    if decimals is None:
        decimals = column_decimals([value], fmt)
    return f"{value:,.{decimals}f}"


def column_decimals(values, fmt: str) -> int:
    """Decimals for a column of the legend: 4 significant figures of its largest value (93.55, 602.1, 21,586), at most 4."""
    if fmt == ".3f":
        return 3
    if fmt == ".0f":
        return 0
    finite = [abs(v) for v in values if isinstance(v, int | float) and math.isfinite(v)]
    largest = max(finite, default=0.0)
    if largest == 0:
        return 2
    return min(4, max(0, 3 - math.floor(math.log10(largest))))


# Plotly's dash styles as CSS stops (px of colour and gap): the legend's line looks like the chart's (assets/charts.js: the same)
DASH_STOPS = {"dash": (5, 3), "dot": (2, 2), "dashdot": (5, 2, 2, 2), "longdash": (8, 3), "longdashdot": (8, 2, 2, 2)}


def dash_background(color: str, dash: str | None) -> str:
    """A CSS background that draws a line of `color` in Plotly's `dash` style."""
    stops = DASH_STOPS.get(dash or "solid")
    if not stops:
        return color
    parts, at = [], 0
    for i, length in enumerate(stops):
        parts.append(f"{color if i % 2 == 0 else 'transparent'} {at}px {at + length}px")
        at += length
    return f"repeating-linear-gradient(90deg, {', '.join(parts)})"


def _swatch(color: str, dash: str) -> html.Span:
    style = {"background": dash_background(color, dash), "borderTop": "none", "height": "3px"}
    return html.Span(className="legend-swatch", style=style, **{"data-dash": dash or "solid"})


STATS = ("mean", "max", "last")
OPTIONAL_STATS = STATS[1:]  # shown where the table fits, or on demand; the mean always shows (and heads each chart's columns)


def _cells(stats: list[dict], decimals: list[int]) -> list:
    out = []
    for cell, places in zip(stats, decimals, strict=False):
        fmt = cell.get("fmt", ",.4~g")
        out.extend(html.Td(value_text(cell.get(k), fmt, places), className=f"legend-num legend-{k}" + (" legend-first" if k == "mean" else "")) for k in STATS)
    return out


def _decimals(found: list[dict], charts: int) -> list[int]:
    """Per chart, the decimals its mean / max / last columns share over every run's and device's row."""
    rows = [e.get("stats") or [] for e in found] + [d.get("stats") or [] for e in found for d in e.get("devices") or []]
    out = []
    for i in range(charts):
        cells = [r[i] for r in rows if i < len(r) and r[i]]
        fmt = next((c.get("fmt") for c in cells if c.get("fmt")), ",.4~g")
        out.append(column_decimals([c.get(k) for c in cells for k in STATS], fmt))
    return out


def _header(stats: list[dict], toggle: bool) -> html.Thead:
    """One header row (a table of colspans lost its alignment in Chromium): each chart's name over its mean, then max, last;
    assets/charts.js widens the name over the chart's shown columns (two lines, not four). The first cell holds the toggles: "per GPU" (a multi-GPU run's devices) and "max", "last" (those columns)."""
    devices = html.Button("per GPU", className=DEVICES_TOGGLE, title="show each GPU's, node's or slice's own row and line style")
    buttons = ([devices] if toggle else []) + [
        html.Button(k, className=STAT_TOGGLE, title=f"show or hide each chart's {k} column", **{"data-stat": k}) for k in OPTIONAL_STATS
    ]
    first = html.Th(html.Span(buttons, className="legend-toggles"), className="legend-name")
    cells = []
    for c in stats:
        chart = f"{c['metric']}" + (f" ({c['unit']})" if c.get("unit") else "")
        for i, k in enumerate(STATS):
            cells.append(
                html.Th(
                    [html.Div(html.Span(chart, className="legend-chart-name") if i == 0 else "\u00a0", className="legend-chart"), k],
                    className=f"legend-num legend-{k}" + (" legend-first" if i == 0 else ""),
                    title=chart if i == 0 else None,
                )
            )
    return html.Thead(html.Tr([first, *cells]))


def children(found: list[dict]) -> list:
    """The legend of figures.legend_entries: a table with a row per run (and its devices' rows), or, without figures
    (workloads, grouped mode), a row of entries: a swatch in the run's colour and its name. data-id is what the highlight gets."""
    if not found:
        return []
    if not any(e.get("stats") for e in found):
        return [_entry(e) for e in found]
    stats = next(e["stats"] for e in found if e.get("stats"))
    decimals = _decimals(found, len(stats))
    rows = []
    for e in found:
        name = unescape(e["name"])  # the figure's names are escaped for Plotly's pseudo-HTML; here they are text
        devices = e.get("devices") or []
        more = f" · {len(devices)} series" if devices else ""
        # which series: "6 series" beside a run of 5 GPUs read as six GPUs (the host's series count too)
        listed = f"{len(devices)} series: {', '.join(d['label'] for d in devices)} ('per GPU' shows a row for each)" if devices else None
        rows.append(
            html.Tr(
                [
                    html.Td(
                        [_swatch(e["color"], "solid"), html.Span(name, className="legend-label"), html.Span(more, className="legend-more", title=listed)],
                        title=name + (f"\n{e['command']}" if e.get("command") else ""),  # which learning rate a random name ran
                        className="legend-name",
                    )
                ]
                + _cells(e.get("stats") or [{} for _ in stats], decimals),
                className="legend-entry",
                title=f"{name}: hover to highlight, click to keep it highlighted",
                **{"data-id": e["id"]},
            )
        )
        rows.extend(
            html.Tr(
                [html.Td([_swatch(e["color"], d["dash"]), html.Span(d["label"], className="legend-label")], className="legend-name")]
                + _cells(d["stats"], decimals),
                className="legend-entry legend-device",
                **{"data-id": e["id"], "data-device": d["label"]},
            )
            for d in devices
        )
    toggle = any(e.get("devices") for e in found)
    return [html.Table([_header(stats, toggle), html.Tbody(rows)], className="legend-table")]


def _entry(e: dict) -> html.Button:
    name = unescape(e["name"])
    return html.Button(
        [_swatch(e["color"], e.get("dash")), name],
        className="legend-entry",
        title=f"{name}: hover to highlight, click to keep it highlighted",
        **{"data-id": e["id"]},
    )
