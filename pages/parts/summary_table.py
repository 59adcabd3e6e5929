"""The explore page's summary table: the columns that answer "which run is better" first, sortable on the numbers.

Rows are app/summary/compare.py's comparison table (the same as `radt export --table`); each row's ``id`` is its run
(a together group's: its workload), so a click highlights it in the charts. The numbers travel unrounded and
DataTable writes them with a fixed number of decimals per column (a ratio is always 0.310, never 0.31). The
default columns fit a 1440 px screen; the "columns" control beside the heading shows the others (kept for the
browser tab's session).
"""

from __future__ import annotations

import json
import math
from typing import NamedTuple

import pandas as pd
from dash import Input, Output, State, callback, clientside_callback, dash_table, dcc, html
from dash.dash_table.Format import Format, Scheme

from radt.app.db.state import store_error
from radt.app.summary.compare import RUN_COLUMNS
from radt.app.summary.findings import readable
from radt.app.view.views import View, view_runs
from radt.catalogue import METRICS, MetricName, unit_text
from radt.pages.parts import ids
from radt.settings import dashboard_path

COLUMN_PICKER = ids.SUMMARY_COLUMNS  # the "columns" control: which of COLUMNS the table shows
RATIO = unit_text(METRICS[MetricName.SM_ACTIVE])  # '0–1'
CPU = unit_text(METRICS[MetricName.CPU_UTILIZATION_PERCENTAGE])  # the host's CPU: '% of all cores'
USED = "over the GPUs the run used (see GPUs)"


class Column(NamedTuple):
    """One column: its header, its id in the comparison table, the header's tooltip (how it is computed), its decimals
    (None: text) and whether the default set, the one that fits 1440 px, shows it."""

    header: str
    id: str
    how: str | None
    decimals: int | None = None
    shown: bool = False


COLUMNS = [
    Column("run", "run", None, shown=True),
    Column("command", "command", "What the run trained: its command, or radT's model and params. Runs compare like with like on this.", shown=True),
    Column("steps/h", "steps_per_h", "Throughput: steps ÷ duration, in steps per hour. A row of runs together: the sum of its runs'.", 0, True),
    Column(
        "normalised",
        "normalised",
        "Steps/h ÷ alone steps/h: 1 = as fast as the same command running alone. A row of runs together: the sum "
        "(above 1: more work per hour than the same runs one after another).",
        3,
        True,
    ),
    Column("SMACT", "smact_mean", f"Mean SM activity ({RATIO}) {USED}: every point of each of those GPUs.", 3, True),
    Column(
        "SMACT busiest GPU",
        "smact_busiest",
        f"Mean SM activity ({RATIO}) of the run's busiest GPU: near 1 beside a low SMACT means one GPU worked while the others waited.",
        3,
        True,
    ),
    Column(
        "GPUs",
        "gpus_text",
        "The GPUs the summaries are taken over: '1 of 5 used' when NVML's per-process lists showed which watched GPUs the run's "
        "processes used; '5 watched' when radt could not tell, and every watched GPU counts.",
        shown=True,
    ),
    Column(
        "run mem. MB",
        "run_memory_peak_mb",
        "Highest GPU memory the run's own processes held on a single GPU (MB, NVML's per-process lists): the run's figure, "
        "whoever else shared the GPU. Empty where radt could not see its processes (radT logs, DCGM alone): see GPU mem.",
        0,
        True,
    ),
    Column(
        "GPU mem. MB",
        "peak_memory_per_gpu_mb",
        "Highest memory used on a single GPU the run used (MB; its MIG slice's, on a slice), not a sum, by every process on it: "
        "beside another run on the same GPU it holds both runs' memory (see run mem.).",
        0,
        True,
    ),
    Column(
        "J/step",
        "energy_per_step_j",
        "Energy per step: the energy of the run's GPUs (J, summed) ÷ steps; for a run that ran together with others, its own "
        "share (run energy, an estimate) where it has one. Lower is better.",
        0,
        True,
    ),
    Column("colloc.", "collocation", "How the run shared its GPU: alone, same GPU (time-sliced, ran together), MPS or MIG (radt.collocation tag).", shown=True),
    Column(
        "diagnosis",
        "diagnosis",
        "What held the run back (radt.diagnosis: radt diagnose, a run's end, an import): idle GPUs, input starved, small kernels, ... "
        "'none': diagnosed, nothing found; empty: never diagnosed. Each finding's sentence is in the Diagnosis section under the charts. "
        "Filter with diagnosis LIKE '%input_starved%'.",
    ),  # not in the default set: the 1440 px screen has no room left (tests/test_page_hygiene_browser.py)
    Column("status", "status", None, shown=True),
    Column("duration", "duration", "The script's own time, start to exit (not radt's set-up). Sorted on the number of minutes.", shown=True),
    Column("logs", "logs", "The run's logs and reports (stdout, stderr, nsys/ncu), read from its artifact location.", shown=True),
    Column("workload", "workload", None),
    Column("tog.", "together", "How many runs of the workload ran at the same time (overlapping script times); 1: it ran alone.", 0),
    Column("steps", "steps", "What the script's own metrics count (epochs, iterations): their highest step, + 1 where they start at step 0.", 0),
    Column("alone", "alone_runs", "How many finished runs of the same command in this experiment ran by themselves (the baseline).", 0),
    Column("alone steps/h", "alone_steps_per_h", "Mean steps/h of those alone runs.", 0),
    Column("SMACT p95", "smact_p95", f"95th percentile of SM activity ({RATIO}) {USED}.", 3),
    Column("SMOCC", "smocc_mean", f"Mean SM occupancy ({RATIO}) {USED}.", 3),
    Column("SMOCC p95", "smocc_p95", f"95th percentile of SM occupancy ({RATIO}) {USED}.", 3),
    Column("GRACT", "gract_mean", f"Mean graphics engine activity ({RATIO}) {USED}.", 3),
    Column(
        "run SM share",
        "run_sm_share",
        "The run's own share of its GPUs' time (% of a GPU: NVML's per-process SM utilization of its processes, the mean over "
        "its GPUs): its part beside others on a shared GPU. Empty where NVML gave no per-process figure (device only). Filter with share.sm.",
        1,
    ),
    Column("power W", "power_mean_w", f"Mean power of one GPU (W) {USED}: every point of each of those GPUs.", 0),
    Column(
        "energy kJ", "energy_kj", "Energy of the run's GPUs (kJ, summed): energy counter, else power integrated over time. Together: each GPU counted once.", 1
    ),
    Column(
        "run kJ",
        "run_energy_kj",
        "The run's own share of its GPUs' energy (kJ), an estimate: its Run power (estimate) over time — the GPU's power above "
        "idle split by the runs' SM shares, plus an equal share of idle. Empty where NVML gave no per-process figure.",
        1,
    ),
    Column(f"CPU {CPU}", "cpu_mean", f"Mean host CPU utilisation, in {CPU} (100 = every core of the host busy).", 1),
    Column(
        "GPUs used",
        "gpus_used",
        "How many GPUs the summaries count as the run's: those its processes used (NVML's per-process lists), else every watched GPU (see GPUs).",
        0,
    ),
    Column("GPUs watched", "gpus_watched", "How many GPUs radt watched for the run.", 0),
    Column("letter", "letter", None),
    Column("partition", "partition", "The Slurm partition of a job radt import --slurm made a run of (radt.slurm.partition)."),
    Column("user", "user", "Who ran it: a Slurm job's user (radt.slurm.user), else MLflow's (mlflow.user)."),
    Column("idle GPU-h", "idle_gpu_hours", "GPU-hours the run held with a GPU's engine idle (radt.footprint.idle_gpu_hours; radt diagnose).", 2),
    Column("energy kWh", "energy_kwh", "The GPUs' energy (kWh) from their recorded power (radt.footprint.energy_kwh); filter with energy.kwh > 1.", 3),
    Column("CO2 kg", "co2_kg", "The energy's carbon (kg CO2eq): kWh × PUE × the grid's intensity, as the footprint basis says (radt.footprint.co2_kg).", 3),
    Column("cost", "cost", "GPU-hours held × the price per GPU-hour the footprint basis names (radt.footprint.cost).", 2),
    Column("footprint basis", "footprint_basis", "The grid intensity, PUE and price the run's footprint used (radt.footprint.basis)."),
]
SORT_KEYS = {"duration": "duration_min"}  # a text column sorts on the number beside it
MARKDOWN = {"logs"}
NAMES = ("run", "command", "workload", "diagnosis", "footprint_basis")  # cut with an ellipsis, whole in their tooltip
LEFT = (*NAMES, "collocation", "status", "letter", "gpus_text", "partition", "user")
# Widths (px) that keep the default columns within 1440 px (1,064 px beside the sidebar) whatever the names: a name is cut
# with an ellipsis; the other columns are as wide as their header (wrapped) or their widest number. The command's 124 px hold
# "train_imagenet.py" whole (110 cut it to "train_imagene…"); from 1600 px it takes the room the others leave (table.css).
WIDTHS = {"run": 160}
MAX_WIDTHS = {"command": 124, "workload": 130, "gpus_text": 84, "collocation": 76, "status": 72, "diagnosis": 130, "footprint_basis": 200}


def present(columns: list[Column] = COLUMNS) -> list[Column]:
    """The columns the comparison table holds now (app/summary/compare.py RUN_COLUMNS), and the table's own (duration, logs)."""
    return [c for c in columns if c.id in RUN_COLUMNS or c.id in ("duration", "logs")]


def duration_text(seconds: float | None) -> str:
    """A duration as the tree and the table write it: '1.5 s' and '45 s' under a minute, '12 min' under two hours, '2.5 h' from there, '–' unknown."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "–"
    if seconds < 9.95:
        return f"{seconds:.1f} s"
    if seconds < 59.5:
        return f"{seconds:.0f} s"
    minutes = seconds / 60
    return f"{max(minutes, 1):.0f} min" if minutes < 119.5 else f"{minutes / 60:.1f} h"


def table_column(column: Column) -> dict:
    """The DataTable column: text, markdown (logs) or a number with DataTable's fixed decimals (0.31 shows as 0.310) and
    thousands grouped at every precision (32,294 J/step; it read 32294.0, a tenth of a joule in tens of thousands)."""
    out = {"name": column.header, "id": column.id}
    if column.id in MARKDOWN:
        out["presentation"] = "markdown"
    if column.decimals is not None:
        out |= {"type": "numeric", "format": Format(precision=column.decimals, scheme=Scheme.fixed).group(True).to_plotly_json()}
    return out


def layout() -> list:
    """The table, its explanation and its "columns" control, for the explore page's content column."""
    columns = present()
    shown = [c.id for c in columns if c.shown]
    return [
        html.Div(
            [
                html.H3("Summary"),
                html.Details(
                    [
                        html.Summary("columns"),
                        dcc.Checklist(
                            id=COLUMN_PICKER,
                            options=[{"label": c.header, "value": c.id} for c in columns if c.id != "run"],  # the run always shows
                            value=[i for i in shown if i != "run"],
                            persistence=True,
                            persistence_type="session",
                            inline=True,
                        ),
                    ],
                    className="table-columns",
                ),
            ],
            className="summary-head",
        ),
        html.P(
            "Hover a column's header for how it is computed; click a header to sort, a row to highlight its run in the charts. "
            "A shaded row is runs that ran together: its steps/h and normalised are the sums of its runs'.",
            className="hint",
        ),
        html.Div(
            dash_table.DataTable(
                id=ids.SUMMARY,
                columns=[table_column(c) for c in columns if c.shown],
                markdown_options={"link_target": "_blank"},
                tooltip_header={c.id: c.how for c in columns if c.how},
                tooltip_delay=200,
                tooltip_duration=None,
                data=[],
                sort_action="custom",
                sort_mode="single",
                sort_by=[],
                style_table={"overflowX": "auto", "minWidth": "100%", "maxWidth": "100%"},
                style_cell={
                    "fontFamily": 'system-ui, -apple-system, "Segoe UI", Roboto, sans-serif',
                    "fontSize": 12,
                    "padding": "2px 3px",
                    "textAlign": "right",
                    "minWidth": 36,
                    "maxWidth": 110,
                    "overflow": "hidden",
                    "textOverflow": "ellipsis",
                },
                style_cell_conditional=[{"if": {"column_id": c}, "textAlign": "left"} for c in LEFT]
                + [{"if": {"column_id": c}, "minWidth": w, "width": w, "maxWidth": w} for c, w in WIDTHS.items()]
                + [{"if": {"column_id": c}, "maxWidth": w} for c, w in MAX_WIDTHS.items()],
                style_data={"whiteSpace": "nowrap", "height": "24px", "lineHeight": "18px"},  # one height in the fixed and the scrolling part
                style_header={"whiteSpace": "normal", "fontSize": 11, "lineHeight": "13px", "fontWeight": "600", "textDecoration": "underline dotted"},
                style_data_conditional=[
                    {"if": {"filter_query": '{kind} = "workload"'}, "fontWeight": "600", "backgroundColor": "#f4f0fa"},
                    {"if": {"filter_query": '{kind} = "workload"', "column_id": "command"}, "fontWeight": "400"},  # its runs' command, as wide as theirs
                ],
                css=[{"selector": ".dash-table-tooltip", "rule": "font-size: 12px; max-width: 320px;"}],
                cell_selectable=True,
            ),
            className="summary-table",  # its own stacking context: the fixed column never paints over the sticky bar (table.css)
        ),
        html.Div(id=ids.SUMMARY_SINK, hidden=True),
    ]


def rows(view: View, runs: pd.DataFrame) -> list[dict]:
    """The comparison table (app/summary/compare.py, the same as `radt export --table`) of the drawn runs, rounded for the screen."""
    from radt.app.export.paper import comparison_table

    if runs.empty:
        return []
    return table_rows(comparison_table(view, runs))


def rows_of_view(view_data) -> list[dict]:
    """The table of the view the charts just drew (the VIEW store): its own request, after the charts are on screen."""
    view = View.from_dict(view_data if isinstance(view_data, dict) else {})
    if not view.runs or store_error():
        return []
    return rows(view, view_runs(view))


def table_rows(table: pd.DataFrame) -> list[dict]:
    """The table's records as the DataTable shows them: numbers unrounded (each column's format writes them), NaN empty,
    durations as text, a unique ``id`` per row; a command as what tells it apart from the others shown (the comparison
    figures' legend names: '--batch-size 512' in a sweep of one script), whole in ``command_whole`` for its tooltip."""
    from radt.app.export.aggregates import short_commands

    cleaned = [{k: (None if isinstance(v, float) and v != v else v) for k, v in r.items() if k in RUN_COLUMNS} for r in table.to_dict("records")]
    short = short_commands([str(r["command"]) for r in cleaned if r.get("command")])
    runs_path = dashboard_path("/runs/")  # under the path the dashboard is served at (RADT_URL_PREFIX), read once for the table
    out, seen = [], set()
    for row in cleaned:
        if row.get("command"):
            row["command_whole"] = row["command"]
            row["command"] = short.get(str(row["command"]), row["command"])
        row["diagnosis"] = readable(row.get("diagnosis")) or None  # the codes in words ('none' stays 'none')
        minutes = row.get("duration_min")
        row["duration"] = duration_text(None if minutes is None else minutes * 60)
        # a workload's row ("2 runs together") has no logs of its own: an empty cell (a missing one reads "undefined")
        row["logs"] = f"[logs]({runs_path}{row['run_id']}/artifacts)" if row.get("run_id") and row.get("kind") != "workload" else ""
        row_id = str(row.get("run_id") or len(out))
        row["id"] = row_id if row_id not in seen else f"{row_id}#{len(out)}"  # DataTable wants unique ids; '#n' is cut before highlighting
        seen.add(row_id)
        out.append(row)
    return out


def register() -> None:
    """The table's callbacks, for the dashboard Dash is building now (called as Dash loads the explore page)."""
    callback(Output(ids.SUMMARY, "data"), Input(ids.VIEW, "data"))(rows_of_view)
    # Sort on the numbers (a duration's hours, not its text), in the browser; it runs again whenever draw() sends new rows.
    clientside_callback(
        """
        function(sortBy, data) {
            if (!data || !sortBy || !sortBy.length) { return window.dash_clientside.no_update; }
            const keys = __KEYS__;
            const col = keys[sortBy[0].column_id] || sortBy[0].column_id;
            const sign = sortBy[0].direction === "desc" ? -1 : 1;
            const value = (r) => r[col];
            const sorted = data.slice().sort((a, b) => {
                const x = value(a), y = value(b);
                if (x === y) { return 0; }
                if (x === null || x === undefined) { return 1; }  // empty cells last either way
                if (y === null || y === undefined) { return -1; }
                return (x < y ? -1 : 1) * sign;
            });
            return sorted.every((r, i) => r === data[i]) ? window.dash_clientside.no_update : sorted;
        }
        """.replace("__KEYS__", json.dumps(SORT_KEYS)),
        Output(ids.SUMMARY, "data", allow_duplicate=True),
        Input(ids.SUMMARY, "sort_by"),
        Input(ids.SUMMARY, "data"),
        prevent_initial_call=True,
    )

    # The "columns" control: the table shows the ticked columns in COLUMNS' order (the run first, always).
    clientside_callback(
        """
        function(ticked) {
            const all = __COLUMNS__;
            const keep = new Set(["run", ...(ticked || [])]);
            return all.filter((c) => keep.has(c.id));
        }
        """.replace("__COLUMNS__", json.dumps([table_column(c) for c in present()])),
        Output(ids.SUMMARY, "columns"),
        Input(COLUMN_PICKER, "value"),
    )
    # A name cut with an ellipsis is whole in its cell's tooltip (a command: all of it, not the part the cell shows); built
    # from the rows as shown, so a sort keeps them together.
    clientside_callback(
        """
        function(data) {
            const names = __NAMES__;
            const whole = {command: "command_whole"};
            return (data || []).map((row) => Object.fromEntries(
                names.filter((n) => row[n]).map((n) => [n, {value: String(row[whole[n]] || row[n]), type: "text"}])));
        }
        """.replace("__NAMES__", json.dumps(NAMES)),
        Output(ids.SUMMARY, "tooltip_data"),
        Input(ids.SUMMARY, "data"),
    )

    # A click on a row highlights its run (a together group: its workload) in the charts (assets/charts.js); a second click on it restores all.
    clientside_callback(
        """
        function(cell, shown) {
            if (!cell || cell.row_id === undefined || cell.row_id === null) { return window.dash_clientside.no_update; }
            const id = String(cell.row_id).split("#")[0];
            const next = shown === id ? null : id;
            if (window.radtCharts && window.radtCharts.highlight) { window.radtCharts.highlight(next); }
            return next === null ? "" : next;
        }
        """,
        Output(ids.SUMMARY_SINK, "children"),
        Input(ids.SUMMARY, "active_cell"),
        State(ids.SUMMARY_SINK, "children"),
        prevent_initial_call=True,
    )
