"""The Cluster view: every Slurm job `radt import --slurm` made a run of, by user, account and partition, with its
efficiency verdict, the jobs that wasted the most GPU-hours first; a job opens in Explore like any run."""

from __future__ import annotations

from urllib.parse import urlencode

import dash
from dash import html

from radt.app.jobs import job_rows
from radt.app.state import STATE, store_error
from radt.pages import ids

dash.register_page(__name__, path="/cluster", name="Cluster", title="radt · cluster", order=2)

COLUMNS = ("job", "user", "account", "partition", "state", "GPUs", "hours", "SMACT mean", "wasted GPU-h", "verdict")


def _explore(row: dict) -> str:
    """Explore's URL of the job's run (its experiment ticked, the run picked)."""
    return "/?" + urlencode({"exp": row["experiment_id"], "runs": row["run_id"]})


def _cells(row: dict) -> list:
    smact, wasted = row["smact_mean"], row["wasted_gpu_hours"]
    verdict = row.get("flags") or row.get("no_series") or ""
    return [
        html.Td(html.A(row["job"], href=_explore(row), className="job-link")),
        html.Td(row.get("user", "")),
        html.Td(row.get("account", "")),
        html.Td(row.get("partition", "")),
        html.Td(row.get("state", "")),
        html.Td(str(row["gpus"]), className="num"),
        html.Td(f"{row['hours']:.2f}", className="num"),
        html.Td("" if smact is None else f"{smact:.3f}", className="num"),
        html.Td("" if wasted is None else f"{wasted:.2f}", className="num"),
        html.Td(verdict, className="verdict"),
    ]


def layout(**_query):
    error = store_error()
    if error:
        return html.Div([html.H2("The tracking store cannot be read"), html.P(error, id=ids.STORE_ERROR_REASON)], className="store-error")
    rows = job_rows(STATE.engine)
    if not rows:
        return html.Div(
            [
                html.H2("Cluster"),
                html.P("No Slurm jobs in this store yet: radt import --slurm-since 1d makes a run of each (see the README).", id="cluster-empty"),
            ]
        )
    head = html.Thead(html.Tr([html.Th(c) for c in COLUMNS]))
    body = html.Tbody([html.Tr(_cells(row), className="job-row") for row in rows])
    note = "Wasted GPU-hours: GPUs × hours × (1 − SMACT mean) over the job's own GPUs. Worst first."
    return html.Div([html.H2("Cluster"), html.P(note, className="note"), html.Table([head, body], id="cluster-jobs", className="jobs")], className="cluster")
