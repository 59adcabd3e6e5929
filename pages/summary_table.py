"""The explore page's summary table: the columns that answer "which run is better" first, sortable on the numbers.

Rows are app/compare.py's comparison table (the same as `radt export --table`), rounded for the screen; each
row's ``id`` is its run (a together group's: its workload), so a click highlights it in the charts.
"""

from __future__ import annotations

import json
import math

import pandas as pd
from dash import Input, Output, State, callback, clientside_callback, dash_table, html

from radt.app.compare import RUN_COLUMNS
from radt.app.state import store_error
from radt.app.views import View, view_runs
from radt.pages import ids

# (header, column id, how it is computed: the header's tooltip; None for a column read straight from the store)
SUMMARY_COLUMNS = [
    ("run", "run", None),
    ("steps/h", "steps_per_h", "Throughput: steps ÷ duration, in steps per hour. A row of runs together: the sum of its runs'."),
    (
        "normalised",
        "normalised",
        "Steps/h ÷ alone steps/h: 1 = as fast as the same command running alone. A row of runs together: the sum "
        "(above 1: more work per hour than the same runs one after another).",
    ),  # fmt: skip
    ("SMACT", "smact_mean", "Mean SM activity (0–1) over every point of every GPU of the run."),
    ("J/step", "energy_per_step_j", "Energy per step: GPU energy (J, all GPUs) ÷ steps. Lower is better."),
    ("workload", "workload", None),
    ("colloc.", "collocation", "How the run shared its GPU: alone, same GPU (time-sliced, ran together), MPS or MIG (radt.collocation tag)."),
    ("status", "status", None),
    ("tog.", "together", "How many runs of the workload ran at the same time (overlapping script times); 1: it ran alone."),
    ("steps", "steps", "The highest step the script logged + 1 (epochs, iterations)."),
    ("duration", "duration", "The script's own time, start to exit (not radt's set-up). Sorted on the number of hours."),
    ("alone", "alone_runs", "How many finished runs of the same command in this experiment ran by themselves (the baseline)."),
    ("alone steps/h", "alone_steps_per_h", "Mean steps/h of those alone runs."),
    ("SMACT p95", "smact_p95", "95th percentile of SM activity over every point of every GPU."),
    ("SMOCC", "smocc_mean", "Mean SM occupancy (0–1) over every point of every GPU."),
    ("SMOCC p95", "smocc_p95", "95th percentile of SM occupancy over every point of every GPU."),
    ("peak mem. MB", "peak_memory_per_gpu_mb", "Highest memory used on a single GPU (MB), not a sum."),
    ("energy kJ", "energy_kj", "GPU energy over all GPUs (kJ): energy counter, else power integrated over time. Together: each GPU counted once."),
    ("CPU %", "cpu_mean", "Mean system CPU utilisation (%)."),
    ("letter", "letter", None),
    ("logs", "logs", "The run's logs and reports (stdout, stderr, nsys/ncu), read from its artifact location."),
]
DIGITS = {"together": 0, "steps": 0, "duration_min": 2, "steps_per_h": 2, "alone_runs": 0, "alone_steps_per_h": 2, "normalised": 3, "smact_mean": 3,
          "smact_p95": 3, "smocc_mean": 3, "smocc_p95": 3, "peak_memory_per_gpu_mb": 0, "energy_kj": 1, "cpu_mean": 1, "energy_per_step_j": 1}  # fmt: skip
SORT_KEYS = {"duration": "duration_min"}  # a text column sorts on the number beside it
TEXT = {"run", "workload", "collocation", "status", "duration", "letter", "logs"}
MARKDOWN = {"logs"}


def duration_text(seconds: float | None) -> str:
    """A duration as the sidebar writes it: '45 min' under two hours, '2.5 h' from there, '–' when unknown."""
    if seconds is None or not math.isfinite(seconds):
        return "–"
    minutes = seconds / 60
    return f"{minutes:.0f} min" if minutes < 120 else f"{minutes / 60:.1f} h"


def layout() -> list:
    """The table and its explanation, for the explore page's content column."""
    numeric = {"type": "numeric"}
    return [
        html.H3("Summary"),
        html.P(
            "Hover a column's header for how it is computed; click a header to sort, a row to highlight its run in the charts. "
            "A shaded row is runs that ran together: its steps/h and normalised are the sums of its runs'.",
            className="hint",
        ),
        dash_table.DataTable(
            id=ids.SUMMARY,
            columns=[
                {"name": n, "id": i, **({} if i in TEXT else numeric), **({"presentation": "markdown"} if i in MARKDOWN else {})}
                for n, i, _how in SUMMARY_COLUMNS
            ],
            markdown_options={"link_target": "_blank"},
            tooltip_header={i: how for _n, i, how in SUMMARY_COLUMNS if how},
            tooltip_delay=200,
            tooltip_duration=None,
            data=[],
            sort_action="custom",
            sort_mode="single",
            sort_by=[],
            fixed_columns={"headers": True, "data": 1},
            style_table={"overflowX": "auto", "minWidth": "100%"},
            style_cell={
                "fontFamily": 'system-ui, -apple-system, "Segoe UI", Roboto, sans-serif',
                "fontSize": 12,
                "padding": "2px 6px",
                "textAlign": "right",
                "minWidth": 44,
                "maxWidth": 120,
            },
            style_cell_conditional=[{"if": {"column_id": c}, "textAlign": "left"} for c in ("run", "workload", "collocation", "status", "letter")]
            + [{"if": {"column_id": "run"}, "minWidth": 150, "maxWidth": 220, "overflow": "hidden", "textOverflow": "ellipsis"}],
            style_data={"whiteSpace": "nowrap", "height": "24px", "lineHeight": "18px"},  # one height in the fixed and the scrolling part
            style_header={"whiteSpace": "nowrap", "height": "28px", "fontWeight": "600", "textDecoration": "underline dotted"},
            style_data_conditional=[{"if": {"filter_query": '{kind} = "workload"'}, "fontWeight": "600", "backgroundColor": "#f4f0fa"}],
            css=[{"selector": ".dash-table-tooltip", "rule": "font-size: 12px; max-width: 320px;"}],
            cell_selectable=True,
        ),
        html.Div(id=ids.SUMMARY_SINK, hidden=True),
    ]


def rows(view: View, runs: pd.DataFrame) -> list[dict]:
    """The comparison table (app/compare.py, the same as `radt export --table`) of the drawn runs, rounded for the screen."""
    from radt.app.export import comparison_table

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
    """The table's records as the DataTable shows them: numbers rounded, NaN empty, durations as text, a unique ``id`` per row."""
    out, seen = [], set()
    for record in table.to_dict("records"):
        for column, digits in DIGITS.items():
            value = record.get(column)
            record[column] = None if value is None or value != value else (round(float(value), digits) if digits else int(round(float(value))))
        row = {k: (None if isinstance(v, float) and v != v else v) for k, v in record.items() if k in RUN_COLUMNS}
        minutes = row.get("duration_min")
        row["duration"] = duration_text(None if minutes is None else minutes * 60)
        if row.get("run_id") and row.get("kind") != "workload":
            row["logs"] = f"[logs](/runs/{row['run_id']}/artifacts)"
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
