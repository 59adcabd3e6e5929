"""Explore past experiments: experiments → workloads → runs, overlaid hardware metrics.

The whole view (experiments, runs, metrics, axis, grouping, smoothing, log scale) lives in the
URL's query string, so a reload or a shared link shows the same charts.
"""

from __future__ import annotations

import dash
import pandas as pd
from dash import ALL, MATCH, ClientsideFunction, Input, Output, State, callback, clientside_callback, dash_table, dcc, html

from radt.app import data
from radt.app.data import DEFAULT_METRICS
from radt.app.figures import empty_figure
from radt.app.runs import list_experiments, list_metric_keys, present_metrics
from radt.app.state import STATE, store_error
from radt.app.views import View, render
from radt.catalogue import METRICS, display_name, resolve
from radt.pages import export_panel, ids
from radt.runmodel import MIG_ACTIVITY_TAG

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
                                id=ids.workload_all(workload_id),
                                options=[{"label": f"{group['workload_label'].iloc[0]} ({len(group)})", "value": "all"}],
                                value=all_on,
                                className="wl-all",
                                inline=True,
                            )
                        ]
                    ),
                    dcc.Checklist(id=ids.workload_runs(workload_id), options=options, value=values, className="wl-runs"),
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
    for key in list_metric_keys(STATE.engine, run_ids):
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
    gpus = sorted({g for _name, g in present_metrics(STATE.engine, run_ids) if g is not None})
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
                html.P(error, id=ids.STORE_ERROR_REASON),
                html.P("Start the database (or fix the URI: python app.py --store URI), then reload this page."),
            ],
            className="store-error",
        )
    experiments = list_experiments(STATE.engine)
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
                        id=ids.EXPERIMENTS,
                        options=[{"label": f"{e['name']} ({e['runs']})", "value": e["experiment_id"]} for e in experiments],
                        value=exp_ids,
                        className="experiments",
                    ),
                    dcc.Input(id=ids.RUN_FILTER, type="search", placeholder="filter runs: name, letter, param=value", debounce=True, className="filter"),
                    html.H3("Workloads and runs"),
                    html.Div(run_tree(table, selected), id=ids.RUN_TREE),
                ],
                className="sidebar",
            ),
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
                    dcc.Loading(
                        dcc.Graph(
                            id=ids.CHARTS,
                            figure=empty_figure("Pick runs on the left."),
                            config={"displaylogo": False, "toImageButtonOptions": {"format": "svg"}},
                        ),
                        delay_show=300,
                    ),
                    *export_panel.layout(),
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
                        id=ids.SUMMARY,
                        columns=[{"name": n, "id": i} for n, i in SUMMARY_COLUMNS],
                        data=[],
                        sort_action="native",
                        style_table={"overflowX": "auto"},
                        style_cell={"fontFamily": "inherit", "fontSize": 13, "padding": "4px 8px"},
                        style_data_conditional=[{"if": {"filter_query": '{kind} = "workload"'}, "fontWeight": "600", "backgroundColor": "#f4f0fa"}],
                    ),
                    dcc.Store(id=ids.VIEW, data=view.to_dict()),
                    dcc.Store(id=ids.ZOOM, data={"axis": f"{view.x}-{view.mode}", "range": view.zoom}),
                    html.Div(id=ids.URL_SINK, hidden=True),
                ],
                className="content",
            ),
        ],
        className="explore",
    )


@callback(
    Output(ids.RUN_TREE, "children"),
    Input(ids.EXPERIMENTS, "value"),
    Input(ids.RUN_FILTER, "value"),
    State(ids.workload_runs(ALL), "value"),
    prevent_initial_call=True,
)
def refresh_tree(experiment_ids, text, current):
    selected = set(View.from_dict({"runs": current if isinstance(current, list) else []}).runs)
    return run_tree(_runs(View.from_dict({"exp": experiment_ids}).experiments), selected, text if isinstance(text, str) else "")


@callback(
    Output(ids.workload_runs(MATCH), "value"),
    Input(ids.workload_all(MATCH), "value"),
    State(ids.workload_runs(MATCH), "options"),
    prevent_initial_call=True,
)
def select_workload(all_value, options):
    return [o["value"] for o in options if isinstance(o, dict) and "value" in o] if all_value and isinstance(options, list) else []


@callback(Output(ids.METRICS, "options"), Output(ids.GPU_FILTER, "options"), Input(ids.workload_runs(ALL), "value"), prevent_initial_call=True)
def refresh_metric_options(values):
    run_ids = View.from_dict({"runs": values if isinstance(values, list) else []}).runs
    return metric_options(run_ids), gpu_options(run_ids)


def _notes(notes: list[str]) -> str:
    """What the view left out of the link or the controls, in one line on the page ('' when nothing)."""
    return ("Ignored in this view: " + "; ".join(notes) + ".") if notes else ""


@callback(
    Output(ids.CHARTS, "figure"),
    Output(ids.SUMMARY, "data"),
    Output(ids.VIEW, "data"),
    Output(ids.VIEW_NOTE, "children"),
    Input(ids.workload_runs(ALL), "value"),
    Input(ids.METRICS, "value"),
    Input(ids.X_MODE, "value"),
    Input(ids.GROUP_MODE, "value"),
    Input(ids.SMOOTHING, "value"),
    Input(ids.LOG_Y, "value"),
    Input(ids.ZOOM, "data"),
    Input(ids.GPU_FILTER, "value"),
    Input(ids.GPU_MODE, "value"),
    State(ids.EXPERIMENTS, "value"),
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
    from radt.app.export import comparison_table

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
    Output(ids.ZOOM, "data"),
    Input(ids.CHARTS, "relayoutData"),
    State(ids.ZOOM, "data"),
    State(ids.X_MODE, "value"),
    State(ids.GROUP_MODE, "value"),
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
    Output(ids.URL_SINK, "children"),
    Input(ids.VIEW, "data"),
)

export_panel.register()  # Dash runs this file once per dashboard it builds: the panel's callbacks once each
