"""Explore past experiments: experiments → workloads → runs, overlaid hardware metrics.

The whole view (experiments, runs, metrics, axis, grouping, smoothing, log scale, chart columns) lives in
the URL's query string, so a reload or a shared link shows the same charts; each change is a history entry
(back and forward step through views, assets/page.js). The sidebar and the HTML legend stay in view while the charts
scroll (the legend over the charts only, in a fifth of the window at most: assets/page.css), and a view with a running
run is drawn again every few seconds. Under the charts each drawn run's diagnosis (pages/parts/findings.py): its findings,
each with a button that zooms the charts to the span it covers, and its footprint.
"""

from __future__ import annotations

import dash
import pandas as pd
from dash import ALL, ClientsideFunction, Input, Output, State, callback, clientside_callback, dcc, html

from radt import settings
from radt.app.db import deadline
from radt.app.db.runs import list_experiments, list_metric_keys, present_metrics
from radt.app.db.state import STATE, store_error
from radt.app.db.store import LIVE_STATUSES
from radt.app.figures.figures import GRAPH_CONFIG, empty_figure, legend_entries
from radt.app.view import data
from radt.app.view.data import DEFAULT_METRICS
from radt.app.view.views import View, in_added_order
from radt.app.web import responses
from radt.catalogue import METRICS, Metric, display_name, resolve, unit_text
from radt.pages.parts import comparison, export_panel, findings, ids, legend, run_picker, summary_table
from radt.pages.parts.unreadable import reads_store

dash.register_page(__name__, path="/", name="Explore", title="radt · explore", order=0)

LIVE_REDRAW_MS = round(settings.LIVE_REDRAW.get() * 1000)  # a drawn run still RUNNING: the charts are drawn again this often (RADT_LIVE_REDRAW)


def _runs(experiment_ids: list[str]) -> pd.DataFrame:
    return data.runs(experiment_ids or [])


def metric_label(metric: Metric) -> str:
    """A catalogue metric in the picker: its name and unit (radt.catalogue.unit_text), and "every GPU" for a per-GPU one, whose
    chart draws each GPU of each run (a host metric, CPU or disk, is the host's: no GPU in its label)."""
    return f"{metric.label} · {unit_text(metric)}" + (" · every GPU" if metric.per_gpu else "")


def metric_options(run_ids: list[str]) -> list[dict]:
    """Catalogue metrics first (common ones preselected), then every stored key of the runs: one GPU's, one MIG
    slice's or one node's series alone (`SMACT (GPU 1)`), and the runs' own metrics."""
    options = [{"label": metric_label(METRICS[s[4:]]), "value": s} for s in DEFAULT_METRICS]
    if not run_ids or STATE.engine is None:
        return options
    seen = {o["value"] for o in options}
    single = []
    for key in list_metric_keys(STATE.engine, run_ids):
        resolved = resolve(key)
        spec = f"cat:{resolved.metric.name}" if resolved else f"key:{key}"
        if spec not in seen:
            seen.add(spec)
            options.append({"label": metric_label(resolved.metric) if resolved else key, "value": spec})
        if resolved and resolved.device.label:  # the one series, findable by its key or its device
            single.append({"label": f"{display_name(key)} · {key}", "value": f"key:{key}"})
    return options + single


def gpu_options(run_ids: list[str]) -> list[dict]:
    """The GPU indices the runs stored series for (any node, any MIG slice), for the GPU filter."""
    if not run_ids or STATE.engine is None:
        return []
    gpus = sorted({g for _name, g in present_metrics(STATE.engine, run_ids) if g is not None})
    return [{"label": f"GPU {g}", "value": str(g)} for g in gpus]


@reads_store
def layout(
    exp: str | None = None,
    runs: str | None = None,
    metrics: str | None = None,
    x: str = "relative",
    mode: str = "runs",
    smooth: str = "0",
    log: str = "0",
    xr: str | None = None,
    gpu: str | None = None,
    gpuagg: str | None = None,
    cols: str | None = None,
    q: str | None = None,
    dev: str | None = None,
    **_ignored,
):
    experiments = list_experiments(STATE.engine)
    # the link is typed, pasted, edited: View.from_dict keeps what it can use and says what it ignored
    view = View.from_dict(
        {"exp": exp, "runs": runs, "metrics": metrics, "x": x, "mode": mode, "smooth": smooth, "log": log, "xr": xr, "gpu": gpu, "gpuagg": gpuagg, "cols": cols}
        | {"q": q, "dev": dev}
    )
    exp_ids = [e for e in view.experiments if e in {str(x["experiment_id"]) for x in experiments}]
    table = _runs(exp_ids)
    selected = set(view.runs) & set(table["run_id"])  # only runs of the ticked experiments reach a query
    view.experiments = exp_ids
    return html.Div(
        [
            html.Aside(run_picker.sidebar(experiments, exp_ids, table, selected, view.query), className="sidebar"),
            html.Main(
                [
                    html.Div(
                        [
                            dcc.Dropdown(
                                id=ids.METRICS,
                                options=metric_options(list(selected)),
                                value=view.metrics,
                                multi=True,
                                placeholder="metrics (type to find any key)",
                                className="metric-picker",
                            ),
                            dcc.RadioItems(
                                id=ids.X_MODE,
                                options=[
                                    {"label": "since start", "value": "relative"},
                                    {"label": "wall clock", "value": "wall"},
                                    {"label": "step", "value": "step"},
                                ],
                                value=view.x,
                                inline=True,
                            ),
                            dcc.RadioItems(
                                id=ids.GROUP_MODE,
                                options=[{"label": "runs", "value": "runs"}, {"label": "grouped per workload", "value": "grouped"}],
                                value=view.mode,
                                inline=True,
                            ),
                            html.Label(
                                [
                                    "smoothing",
                                    dcc.Slider(
                                        id=ids.SMOOTHING,
                                        min=0,
                                        max=0.99,
                                        step=0.01,
                                        value=view.smoothing,
                                        marks={0: "0", 0.9: "0.9"},
                                        tooltip={"placement": "bottom"},
                                    ),
                                ],
                                className="smoothing",
                            ),
                            dcc.Checklist(id=ids.LOG_Y, options=[{"label": "log scale", "value": "log"}], value=["log"] if view.log_y else [], inline=True),
                            html.Span(
                                [
                                    html.Span("charts per row", className="label"),
                                    dcc.RadioItems(id=ids.COLUMNS, options=[{"label": str(n), "value": n} for n in (1, 2, 3)], value=view.columns, inline=True),
                                ],
                                className="columns-choice",
                            ),
                            html.Span(id=ids.LIVE_BADGE, className="live-badge"),
                        ],
                        className="controls",
                    ),
                    html.Div(
                        [
                            html.Span("GPUs: "),
                            dcc.RadioItems(
                                id=ids.GPU_MODE,
                                options=[{"label": "each GPU", "value": "each"}, {"label": "mean per run (min–max band)", "value": "mean"}],
                                value=view.gpu_mode,
                                inline=True,
                            ),
                            html.Span(" only: "),
                            dcc.Checklist(
                                id=ids.GPU_FILTER,
                                options=gpu_options(list(selected)),
                                value=[str(g) for g in view.gpus or []],
                                inline=True,
                                className="gpu-filter",
                            ),
                            html.Span("(none ticked: every GPU)", className="hint"),
                        ],
                        className="controls gpu-controls",
                    ),
                    html.P(_notes(view.notes), id=ids.VIEW_NOTE, className="hint view-note"),
                    html.Div(  # the legend stays in view over the charts only: past them it leaves with them (issue 52)
                        [
                            html.Div(
                                [
                                    html.Div(id=ids.LEGEND, className="chart-legend", title="hover: highlight a run; click: keep it highlighted"),
                                    html.Div(className="legend-below"),  # assets/charts.js: how many runs' rows lie below the legend's fold
                                ],
                                className="page-bar",
                            ),
                            dcc.Loading(
                                dcc.Graph(
                                    id=ids.CHARTS,
                                    figure=empty_figure("Pick runs on the left."),
                                    config=GRAPH_CONFIG,
                                ),
                                delay_show=300,
                                overlay_style={"visibility": "visible", "opacity": 0.6},  # the charts stay in view while drawn again
                            ),
                        ],
                        className="chart-section",
                    ),
                    *findings.layout(),
                    *export_panel.layout(),
                    *summary_table.layout(),
                    *comparison.layout(),
                    dcc.Store(id=ids.VIEW, data=view.to_dict()),
                    dcc.Store(id=ids.ZOOM, data={"axis": f"{view.x}-{view.mode}", "range": view.zoom}),
                    html.Div(id=ids.URL_SINK, hidden=True),
                    dcc.Interval(id=ids.EXPLORE_TICK, interval=LIVE_REDRAW_MS, disabled=True),
                ],
                className="content",
            ),
        ],
        className="explore",
    )


@callback(Output(ids.METRICS, "options"), Output(ids.GPU_FILTER, "options"), Input(ids.workload_runs(ALL), "value"), prevent_initial_call=True)
def refresh_metric_options(values):
    run_ids = View.from_dict({"runs": values if isinstance(values, list) else []}).runs
    return metric_options(run_ids), gpu_options(run_ids)


def _notes(notes: list[str]) -> str:
    """What the view left out of the link or the controls, in one line on the page ('' when nothing)."""
    return ("Ignored in this view: " + "; ".join(notes) + ".") if notes else ""


@callback(
    Output(ids.CHARTS, "figure"),
    Output(ids.VIEW, "data"),
    Output(ids.VIEW_NOTE, "children"),
    Output(ids.LEGEND, "children"),
    Input(ids.workload_runs(ALL), "value"),
    Input(ids.METRICS, "value"),
    Input(ids.X_MODE, "value"),
    Input(ids.GROUP_MODE, "value"),
    Input(ids.SMOOTHING, "value"),
    Input(ids.LOG_Y, "value"),
    Input(ids.ZOOM, "data"),
    Input(ids.GPU_FILTER, "value"),
    Input(ids.GPU_MODE, "value"),
    Input(ids.COLUMNS, "value"),
    Input(ids.EXPLORE_TICK, "n_intervals"),
    State(ids.EXPERIMENTS, "value"),
    State(ids.RUN_FILTER, "value"),
    State(ids.VIEW, "data"),
)
def draw(run_groups, metric_specs, x_mode, group_mode, smoothing, log_y, zoom_state, gpu_filter, gpu_mode, columns, _tick, experiment_ids, query, shown):
    """The charts, the view for the URL and its notes, and the sticky legend (a tick: a running run grew).

    The summary table follows from the view in a callback of its own (pages/parts/summary_table.py): its figures
    need the runs' alone and together partners, which can be hundreds; the charts do not wait for them."""
    # the controls' values arrive as the browser sent them: View.from_dict reads them like a link
    groups = [group for group in (run_groups if isinstance(run_groups, list) else []) if isinstance(group, list)]
    run_ids = [run_id for group in groups for run_id in group if isinstance(run_id, str)]
    before = View.from_dict({"runs": shown.get("runs")}).runs if isinstance(shown, dict) else []
    run_ids = in_added_order(before, run_ids)  # a run's place in the view is its colour: a newly ticked run comes last
    zoom_state = zoom_state if isinstance(zoom_state, dict) else {}
    # a range in minutes means nothing on a wall-clock or step axis: the zoom belongs to its axis
    zoom = zoom_state.get("range") if zoom_state.get("axis") == f"{x_mode}-{group_mode}" else None
    picked = [m for m in metric_specs if isinstance(m, str)] if isinstance(metric_specs, list) else []
    raw = {"exp": experiment_ids, "runs": run_ids, "metrics": picked, "x": x_mode, "mode": group_mode, "smooth": smoothing, "xr": zoom}
    device = shown.get("dev") if isinstance(shown, dict) else None  # the link's dev=1 (the shared GPUs' device line), kept
    view = View.from_dict(raw | {"log": "1" if log_y else "0", "gpu": gpu_filter, "gpuagg": gpu_mode, "cols": columns, "q": query, "dev": device})
    if not picked:
        view.metrics = []  # the picker emptied (a link without metrics means the default ones)
    note = _notes(view.notes)
    if not view.runs:
        return empty_figure("Pick runs on the left."), view.to_dict(), note, []
    if not view.metrics:
        return empty_figure("Pick at least one metric."), view.to_dict(), note, []
    try:
        rendered = responses.render(view)  # the whole response is kept for views of ended runs (app/web/responses.py)
    except Exception as exc:
        if not deadline.timed_out(exc):
            raise
        return empty_figure(deadline.message(exc)), view.to_dict(), note, []
    if not rendered.panels:
        return empty_figure("None of the chosen metrics exists in these runs."), view.to_dict(), note, []
    rendered.figure.update_layout(showlegend=False)  # the screen's legend is the sticky HTML one; exports keep Plotly's
    return rendered.figure, view.to_dict(), note, legend.children(legend_entries(rendered))


clientside_callback(
    ClientsideFunction(namespace="radt", function_name="zoom"),
    Output(ids.ZOOM, "data"),
    Input(ids.CHARTS, "relayoutData"),
    State(ids.ZOOM, "data"),
    State(ids.X_MODE, "value"),
    State(ids.GROUP_MODE, "value"),
    prevent_initial_call=True,
)

# the view into the URL (assets/page.js): a user's change is a history entry, so back and forward step through views
clientside_callback(ClientsideFunction(namespace="radt_page", function_name="sync_url"), Output(ids.URL_SINK, "children"), Input(ids.VIEW, "data"))


@callback(Output(ids.EXPLORE_TICK, "disabled"), Output(ids.LIVE_BADGE, "children"), Input(ids.VIEW, "data"), Input(ids.EXPLORE_TICK, "n_intervals"))
def follow_running(view_data, _tick):
    """Redraw every LIVE_REDRAW_MS while a drawn run is still running, and say which runs those are."""
    view = View.from_dict(view_data if isinstance(view_data, dict) else {})
    if not view.runs or store_error():
        return True, []
    runs = _runs(view.experiments)
    running = runs[runs["run_id"].isin(view.runs) & runs["status"].isin(LIVE_STATUSES)]
    if running.empty:
        return True, []
    names = ", ".join(running["run_name"].astype(str).head(5)) + (f" and {len(running) - 5} more" if len(running) > 5 else "")
    return False, [html.Span("●", className="dot"), f" live: {names}"]


run_picker.register()
summary_table.register()
findings.register()
comparison.register()
export_panel.register()  # Dash runs this file once per dashboard it builds: the panel's callbacks once each
