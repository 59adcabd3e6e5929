"""Live: the runs training now, per host and workload, updating every second without a reload.

Each run is a card: its status, its name and what tells its command apart from the other cards' (a sweep's
"--lr 0.3"; the whole command on hover), the newest values of its own metrics (loss, accuracy) and per GPU
(coloured by level), stall and idle flags, a running run's findings over its last minutes (radt/diagnosis.py's rules
over the 10-second rollups, app/db/live.py's recent_diagnoses, judged anew as each bucket fills), and a chart of the
last minutes that grows by Plotly's extendData with only the points newer than the browser's cursor (no full redraw); its CPU axis
grows past 100 % (a process tree on several cores), and assets/page.js puts the cards of one
workload (collocated runs) on one time range. Cards are rebuilt only when the set of runs or a
status changes.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from urllib.parse import urlencode

import dash
import pandas as pd
import plotly.graph_objects as go
from dash import ALL, Input, Output, State, callback, clientside_callback, dcc, html, no_update

from radt import catalogue, settings
from radt.app.db import deadline, live
from radt.app.db.series import load_series
from radt.app.db.state import STATE, store_error
from radt.app.db.store import LIVE_STATUSES
from radt.app.export.aggregates import short_commands
from radt.app.figures.figures import plain
from radt.app.figures.palette import PALETTE, SCREEN, dash_of, run_colors, themed
from radt.app.summary.compare import run_command
from radt.app.view.cache import RUNNING_TIMEOUT
from radt.app.view.data import cached
from radt.app.web import inputs
from radt.catalogue import MetricName
from radt.diagnosis import LABELS, Diagnosis
from radt.pages.parts import ids, unreadable

dash.register_page(__name__, path="/live", name="Live", title="radt · live", order=1)

WINDOWS = {1: "1 min", 5: "5 min", 15: "15 min", 60: "60 min"}
CHART_PX = 230  # a card's chart, drawn or waiting for its first point
POLL_MS = round(settings.LIVE_POLL.get() * 1000)  # RADT_LIVE_POLL: the page's look at the store for running runs
STATUS_CLASS = {"RUNNING": "st-running", "SCHEDULED": "st-running", "FINISHED": "st-finished", "FAILED": "st-failed", "KILLED": "st-killed"}
# A card is one run (its colour, app/figures/palette.py, on the card's edge); its lines are metrics, one colour each (the activity
# figure's), and its GPUs, nodes and slices one dash style each, as on Explore.
METRIC_COLORS = {MetricName.GR_ENGINE_ACTIVE: "#6c3fb5", MetricName.SM_ACTIVE: "#1f77b4", MetricName.SM_OCCUPANCY: "#d62728", MetricName.UTILIZATION_PERCENTAGE: "#2ca02c",
                 MetricName.CPU_UTILIZATION_PERCENTAGE: "#7f7f7f", MetricName.PROCESS_CPU_UTILIZATION_PERCENTAGE: "#ff7f0e"}  # fmt: skip


@unreadable.reads_store
def layout(**_query):
    return html.Div(
        [
            html.Div(
                [
                    html.Span("window", className="label"),
                    dcc.RadioItems(id=ids.LIVE_WINDOW, options=[{"label": v, "value": k} for k, v in WINDOWS.items()], value=5, inline=True),
                    html.Button("Pause", id=ids.LIVE_PAUSE, n_clicks=0, className="button"),
                    html.Span(id=ids.LIVE_CLOCK, className="clock"),
                ],
                className="controls live-controls",
            ),
            dcc.Interval(id=ids.LIVE_TICK, interval=POLL_MS, n_intervals=0),
            dcc.Store(id=ids.LIVE_GO),
            dcc.Store(id=ids.LIVE_DONE),
            dcc.Store(id=ids.LIVE_TICKED),
            dcc.Store(id=ids.LIVE_SIGNATURE),
            html.Div(html.P("Looking for running runs…", className="hint"), id=ids.LIVE_RUNS),
        ],
        className="live",
    )


# --- data through the cache: one poll serves every open tab ------------------------------------------


def _runs(now_ms: int) -> pd.DataFrame:
    return cached(("live-runs", now_ms // POLL_MS), RUNNING_TIMEOUT, lambda: live.live_runs(STATE.engine, now_ms))


def _latest(run_ids: list[str], now_ms: int) -> dict:
    return cached(("live-latest", now_ms // POLL_MS, *sorted(run_ids)), RUNNING_TIMEOUT, lambda: live.latest_values(STATE.engine, run_ids))


def _new_points(run_id: str, after: dict[str, int]) -> dict:
    """Points after each key's cursor; tabs that are up to date share the cursors, so one query serves them all."""
    keys = list(after)
    return cached(
        ("live-points", run_id, *(f"{k}>{after[k]}" for k in keys)),
        RUNNING_TIMEOUT,
        lambda: live.new_points(STATE.engine, {run_id: after}, {run_id: keys}).get(run_id, {}),
    )


def _diagnoses(running: list[str], now_ms: int) -> dict[str, Diagnosis]:
    """The running runs' findings over their last minutes (live.recent_diagnoses), judged once per rollup bucket for every tab."""
    if not running:
        return {}
    bucket = live.FINDINGS_REFRESH_S * 1000
    parts = ("live-diagnosis", now_ms // bucket, *sorted(running))
    return cached(parts, live.FINDINGS_REFRESH_S, lambda: live.recent_diagnoses(STATE.engine, running, now_ms // bucket * bucket))


def _idle(running: dict[str, list[str]], now_ms: int) -> dict[str, list[int]]:
    if not running:
        return {}
    runs = _runs(now_ms)
    starts = dict(zip(runs["run_id"], runs["start_time"], strict=False))
    parts = ("live-idle", now_ms // POLL_MS, *sorted(f"{r}:{'+'.join(k)}" for r, k in running.items()))
    return cached(parts, RUNNING_TIMEOUT, lambda: live.idle_gpus(STATE.engine, running, starts, now_ms))


# --- cards ------------------------------------------------------------------------------------------


def _figure(traces: list[live.Trace], series: dict, waiting: str) -> go.Figure:
    """The card's chart; with no point in its window yet, `waiting` in its place (an empty date axis read "Jan 2000 … Nov 2000")."""
    if not any(len(series.get(t.key, ([], []))[0]) for t in traces):
        return _waiting_figure(waiting)
    fig = go.Figure()
    devices = list(dict.fromkeys(t.device for t in traces if t.device))
    shown: set[str] = set()
    for trace in traces:
        xs, ys = series.get(trace.key, ([], []))
        where = f" · {trace.device}" if trace.device else ""
        fig.add_trace(
            go.Scatter(
                x=pd.to_datetime(list(xs), unit="ms"),
                y=list(ys),
                mode="lines",
                name=trace.name,
                legendgroup=trace.metric or trace.name,
                showlegend=(trace.metric or trace.name) not in shown,
                yaxis=trace.axis,
                line={
                    "color": METRIC_COLORS.get(trace.metric, "#57606a"),
                    "width": 1.5,
                    "dash": dash_of(devices.index(trace.device)) if trace.device else "solid",
                },
                hovertemplate=f"{plain(trace.name)}{plain(where)}: %{{y:.3g}}<extra></extra>",
                meta={"key": trace.key, "device": trace.device},
            )
        )
        shown.add(trace.metric or trace.name)
    axes = _axis_titles(traces, series)
    themed(fig, SCREEN).update_layout(
        height=CHART_PX,
        margin={"l": 8, "r": 8, "t": 8, "b": 8},  # every label makes its own room (automargin): the date line, both axis titles
        showlegend=True,
        legend={"orientation": "h", "y": -0.22, "yanchor": "top", "font": {"size": 10}},
        yaxis={"range": [0, 1.02], "title": {"text": "GPU activity", "font": {"size": 10}}, "fixedrange": True, "automargin": True, "visible": "y" in axes},
        # percent of different wholes: GPU util, the host's CPU (% of all cores), the run's CPU (% of one core: a process tree on
        # 4 cores reads 400 %, so the axis grows past 100 and never below 0-100); each line's name says which
        yaxis2={
            "autorange": True,
            "autorangeoptions": {"include": [0, 100]},
            "rangemode": "tozero",
            "overlaying": "y",
            "side": "right",
            "showgrid": "y" not in axes,  # the left axis's grid, or its own where nothing lies on the left
            "ticksuffix": "%",
            "title": {"text": axes.get("y2", ""), "font": {"size": 10}},  # what lies on it ("GPU util · CPU (%)"): "%" alone repeated its ticks
            "fixedrange": True,
            "automargin": True,
        },
        xaxis={"type": "date", "automargin": True},
        uirevision="live",
    )
    return fig


def _axis_titles(traces: list[live.Trace], series: dict) -> dict[str, str]:
    """Each y axis that holds a drawn line, titled by what lies on it: a CPU-only run's right axis is "CPU · Run CPU (%)", no GPU."""
    drawn = [t for t in traces if len(series.get(t.key, ([], []))[0])]
    out = {"y": "GPU activity"} if any(t.axis == "y" for t in drawn) else {}
    right = list(dict.fromkeys(catalogue.METRICS[t.metric].label for t in drawn if t.axis == "y2" and t.metric in catalogue.METRICS))
    return out | ({"y2": " · ".join(right) + " (%)"} if right else {})


def _waiting_figure(text: str) -> go.Figure:
    """A card's chart before its first point: the message alone, no axis (Plotly's empty date axis spans the year 2000)."""
    fig = themed(go.Figure(), SCREEN)
    fig.update_layout(
        height=CHART_PX,
        margin={"l": 8, "r": 8, "t": 8, "b": 8},
        xaxis={"visible": False},
        yaxis={"visible": False},
        annotations=[{"text": text, "showarrow": False, "xref": "paper", "yref": "paper", "x": 0.5, "y": 0.5, "font": {"size": 12, "color": "#57606a"}}],
    )
    return fig


def _waiting_text(traces: list[live.Trace], window_min: int) -> str:
    """What a card's empty chart says: no series yet, or none with a point in the window."""
    return "waiting for the first sample" if not traces else f"no sample in the last {WINDOWS.get(window_min, f'{window_min} min')}"


def _card(run: pd.Series, traces: list[live.Trace], window_min: int, now_ms: int, color: str, command: tuple[str, str]) -> html.Section:
    """One run's card; `command` is (what tells it apart from the other cards' commands, the whole command)."""
    start = now_ms - window_min * 60_000
    series = {}
    for trace in traces:
        found = load_series(STATE.engine, [run.run_id], trace.key, start_ms=start, budget=2000)
        if run.run_id in found:
            series[trace.key] = found[run.run_id]
    key_ts = {t.key: int(series[t.key][0][-1]) if t.key in series and len(series[t.key][0]) else start for t in traces}  # see live.new_points
    cursor = max([*key_ts.values(), start])
    explore = settings.dashboard_path("/?" + urlencode({"exp": run.experiment_id, "runs": run.run_id}))
    title = [html.Span(run.status, className=f"status {STATUS_CLASS.get(run.status, '')}")]
    title += [html.Strong(run.run_name, title=run.run_name), html.Span(f" {run.letter}" if run.letter not in ("", "-") else "", className="letter")]
    short, whole = command
    title += [html.Span(short, className="command", title=whole)] if whole else []
    # assets/page.js points the link at the last explore view with this run added (this href: the run alone)
    link = {"data-exp": str(run.experiment_id), "data-run": run.run_id}
    title += [html.A("explore →", href=explore, className="explore-link", title="add this run to the explore view", **link)]
    return html.Section(
        [
            html.Header(title),
            html.Div(id=ids.card(ids.LIVE_VALUES, run.run_id), className="values"),
            html.Div(id=ids.card(ids.LIVE_FLAGS, run.run_id), className="flags"),
            html.Div(id=ids.card(ids.LIVE_FINDINGS, run.run_id), className="flags live-findings"),
            dcc.Graph(
                id=ids.card(ids.LIVE_CHART, run.run_id),
                figure=_figure(traces, series, _waiting_text(traces, window_min)),
                config={"displayModeBar": False, "showSendToCloud": False},
                className="live-chart",
            ),
            dcc.Store(
                id=ids.card(ids.LIVE_CURSOR, run.run_id),
                data={"ts": cursor, "key_ts": key_ts, "keys": [t.key for t in traces], "status": run.status, "interval": float(run.interval_s)},
            ),
        ],
        className="live-run",
        style={"borderLeft": f"4px solid {color}"},  # the run's colour on Explore and in exports
        **{"data-run": run.run_id, "data-color": color},
    )


def _cards(runs: pd.DataFrame, traces: dict[str, list[live.Trace]], window_min: int, now_ms: int, colors: dict[str, str]) -> list:
    if runs.empty:
        start = [
            "No run is training now. Start one with ",
            html.Code("radt train.py"),
            " (or ",
            html.Code("radt monitor"),
            " on a GPU host) and it appears here.",
        ]
        return [html.P(start, className="hint")]
    out = []
    whole = {r.run_id: run_command(r) for r in runs.itertuples()}
    short = short_commands([c for c in whole.values() if c])  # a sweep's cards read "--lr 0.1", "--lr 0.3": which card is which
    commands = {run_id: (short.get(c, c), c) for run_id, c in whole.items()}
    for host, by_host in runs.groupby("host", sort=False):
        blocks = []
        for (_exp, _wl), group in by_host.groupby(["experiment_name", "workload_id"], sort=False):
            first = group.iloc[0]
            heading = f"{first.experiment_name} · {first.workload_label}" + (f" · {len(group)} collocated runs" if len(group) > 1 else "")
            cards = [_card(run, traces[run.run_id], window_min, now_ms, colors[run.run_id], commands[run.run_id]) for run in group.itertuples()]
            blocks.append(html.Div([html.H4(heading), html.Div(cards, className="workload-runs")], className="live-workload"))
        out.append(html.Div([html.H3(host, className="host")] + blocks, className="live-host"))
    return out


# A poll goes to the server only once the last one is answered: the cards' render, then the tick's points after it.
# Dash keeps the newest request's answer only, so on a server slower than the poll every answer was dropped and the
# page never showed a run. A poll whose answer is lost (an error) frees the gate after GATE_MS; a page that mounts
# again (back from Explore) frees it at once: its first render and tick answer without the gate and open it.
GATE_MS = 30_000
clientside_callback(
    f"""function(n) {{
        const g = window.radtLive || (window.radtLive = {{since: 0}});
        const now = Date.now();
        if (g.since && now - g.since < {GATE_MS}) {{ return window.dash_clientside.no_update; }}
        g.since = now;
        return n;
    }}""",
    Output(ids.LIVE_GO, "data"),
    Input(ids.LIVE_TICK, "n_intervals"),
)
clientside_callback(
    """function() { if (window.radtLive) { window.radtLive.since = 0; } return window.dash_clientside.no_update; }""",
    Output(ids.LIVE_GO, "data", allow_duplicate=True),
    Input(ids.LIVE_TICKED, "data"),
    prevent_initial_call=True,
)


@callback(
    Output(ids.LIVE_RUNS, "children"),
    Output(ids.LIVE_SIGNATURE, "data"),
    Output(ids.LIVE_DONE, "data"),
    Input(ids.LIVE_GO, "data"),
    Input(ids.LIVE_WINDOW, "value"),
    State(ids.LIVE_SIGNATURE, "data"),
)
def render(_go, window_min, previous):
    """Rebuild the cards when a run appears, ends or leaves, starts storing a new metric, or the window
    changes; otherwise nothing (the tick callback extends the charts). LIVE_DONE always answers: the tick follows it."""
    done = time.time()  # a new value each answer, so the tick fires (nothing of the request echoed back)
    if store_error():
        return no_update, no_update, done
    window_min = inputs.choice(window_min, WINDOWS, 5)  # a request may carry anything: not a window is the default
    now_ms = int(time.time() * 1000)
    try:
        runs = _runs(now_ms)
        latest = _latest(list(runs["run_id"]), now_ms)
    except Exception as exc:  # a frozen database: said in place of the cards (a 503 left them as they were, or none)
        if not deadline.timed_out(exc):
            raise
        # no signature: the cards come back by themselves once the store answers
        return unreadable.page(deadline.store_message(exc), "The cards come back by themselves once it answers."), None, done
    traces = {r: live.chart_traces(sorted(latest.get(r, {}))) for r in runs["run_id"]}
    colors = _colors(runs, previous)
    signature = {"runs": [[r, s, [t.key for t in traces[r]]] for r, s in zip(runs["run_id"], runs["status"], strict=False)], "window": window_min}
    signature["colors"] = colors
    signature["drawn"] = _drawn(traces, latest, now_ms - window_min * 60_000)  # a card's first point: its chart drawn anew
    if signature == previous:
        return no_update, no_update, done
    return _cards(runs, traces, window_min, now_ms, colors), signature, done


def _colors(runs: pd.DataFrame, previous: object) -> dict[str, str]:
    """Each card's colour: the one the page gave it while the card stays, a new run the first free one (earliest start first)."""
    kept = previous.get("colors") if isinstance(previous, dict) else None
    kept = {str(r): c for r, c in kept.items() if isinstance(c, str) and c in PALETTE} if isinstance(kept, dict) else {}
    shown = set(runs["run_id"])
    started = runs.sort_values(["start_time", "run_id"], kind="stable") if "start_time" in runs else runs
    return run_colors(started, {r: c for r, c in kept.items() if r in shown})


def _drawn(traces: dict[str, list[live.Trace]], latest: dict, start_ms: int) -> list[str]:
    """The runs whose chart has a point in the window: a card waiting for its first point is built again once it has one
    (extendData grows a chart's lines, never the message in place of them)."""
    return sorted(r for r, found in traces.items() if any(latest.get(r, {}).get(t.key, (0, -1))[1] >= start_ms for t in found))


# --- every tick: new points, current values, flags ---------------------------------------------------


def _value_row(values: dict[str, tuple[float, int]]) -> list:
    per_gpu: dict[catalogue.Device, list] = defaultdict(list)  # per device: GPU, MIG slice, node; the host's own last
    for gpu, metric, value in live.card_values(values):
        text = "–" if value != value else (f"{value:.2f}" if metric.unit == "ratio" else f"{value:,.0f}")
        unit = "" if metric.unit == "ratio" else f" {metric.unit}"
        per_gpu[gpu].append(
            html.Span(
                [html.Span(metric.label, className="name"), f" {text}{unit}"], className=f"value {live.level(metric, value)}", **{"data-metric": metric.name}
            )
        )
    rows = [html.Div([html.Span(device.label or "host", className="where")] + spans, className="value-row") for device, spans in per_gpu.items()]
    own = [
        html.Span([html.Span(key, className="name"), f" {'–' if value != value else f'{value:.4g}'}"], className="value value-own", **{"data-metric": key})
        for key, value in live.own_metrics(values)
    ]
    rows = ([html.Div([html.Span("run", className="where", title="what the script logged")] + own, className="value-row own")] if own else []) + rows
    return rows or [html.Span("no sample yet", className="hint")]


def _flags(cursor: dict, values: dict, idle: list[int], now_ms: int) -> list:
    flags = []
    newest = max((ts for _v, ts in values.values()), default=None)
    if cursor.get("status") in LIVE_STATUSES:
        limit = live.STALE_INTERVALS * float(cursor.get("interval") or settings.INTERVAL.default) * 1000
        if newest is None or now_ms - newest > max(limit, 3000):
            age = "no sample yet" if newest is None else f"no sample for {math.ceil((now_ms - newest) / 1000)} s"
            flags.append(html.Span(f"stale: {age}", className="flag flag-stale"))
        for gpu in idle:
            flags.append(html.Span(f"GPU {gpu} idle for a minute while running (data loader? stalled?)", className="flag flag-idle"))
    return flags


def _findings(diagnosis: Diagnosis | None) -> list:
    """A running run's findings over its last minutes: each code in words, its sentence on hover; what it lacked, on hover."""
    minutes = f"{live.findings_window_ms() / 60_000:g} min"
    if diagnosis is None:
        return []
    lacking = {"title": f"not judged, for lack of series: {'; '.join(diagnosis.lacking)}"} if diagnosis.lacking else {}
    head = html.Span(f"last {minutes}:", className="where", **lacking)
    if not diagnosis.findings:
        return [head, html.Span(" nothing found", className="hint no-finding")]
    chips = [html.Span(LABELS[f.code], className="flag flag-finding", title=f.sentence, **{"data-code": f.code}) for f in diagnosis.findings]
    return [head, *chips]


@callback(
    Output(ids.card(ids.LIVE_CHART, ALL), "extendData"),
    Output(ids.card(ids.LIVE_CURSOR, ALL), "data"),
    Output(ids.card(ids.LIVE_VALUES, ALL), "children"),
    Output(ids.card(ids.LIVE_FLAGS, ALL), "children"),
    Output(ids.card(ids.LIVE_FINDINGS, ALL), "children"),
    Output(ids.LIVE_CLOCK, "children"),
    Output(ids.LIVE_TICKED, "data"),
    Input(ids.LIVE_DONE, "data"),
    State(ids.card(ids.LIVE_CURSOR, ALL), "data"),
    State(ids.card(ids.LIVE_CURSOR, ALL), "id"),
    State(ids.LIVE_WINDOW, "value"),
)
def tick(_done, cursors, cursor_ids, window_min):
    """Append the points newer than each chart's cursor; refresh the numbers, the flags and a running run's findings."""
    now_ms = int(time.time() * 1000)
    clock = f"updated {time.strftime('%H:%M:%S', time.gmtime(now_ms / 1000))} UTC"
    cards = dash.ctx.outputs_list[:5]  # per card on the page: its chart, cursor, values, flags and findings, one answer each
    window_min = inputs.choice(window_min, WINDOWS, 5)  # a request may carry anything: not a window is the default
    kept = _cursors(cursor_ids, cursors, now_ms)
    answers = {} if store_error() or not kept else _answers(kept, window_min, now_ms)
    ticked = time.time()  # a new value each answer: the gate's callback fires and lets the next poll go
    return *([answers.get(_run_of(o), (no_update,) * 5)[k] for o in out] for k, out in enumerate(cards)), clock, ticked


def _cursors(cursor_ids: object, cursors: object, now_ms: int) -> dict[str, dict]:
    """run -> its card's cursor, for the cards whose id names a run."""
    pairs = zip(cursor_ids if isinstance(cursor_ids, list) else [], cursors if isinstance(cursors, list) else [], strict=False)
    kept = {_run_of({"id": i}): _cursor(c, now_ms) for i, c in pairs}
    kept.pop(None, None)
    return kept


def _answers(kept: dict[str, dict], window_min: int, now_ms: int) -> dict[str, tuple]:
    """Per run: its chart's new points, its cursor after them, its current values, its flags and (running) its findings."""
    latest = _latest(list(kept), now_ms)
    running = {r: c["keys"] for r, c in kept.items() if c["status"] in LIVE_STATUSES}
    idle = _idle(running, now_ms)
    diagnoses = _diagnoses(sorted(running), now_ms)
    out = {}
    for run_id, cursor in kept.items():
        run_values = latest.get(run_id, {})
        findings = _findings(diagnoses.get(run_id)) if run_id in running else no_update  # an ended run keeps its last
        out[run_id] = (*_advance(run_id, cursor, window_min), _value_row(run_values), _flags(cursor, run_values, idle.get(run_id, []), now_ms), findings)
    return out


def _run_of(output: object) -> str | None:
    """The run a card's component id names, or None."""
    found = output.get("id") if isinstance(output, dict) else None
    return inputs.run_id(found.get(ids.RUN_KEY)) if isinstance(found, dict) else None


def _cursor(value: object, now_ms: int) -> dict:
    """A card's cursor as the page keeps it (see _card); what is not that starts from now with no keys."""
    cursor = value if isinstance(value, dict) else {}
    ts = inputs.millis(cursor.get("ts"), now_ms)
    keys = [inputs.key(k) for k in cursor.get("keys") or []] if isinstance(cursor.get("keys"), list) else []
    found = cursor.get("key_ts") if isinstance(cursor.get("key_ts"), dict) else {}
    key_ts = {k: inputs.millis(v, ts) for k, v in found.items() if inputs.key(k)}
    status = cursor.get("status") if isinstance(cursor.get("status"), str) else ""
    interval = inputs.number(cursor.get("interval"), settings.INTERVAL.default, settings.MIN_INTERVAL, settings.INTERVAL.high)
    return {"ts": ts, "key_ts": key_ts, "keys": list(dict.fromkeys(k for k in keys if k)), "status": status, "interval": interval}


def _advance(run_id: str, cursor: dict, window_min: int) -> tuple:
    """The points of the card's chart newer than its cursor (extendData) and the cursor after them; no_update for none."""
    key_ts = cursor["key_ts"]
    found = _new_points(run_id, {key: key_ts.get(key, cursor["ts"]) for key in cursor["keys"]})
    if not found:
        return no_update, no_update
    indices = [i for i, key in enumerate(cursor["keys"]) if key in found]
    xs = [pd.to_datetime(found[cursor["keys"][i]][0], unit="ms").strftime("%Y-%m-%d %H:%M:%S.%f").tolist() for i in indices]
    ys = [found[cursor["keys"][i]][1].tolist() for i in indices]
    keep = int(window_min * 60 / cursor["interval"] * 1.05) + 10
    key_ts = {**key_ts, **{k: int(found[k][0][-1]) for k in found if len(found[k][0])}}
    return ({"x": xs, "y": ys}, indices, keep), {**cursor, "ts": max([cursor["ts"], *key_ts.values()]), "key_ts": key_ts}


@callback(Output(ids.LIVE_TICK, "disabled"), Output(ids.LIVE_PAUSE, "children"), Input(ids.LIVE_PAUSE, "n_clicks"))
def pause(clicks):
    paused = bool(inputs.count(clicks) % 2)
    return paused, ("Resume" if paused else "Pause")
