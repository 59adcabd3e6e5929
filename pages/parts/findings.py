"""The explore page's diagnosis, under the charts: per drawn run what held it back (each finding with its sentence, its
numbers and what to do), a button per finding that zooms the charts to the span it covers, the metrics it lacked (said
once), and its footprint with the factors it used. Read from the runs' tags (app/summary/findings.py): radt writes them
as a run ends, `radt import` as it imports, `radt diagnose` for the rest.

The zoom is the view's own (the ZOOM store, as a drag on the charts sets it): it goes into the URL like any zoom, and a
double-click on the charts shows the whole runs again."""

from __future__ import annotations

import math

import dash
import pandas as pd
from dash import ALL, Input, Output, State, callback, html, no_update

from radt.app.db.state import store_error
from radt.app.db.store import LIVE_STATUSES
from radt.app.summary.findings import RunDiagnosis, ShownFinding, footprint_text, run_diagnosis
from radt.app.view.views import View, span_zoom, view_runs
from radt.app.web import inputs
from radt.pages.parts import ids

OPEN_RUNS = 3  # a view of this many runs or fewer shows each run's diagnosis open; a longer one lists them folded


def layout() -> list:
    """The section: its heading and the runs' diagnoses (filled once the view is drawn)."""
    return [html.H3("Diagnosis"), html.Div(id=ids.FINDINGS, className="run-findings")]


def _when(span: tuple[int, int]) -> str:
    """A span as its UTC times, for the zoom button's tooltip."""
    low, high = (pd.Timestamp(ms, unit="ms").strftime("%Y-%m-%d %H:%M:%S") for ms in span)
    return f"{low} – {high} UTC"


def _finding(run_id: str, finding: ShownFinding) -> html.Li:
    zoom = []
    if finding.span is not None:
        zoom = [" ", html.Button("zoom to it", id=ids.finding_zoom(run_id, finding.code), className="finding-zoom", title=f"show {_when(finding.span)}")]
    return html.Li([html.Strong(finding.label), ": ", finding.sentence, *zoom], className="finding", **{"data-code": finding.code})


def _summary_line(name: str, found: RunDiagnosis, running: bool) -> str:
    if found.findings:
        return f"{name}: {', '.join(f.label for f in found.findings)}"
    if found.diagnosed:
        return f"{name}: nothing found"
    return f"{name}: {'running' if running else 'not diagnosed'}"


def _body(run_id: str, found: RunDiagnosis, running: bool) -> list:
    """A run's findings, what it lacked, its footprint; or why it has none."""
    if not found.diagnosed:
        said = (
            "Still running: its diagnosis is written when it ends (the Live page shows its last minutes)."
            if running
            else f"Not diagnosed yet: radt diagnose {run_id} writes it."
        )
        body: list = [html.P(said, className="hint")]
    elif found.findings:
        body = [html.Ul([_finding(run_id, f) for f in found.findings], className="findings")]
    else:
        body = [html.P("Nothing held it back that radt's rules can see.", className="hint")]
    if found.lacking:
        body.append(html.P(f"Not judged, for lack of series: {found.lacking}.", className="lacking hint"))
    text = footprint_text(found.figures)
    if text:
        body.append(html.P(["Footprint: ", text, f" ({found.basis})" if found.basis else ""], className="footprint"))
    return body


def panel(runs: pd.DataFrame) -> list:
    """Each run's diagnosis, in the view's order (rows of data.runs, their tags)."""
    if runs.empty:
        return [html.P("Pick runs on the left.", className="hint")]
    out = []
    for row in runs.itertuples():
        found = run_diagnosis(row.tags if isinstance(row.tags, dict) else {})
        running = row.status in LIVE_STATUSES
        out.append(
            html.Details(
                [html.Summary(_summary_line(str(row.run_name), found, running)), *_body(row.run_id, found, running)],
                open=len(runs) <= OPEN_RUNS,
                className="run-finding",
                **{"data-run": row.run_id},
            )
        )
    return out


def panel_of_view(view_data) -> list:
    """The panel of the view the charts just drew (the VIEW store)."""
    view = View.from_dict(view_data if isinstance(view_data, dict) else {})
    if not view.runs or store_error():
        return panel(pd.DataFrame())
    return panel(view_runs(view))


def zoom_to(_clicks, view_data, x_mode, group_mode):
    """A finding's button: the charts zoomed to the span it covers (the step axis gives way to time since start)."""
    trigger = dash.ctx.triggered_id
    clicked = dash.ctx.triggered[0].get("value") if dash.ctx.triggered else None
    if not isinstance(trigger, dict) or not inputs.count(clicked):
        return no_update, no_update  # a button drawn anew, not clicked
    view = View.from_dict(view_data if isinstance(view_data, dict) else {})
    run_id = inputs.run_id(trigger.get(ids.RUN_KEY))
    if run_id is None or run_id not in view.runs:
        return no_update, no_update
    runs = view_runs(view)
    row = runs[runs["run_id"] == run_id]
    if row.empty:
        return no_update, no_update
    span = next((f.span for f in run_diagnosis(row.iloc[0]["tags"]).findings if f.code == trigger.get(ids.CODE_KEY)), None)
    start = row.iloc[0]["start_time"]
    if span is None or start is None or not math.isfinite(float(start)):
        return no_update, no_update
    mode = group_mode if group_mode in ("runs", "grouped") else view.mode
    x, zoom = span_zoom(span, float(start), x_mode if isinstance(x_mode, str) else view.x, mode)
    return {"axis": f"{x}-{mode}", "range": zoom}, (x if x != x_mode else no_update)


def register() -> None:
    """The panel's callbacks, for the dashboard Dash is building now (called as Dash loads the explore page)."""
    callback(Output(ids.FINDINGS, "children"), Input(ids.VIEW, "data"))(panel_of_view)
    callback(
        Output(ids.ZOOM, "data", allow_duplicate=True),
        Output(ids.X_MODE, "value", allow_duplicate=True),
        Input(ids.finding_zoom(ALL, ALL), "n_clicks"),
        State(ids.VIEW, "data"),
        State(ids.X_MODE, "value"),
        State(ids.GROUP_MODE, "value"),
        prevent_initial_call=True,
    )(zoom_to)
