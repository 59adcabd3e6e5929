"""Explore past experiments: experiments → workloads → runs, overlaid hardware metrics.

The whole view (experiments, runs, metrics, axis, grouping, smoothing, log scale) lives in the
URL's query string, so a reload or a shared link shows the same charts.
"""

from __future__ import annotations

from urllib.parse import urlencode

import dash
import pandas as pd
from dash import ALL, MATCH, ClientsideFunction, Input, Output, State, callback, clientside_callback, ctx, dash_table, dcc, html

from app import data, queries
from app.catalogue import METRICS, MIG_ACTIVITY_TAG, display_name, resolve
from app.data import DEFAULT_METRICS
from app.figures import empty_figure
from app.state import STATE, store_error
from app.views import View, ViewError, render, save_view

dash.register_page(__name__, path="/", name="Explore", title="radt · explore", order=0)

STATUS_ICON = {"FINISHED": "✓", "FAILED": "✗", "KILLED": "■", "RUNNING": "▶", "SCHEDULED": "…"}


def _duration(seconds: float) -> str:
    if seconds != seconds:  # NaN: still running without an end
        return "–"
    minutes = seconds / 60
    return f"{minutes:.0f} min" if minutes < 120 else f"{minutes / 60:.1f} h"


def _runs(experiment_ids: list[str]) -> pd.DataFrame:
    return data.runs(experiment_ids or [])


def _matches(row: pd.Series, text: str) -> bool:
    if not text:
        return True
    hay = " ".join(
        [str(row["run_name"]), str(row["workload_label"]), str(row["letter"]), str(row["status"])] + [f"{k}={v}" for k, v in (row["params"] or {}).items()]
    )
    return all(word in hay.lower() for word in text.lower().split())


def _caveat(tags) -> str:
    """What a reader must know before comparing this run's GPU series: its MIG slice's own activity was not recorded."""
    reason = (tags or {}).get(MIG_ACTIVITY_TAG) if isinstance(tags, dict) else None
    return f" · ⚠ MIG slice activity not recorded ({reason})" if reason else ""


def run_tree(runs: pd.DataFrame, selected: set[str], text: str = "") -> list:
    """One collapsible block per workload with a select-all box and its runs' boxes."""
    if runs.empty:
        return [html.P("Tick an experiment to list its workloads and runs.", className="hint")]
    blocks = []
    for (experiment_id, workload_id), group in runs.groupby(["experiment_id", "workload_id"], sort=False):
        shown = group[[_matches(r, text) for _, r in group.iterrows()]]
        if shown.empty:
            continue
        options = [
            {
                "label": f"{STATUS_ICON.get(r.status, '?')} {(r.letter + ' · ') if r.letter else ''}{r.run_name} · {_duration(r.duration_s)}{_caveat(r.tags)}",
                "value": r.run_id,
            }
            for r in shown.itertuples()
        ]
        values = [o["value"] for o in options if o["value"] in selected]
        all_on = ["all"] if values and len(values) == len(options) else []
        blocks.append(
            html.Details(
                [
                    html.Summary(
                        [
                            dcc.Checklist(
                                id={"type": "wl-all", "wl": workload_id},
                                options=[{"label": f"{group['workload_label'].iloc[0]} ({len(group)})", "value": "all"}],
                                value=all_on,
                                className="wl-all",
                                inline=True,
                            )
                        ]
                    ),
                    dcc.Checklist(id={"type": "wl-runs", "wl": workload_id}, options=options, value=values, className="wl-runs"),
                ],
                open=bool(values) or len(runs) <= 40,
                className="workload",
                **{"data-experiment": experiment_id},
            )
        )
    return blocks or [html.P("No run matches the filter.", className="hint")]


def metric_options(run_ids: list[str]) -> list[dict]:
    """Catalogue metrics first (common ones preselected; each chart draws every GPU), then every stored key of
    the runs: one GPU's, one MIG slice's or one node's series alone (`SMACT (GPU 1)`), and the runs' own metrics."""
    options = [{"label": f"{METRICS[s[4:]].label} · {METRICS[s[4:]].unit} · every GPU", "value": s} for s in DEFAULT_METRICS]
    if not run_ids or STATE.engine is None:
        return options
    seen = {o["value"] for o in options}
    single = []
    for key in queries.list_metric_keys(STATE.engine, run_ids):
        resolved = resolve(key)
        spec = f"cat:{resolved.metric.name}" if resolved else f"key:{key}"
        if spec not in seen:
            seen.add(spec)
            every = " · every GPU" if resolved and resolved.metric.per_gpu else ""
            label = f"{resolved.metric.label} · {resolved.metric.unit}{every}" if resolved else key
            options.append({"label": label, "value": spec})
        if resolved and resolved.device.label:  # the one series, findable by its key or its device
            single.append({"label": f"{display_name(key)} · {key}", "value": f"key:{key}"})
    return options + single


def gpu_options(run_ids: list[str]) -> list[dict]:
    """The GPU indices the runs stored series for (any node, any MIG slice), for the GPU filter."""
    if not run_ids or STATE.engine is None:
        return []
    gpus = sorted({g for _name, g in queries.present_metrics(STATE.engine, run_ids) if g is not None})
    return [{"label": f"GPU {g}", "value": str(g)} for g in gpus]


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
    **_ignored,
):
    error = store_error()
    if error:
        return html.Div(
            [
                html.H2("The tracking store cannot be read"),
                html.P(error, id="store-error-reason"),
                html.P("Start the database (or fix the URI: python app.py --store URI), then reload this page."),
            ],
            className="store-error",
        )
    experiments = queries.list_experiments(STATE.engine)
    # the link is typed, pasted, edited: View.from_dict keeps what it can use and says what it ignored
    view = View.from_dict(
        {"exp": exp, "runs": runs, "metrics": metrics, "x": x, "mode": mode, "smooth": smooth, "log": log, "xr": xr, "gpu": gpu, "gpuagg": gpuagg}
    )
    exp_ids = [e for e in view.experiments if e in {str(x["experiment_id"]) for x in experiments}]
    table = _runs(exp_ids)
    selected = set(view.runs) & set(table["run_id"])  # only runs of the ticked experiments reach a query
    view.experiments = exp_ids
    return html.Div(
        [
            html.Aside(
                [
                    html.H3("Experiments"),
                    dcc.Checklist(
                        id="experiments",
                        options=[{"label": f"{e['name']} ({e['runs']})", "value": e["experiment_id"]} for e in experiments],
                        value=exp_ids,
                        className="experiments",
                    ),
                    dcc.Input(id="run-filter", type="search", placeholder="filter runs: name, letter, param=value", debounce=True, className="filter"),
                    html.H3("Workloads and runs"),
                    html.Div(run_tree(table, selected), id="run-tree"),
                ],
                className="sidebar",
            ),
            html.Main(
                [
                    html.Div(
                        [
                            dcc.Dropdown(
                                id="metrics",
                                options=metric_options(list(selected)),
                                value=view.metrics,
                                multi=True,
                                placeholder="metrics (type to find any key)",
                                className="metric-picker",
                            ),
                            dcc.RadioItems(
                                id="x-mode",
                                options=[
                                    {"label": "since start", "value": "relative"},
                                    {"label": "wall clock", "value": "wall"},
                                    {"label": "step", "value": "step"},
                                ],
                                value=view.x,
                                inline=True,
                            ),
                            dcc.RadioItems(
                                id="group-mode",
                                options=[{"label": "runs", "value": "runs"}, {"label": "grouped per workload", "value": "grouped"}],
                                value=view.mode,
                                inline=True,
                            ),
                            html.Label(
                                [
                                    "smoothing",
                                    dcc.Slider(
                                        id="smoothing",
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
                            dcc.Checklist(id="log-y", options=[{"label": "log scale", "value": "log"}], value=["log"] if view.log_y else [], inline=True),
                        ],
                        className="controls",
                    ),
                    html.Div(
                        [
                            html.Span("GPUs: "),
                            dcc.RadioItems(
                                id="gpu-mode",
                                options=[{"label": "each GPU", "value": "each"}, {"label": "mean per run (min–max band)", "value": "mean"}],
                                value=view.gpu_mode,
                                inline=True,
                            ),
                            html.Span(" only: "),
                            dcc.Checklist(
                                id="gpu-filter",
                                options=gpu_options(list(selected)),
                                value=[str(g) for g in view.gpus or []],
                                inline=True,
                                className="gpu-filter",
                            ),
                            html.Span("(none ticked: every GPU)", className="hint"),
                        ],
                        className="controls gpu-controls",
                    ),
                    html.P(_notes(view.notes), id="view-note", className="hint view-note"),
                    dcc.Loading(
                        dcc.Graph(
                            id="charts", figure=empty_figure("Pick runs on the left."), config={"displaylogo": False, "toImageButtonOptions": {"format": "svg"}}
                        ),
                        delay_show=300,
                    ),
                    export_panel(),
                    html.H3("Summary"),
                    html.P(
                        "Steps: the highest step the script logged + 1 (epochs, iterations). Duration: the script's own time, start to exit "
                        "(not radt's set-up). Steps/h = steps ÷ duration. Together: runs of a workload whose times overlapped (1: it ran alone). "
                        "Alone steps/h: the mean over the alone runs, finished runs of the same command in the same experiment that ran by "
                        "themselves; normalised = steps/h ÷ alone steps/h. SMACT and SMOCC: every point of every GPU of the run. "
                        "A row of runs together: steps/h and normalised are the sums of its runs' (above 1: more work per hour than the "
                        "same runs one after another), duration from the first start to the last exit, energy per GPU the largest of its "
                        "runs' (runs on one GPU read the same counter), summed over its GPUs.",
                        className="hint",
                    ),
                    dash_table.DataTable(
                        id="summary",
                        columns=[{"name": n, "id": i} for n, i in SUMMARY_COLUMNS],
                        data=[],
                        sort_action="native",
                        style_table={"overflowX": "auto"},
                        style_cell={"fontFamily": "inherit", "fontSize": 13, "padding": "4px 8px"},
                        style_data_conditional=[{"if": {"filter_query": '{kind} = "workload"'}, "fontWeight": "600", "backgroundColor": "#f4f0fa"}],
                    ),
                    dcc.Store(id="view", data=view.to_dict()),
                    dcc.Download(id="export-download"),
                    dcc.Store(id="open-view-query"),
                    html.Div(id="open-view-sink", hidden=True),
                    dcc.Store(id="zoom", data={"axis": f"{view.x}-{view.mode}", "range": view.zoom}),
                    html.Div(id="url-sink", hidden=True),
                ],
                className="content",
            ),
        ],
        className="explore",
    )


@callback(
    Output("run-tree", "children"),
    Input("experiments", "value"),
    Input("run-filter", "value"),
    State({"type": "wl-runs", "wl": ALL}, "value"),
    prevent_initial_call=True,
)
def refresh_tree(experiment_ids, text, current):
    selected = set(View.from_dict({"runs": current if isinstance(current, list) else []}).runs)
    return run_tree(_runs(View.from_dict({"exp": experiment_ids}).experiments), selected, text if isinstance(text, str) else "")


@callback(
    Output({"type": "wl-runs", "wl": MATCH}, "value"),
    Input({"type": "wl-all", "wl": MATCH}, "value"),
    State({"type": "wl-runs", "wl": MATCH}, "options"),
    prevent_initial_call=True,
)
def select_workload(all_value, options):
    return [o["value"] for o in options if isinstance(o, dict) and "value" in o] if all_value and isinstance(options, list) else []


@callback(Output("metrics", "options"), Output("gpu-filter", "options"), Input({"type": "wl-runs", "wl": ALL}, "value"), prevent_initial_call=True)
def refresh_metric_options(values):
    run_ids = View.from_dict({"runs": values if isinstance(values, list) else []}).runs
    return metric_options(run_ids), gpu_options(run_ids)


def _notes(notes: list[str]) -> str:
    """What the view left out of the link or the controls, in one line on the page ('' when nothing)."""
    return ("Ignored in this view: " + "; ".join(notes) + ".") if notes else ""


@callback(
    Output("charts", "figure"),
    Output("summary", "data"),
    Output("view", "data"),
    Output("view-note", "children"),
    Input({"type": "wl-runs", "wl": ALL}, "value"),
    Input("metrics", "value"),
    Input("x-mode", "value"),
    Input("group-mode", "value"),
    Input("smoothing", "value"),
    Input("log-y", "value"),
    Input("zoom", "data"),
    Input("gpu-filter", "value"),
    Input("gpu-mode", "value"),
    State("experiments", "value"),
)
def draw(run_groups, metric_specs, x_mode, group_mode, smoothing, log_y, zoom_state, gpu_filter, gpu_mode, experiment_ids):
    # the controls' values arrive as the browser sent them: View.from_dict reads them like a link
    run_ids = [run_id for group in (run_groups if isinstance(run_groups, list) else []) if isinstance(group, list) for run_id in group]
    zoom_state = zoom_state if isinstance(zoom_state, dict) else {}
    # a range in minutes means nothing on a wall-clock or step axis: the zoom belongs to its axis
    zoom = zoom_state.get("range") if zoom_state.get("axis") == f"{x_mode}-{group_mode}" else None
    picked = [m for m in metric_specs if isinstance(m, str)] if isinstance(metric_specs, list) else []
    raw = {"exp": experiment_ids, "runs": run_ids, "metrics": picked, "x": x_mode, "mode": group_mode, "smooth": smoothing, "xr": zoom}
    view = View.from_dict(raw | {"log": "1" if log_y else "0", "gpu": gpu_filter, "gpuagg": gpu_mode})
    if not picked:
        view.metrics = []  # the picker emptied (a link without metrics means the default ones)
    note = _notes(view.notes)
    if not view.runs:
        return empty_figure("Pick runs on the left."), [], view.to_dict(), note
    if not view.metrics:
        return empty_figure("Pick at least one metric."), [], view.to_dict(), note
    rendered = render(view)
    if not rendered.panels:
        return empty_figure("None of the chosen metrics exists in these runs."), _summary(view, rendered.runs), view.to_dict(), note
    return rendered.figure, _summary(view, rendered.runs), view.to_dict(), note


SUMMARY_COLUMNS = [
    ("run", "run"),
    ("workload", "workload"),
    ("letter", "letter"),
    ("status", "status"),
    ("runs together", "together"),
    ("steps", "steps"),
    ("duration (min, script)", "duration_min"),
    ("steps/h (steps ÷ duration)", "steps_per_h"),
    ("alone runs", "alone_runs"),
    ("alone steps/h (mean of alone runs)", "alone_steps_per_h"),
    ("normalised (steps/h ÷ alone steps/h)", "normalised"),
    ("mean SMACT (all GPUs)", "smact_mean"),
    ("p95 SMACT (all GPUs)", "smact_p95"),
    ("mean SMOCC (all GPUs)", "smocc_mean"),
    ("p95 SMOCC (all GPUs)", "smocc_p95"),
    ("peak memory per GPU (MB)", "peak_memory_per_gpu_mb"),
    ("energy (kJ, all GPUs)", "energy_kj"),
    ("mean CPU %", "cpu_mean"),
]
DIGITS = {"together": 0, "steps": 0, "duration_min": 2, "steps_per_h": 2, "alone_runs": 0, "alone_steps_per_h": 2, "normalised": 3, "smact_mean": 3,
          "smact_p95": 3, "smocc_mean": 3, "smocc_p95": 3, "peak_memory_per_gpu_mb": 0, "energy_kj": 1, "cpu_mean": 1}  # fmt: skip


def _summary(view: View, runs: pd.DataFrame) -> list[dict]:
    """The comparison table (app/compare.py, the same as `radt export --table`) of the drawn runs, rounded for the screen."""
    from app.export import comparison_table

    if runs.empty:
        return []
    table = comparison_table(view, runs)
    rows = []
    for record in table.to_dict("records"):
        for column, digits in DIGITS.items():
            value = record.get(column)
            record[column] = None if value is None or value != value else (round(float(value), digits) if digits else int(round(float(value))))
        rows.append({k: (None if isinstance(v, float) and v != v else v) for k, v in record.items()})
    return rows


clientside_callback(
    ClientsideFunction(namespace="radt", function_name="zoom"),
    Output("zoom", "data"),
    Input("charts", "relayoutData"),
    State("zoom", "data"),
    State("x-mode", "value"),
    State("group-mode", "value"),
    prevent_initial_call=True,
)

clientside_callback(
    """
    function(view) {
        if (!view) { return window.dash_clientside.no_update; }
        const query = new URLSearchParams(view).toString();
        if (window.location.search !== "?" + query) {
            window.history.replaceState(null, "", window.location.pathname + "?" + query);
        }
        return "";
    }
    """,
    Output("url-sink", "children"),
    Input("view", "data"),
)


def view_query(view: dict) -> str:
    """The query string of a view, as the page writes it into the URL."""
    return urlencode(view)


# --- export: paper figures, their data, and saved views (app/export.py, app/views.py) -------------


def export_panel() -> html.Details:
    """Size, font, colour or monochrome, legend, DPI; PNG/SVG/PDF/CSV downloads; save and open a view."""
    from app.export import LEGENDS, SIZES

    return html.Details(
        [
            html.Summary("Export"),
            html.Div(
                [
                    html.Label(["size", dcc.Dropdown(id="export-size", options=list(SIZES), value="double-column", clearable=False)]),
                    # no min/max: the browser would send an out-of-range number as nothing; the server bounds them and says so
                    html.Label(["font (pt)", dcc.Input(id="export-font", type="number", value=9)]),
                    html.Label(["DPI (PNG)", dcc.Input(id="export-dpi", type="number", value=300)]),
                    html.Label(["legend", dcc.Dropdown(id="export-legend", options=list(LEGENDS), value="top", clearable=False)]),
                    dcc.RadioItems(
                        id="export-colour",
                        options=[{"label": "colour", "value": "colour"}, {"label": "monochrome", "value": "mono"}],
                        value="colour",
                        inline=True,
                    ),
                ],
                className="export-options",
            ),
            html.Div([html.Span("charts: "), dcc.Checklist(id="export-charts", options=[], value=[], inline=True)], className="export-charts"),
            html.Div(
                [html.Button(fmt.upper(), id={"type": "export", "fmt": fmt}, n_clicks=0, className="export-button") for fmt in ("png", "svg", "pdf", "csv")]
                + [html.Button("table CSV", id={"type": "export", "fmt": "table"}, n_clicks=0, className="export-button")]
                + [
                    html.Button("save view", id="save-view", n_clicks=0, className="export-button"),
                    dcc.Upload(html.Button("open view", className="export-button"), id="open-view"),
                ],
                className="export-buttons",
            ),
            html.Div(id="export-status", className="export-status"),
        ],
        className="export",
    )


@callback(
    Output("export-charts", "options"),
    Output("export-charts", "value"),
    Input("metrics", "value"),
)
def export_charts(metric_specs):
    """Every chart on screen is exported unless unticked here."""
    from app.data import spec_metric

    specs = View.from_dict({"metrics": metric_specs}).metrics if metric_specs else []
    return [{"label": spec_metric(spec).label, "value": spec} for spec in specs], specs


@callback(
    Output("export-download", "data"),
    Output("export-status", "children"),
    Input({"type": "export", "fmt": ALL}, "n_clicks"),
    Input("save-view", "n_clicks"),
    State("view", "data"),
    State("export-size", "value"),
    State("export-font", "value"),
    State("export-dpi", "value"),
    State("export-legend", "value"),
    State("export-colour", "value"),
    State("export-charts", "value"),
    prevent_initial_call=True,
)
def export(_clicks, _save, view_data, size, font, dpi, legend, colour, charts):
    """The chosen file as a download, with a line saying what was left out or what went wrong."""
    from app.export import FORMATS, ExportError, ExportStyle, check_style, comparison_table, data_csv, figure_for, image_bytes

    view = View.from_dict(view_data)
    if ctx.triggered_id == "save-view":
        return {"content": save_view(view), "filename": "radt-view.json", "type": "application/json"}, "view saved"
    fmt = ctx.triggered_id.get("fmt") if isinstance(ctx.triggered_id, dict) else None
    charts = [c for c in charts if c in view.metrics] if isinstance(charts, list) else []  # the view's own (checked) metrics only
    try:
        if fmt == "table":
            csv_text = comparison_table(view).to_csv(index=False, float_format="%.6g")
            return {"content": csv_text, "filename": "radt-table.csv", "type": "text/csv"}, "comparison table exported"
        if fmt not in FORMATS:
            return dash.no_update, f"cannot export '{str(fmt)[:20]}'; choose PNG, SVG, PDF or CSV"
        if not charts:
            return dash.no_update, "tick at least one chart to export"
        if fmt == "csv":
            text, missing = data_csv(view, charts)
            download = {"content": text, "filename": "radt-data.csv", "type": "text/csv"}
        else:  # bounded here, not by the form: a request can carry any DPI (a PNG's pixels are capped in image_bytes)
            style = check_style(ExportStyle(size, 9 if font is None else font, colour == "mono", legend, dpi, charts), fmt)
            figure, missing = figure_for(view, style)
            download = dcc.send_bytes(image_bytes(figure, fmt, style.dpi), f"radt-figure.{fmt}")
    except (ExportError, ValueError) as exc:
        return dash.no_update, str(exc)
    left_out = "; ".join(f"{spec.partition(':')[2]} absent from {', '.join(names)}" for spec, names in missing.items())
    return download, f"{fmt.upper()} exported" + (f" ({left_out}: those runs are left out of that chart)" if left_out else "")


@callback(
    Output("open-view-query", "data"),
    Output("export-status", "children", allow_duplicate=True),
    Input("open-view", "contents"),
    prevent_initial_call=True,
)
def open_view(contents: str | None):
    """A saved view file opens as this page's URL (the URL is the view)."""
    import base64
    import json

    try:
        raw = json.loads(base64.b64decode((contents if isinstance(contents, str) and "," in contents else ",").split(",", 1)[1]))
        if not isinstance(raw, dict) or "runs" not in raw:
            raise ViewError("not a radt view (no 'runs')")
    except (ValueError, ViewError) as exc:
        return dash.no_update, f"cannot open that file: {exc}; choose a view saved with 'save view'"
    return view_query(View.from_dict(raw).to_dict()), "opening the view"


clientside_callback(  # the URL is the view: open the saved one by loading its URL
    "function(query) { if (query) { window.location.assign(window.location.pathname + '?' + query); } return ''; }",
    Output("open-view-sink", "children"),
    Input("open-view-query", "data"),
    prevent_initial_call=True,
)
