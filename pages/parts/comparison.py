"""The explore page's comparison figures, under the charts: per-run aggregates as bars, boxes or CDFs by workload or
collocation method (per command), the collocation figure (throughput ÷ alone and GPU SMACT per method, per command), or
one run's GRACT vs SMACT vs SMOCC. Drawn from the summary table's rows (no second query); a run's points keep the colour
its lines have on the charts (palette.run_colors over the view's runs)."""

from __future__ import annotations

import pandas as pd
from dash import Input, Output, State, callback, dcc, html

from radt.app.export.aggregates import BY, COLLOCATION, KINDS, STATS, FigureError, activity_figure, aggregate_figure
from radt.app.figures.figures import GRAPH_CONFIG, empty_figure
from radt.app.figures.palette import run_colors
from radt.app.view.views import View, view_runs
from radt.app.web import inputs
from radt.pages.parts import ids

KIND_LABELS = {"bar": "bars", "box": "box plots", "cdf": "CDFs", COLLOCATION: "collocation (throughput ÷ alone, SMACT)",
               "activity": "GRACT vs SMACT vs SMOCC (one run)"}  # fmt: skip


def layout() -> list:
    """The section's controls and its figure."""
    return [
        html.H3("Comparison"),
        html.Div(
            [
                dcc.RadioItems(
                    id=ids.COMPARE_KIND, options=[{"label": KIND_LABELS[k], "value": k} for k in (*KINDS, COLLOCATION, "activity")], value="bar", inline=True
                ),
                html.Span(  # "by" stays with its choices when the controls wrap
                    [
                        html.Span("by", className="label"),
                        dcc.RadioItems(id=ids.COMPARE_BY, options=[{"label": b, "value": b} for b in BY], value="workload", inline=True),
                    ],
                    className="compare-by",
                ),
                dcc.Dropdown(
                    id=ids.COMPARE_STAT,
                    options=[{"label": f"{label} ({unit})", "value": s} for s, (label, unit) in STATS.items()],
                    value="smact_mean",
                    clearable=False,
                    className="compare-stat",
                ),
                dcc.Dropdown(id=ids.COMPARE_RUN, options=[], value=None, placeholder="run (activity figure)", className="compare-run"),
            ],
            className="controls compare-controls",
        ),
        dcc.Graph(id=ids.COMPARE_FIGURE, figure=empty_figure("Pick runs on the left."), config=GRAPH_CONFIG),
    ]


def draw(rows, kind, by, stat, run_id, view_data):
    """The chosen figure of the table's runs, or a figure whose text says what is missing."""
    runs = _runs(rows)
    options = [{"label": f"{r.get('run')} · {r.get('workload')}", "value": r["run_id"]} for r in runs]
    if not runs:
        return empty_figure("Pick runs on the left."), options
    kind, by, stat = (v if isinstance(v, str) else "" for v in (kind, by, stat))  # not text: named as not one of the choices
    try:
        from radt.app.view.views import experiment_names

        view = View.from_dict(view_data if isinstance(view_data, dict) else {})
        if kind == "activity":
            chosen = run_id if run_id in [o["value"] for o in options] else options[0]["value"]
            return _activity(view, chosen), options
        return aggregate_figure(kind, pd.DataFrame(runs), stat, by, experiment_names(), run_colors(view_runs(view))), options
    except FigureError as exc:
        return empty_figure(str(exc)), options


def _runs(rows: object) -> list[dict]:
    """The table's run rows, as a request may carry anything: a row without a run id is left out, a value that is not
    text or a number is left empty."""
    runs = [r for r in inputs.records(rows) if r.get("kind") == "run" and inputs.run_id(r.get("run_id"))]
    return [{k: v if v is None or isinstance(v, str | int | float) else None for k, v in r.items()} for r in runs]


def _activity(view: View, run_id: str):
    from radt.app.export.exportoptions import ExportError
    from radt.app.export.paper import activity_series

    try:
        series, title = activity_series(view, run_id)
    except ExportError as exc:  # the run is not in the view: said on the figure
        raise FigureError(str(exc)) from exc
    return activity_figure(series, title)


def register() -> None:
    """The section's callback, for the dashboard Dash is building now (called as Dash loads the explore page)."""
    callback(
        Output(ids.COMPARE_FIGURE, "figure"),
        Output(ids.COMPARE_RUN, "options"),
        Input(ids.SUMMARY, "data"),
        Input(ids.COMPARE_KIND, "value"),
        Input(ids.COMPARE_BY, "value"),
        Input(ids.COMPARE_STAT, "value"),
        Input(ids.COMPARE_RUN, "value"),
        State(ids.VIEW, "data"),
    )(draw)
