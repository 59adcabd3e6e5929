"""The explore page's run picker: experiments → workloads → runs, narrowed by the run filter.

The filter (app/view/filters.py: words, MLflow's search syntax, radt's summaries) is part of the view
(URL key ``q``). The tree stays quick with hundreds of runs: one pass over the run list, the
workloads folded when many runs match, a count of what matches, and one button that ticks them all.
"""

from __future__ import annotations

from collections import defaultdict

import pandas as pd
from dash import ALL, MATCH, Input, Output, State, callback, ctx, dcc, html, no_update
from dash.exceptions import PreventUpdate

from radt.app.figures.words import counted
from radt.app.summary.caveats import run_caveats
from radt.app.view import data
from radt.app.view.filters import FIELDS, LIKE_PATTERN_LIMIT, Narrowed, narrow
from radt.app.view.views import View, experiment_names
from radt.app.web import inputs
from radt.diagnosis import CODES
from radt.pages.parts import ids
from radt.pages.parts.summary_table import duration_text  # the table and the tree write a duration the same way

STATUS_ICON = {"FINISHED": "✓", "FAILED": "✗", "KILLED": "■", "RUNNING": "▶", "SCHEDULED": "…"}
OPEN_LIMIT = 40  # up to this many runs every workload is unfolded; beyond, only those with a ticked run
OPEN_LIMIT_FILTERED = 100  # the same once a filter has narrowed the list: what it leaves is what the user asked to see
PLACEHOLDER = "filter runs: words, or params.lr = '0.1' and smact.mean < 0.3"
FILTER_PAUSE_S = 0.6  # seconds without a key before the typed filter applies (one query per pause, not per key)
HELP = (
    "Words match a run's name, workload, letter, status or param=value. Or MLflow's search syntax, joined by and: "
    "params.batch_size = '128', tags.radt.collocation = 'mps', attributes.status IN ('FINISHED', 'RUNNING'), "
    f"attributes.run_name LIKE '%resnet%' (ILIKE ignores case; a pattern of at most {LIKE_PATTERN_LIMIT} characters), metrics.loss < 0.5 (latest value); "
    f"and radt's figures of a run: {', '.join(FIELDS)} (duration > 10m; units s, m, h; ratios 0-1 or %); "
    f"its diagnosis: diagnosis LIKE '%input_starved%' (codes {', '.join(CODES)}; diagnosis = '' for a run diagnosed with no finding)."
)


def _runs(experiment_ids: list[str]) -> pd.DataFrame:
    return data.runs(experiment_ids or [])


def _label(r) -> str:
    return f"{STATUS_ICON.get(r.status, '?')} {(r.letter + ' · ') if r.letter else ''}{r.run_name} · {duration_text(r.duration_s)}{''.join(' · ' + c for c in run_caveats(r.tags))}"


def _blocks(runs: pd.DataFrame, matched: pd.DataFrame, selected: set[str], filtered: bool, names: dict[str, str]) -> list:
    """Under each experiment's name, one collapsible block per workload with a matching run: its select-all box and the
    boxes of its matching runs (one pass over the list, which list_runs sorts by experiment)."""
    totals: dict[tuple, int] = defaultdict(int)
    for key in zip(runs["experiment_id"], runs["workload_id"], strict=False):
        totals[key] += 1
    groups: dict[tuple, list] = {}
    for r in matched.itertuples():
        groups.setdefault((r.experiment_id, r.workload_id), []).append(r)
    unfold = len(matched) <= (OPEN_LIMIT_FILTERED if filtered else OPEN_LIMIT)
    first = {e: i for i, e in enumerate(dict.fromkeys(e for e, _w in groups))}  # each experiment's workloads together, under one heading
    blocks, heading = [], None
    for (experiment_id, workload_id), rows in sorted(groups.items(), key=lambda item: first[item[0][0]]):
        if experiment_id != heading:
            heading = experiment_id
            name = names.get(str(experiment_id), f"experiment {experiment_id}")
            blocks.append(html.H4(name, className="experiment-heading", title=name, **{"data-experiment": experiment_id}))
        options = [{"label": _label(r), "value": r.run_id} for r in rows]
        values = [r.run_id for r in rows if r.run_id in selected]
        total = totals[(experiment_id, workload_id)]
        count = f"{len(rows)} of {total}" if filtered and len(rows) != total else str(total)
        blocks.append(
            html.Details(
                [
                    html.Summary(
                        dcc.Checklist(
                            id=ids.workload_all(workload_id),
                            options=[{"label": f"{rows[0].workload_label} ({count})", "value": "all"}],
                            value=["all"] if values and len(values) == len(options) else [],
                            className="wl-all",
                            inline=True,
                        )
                    ),
                    dcc.Checklist(id=ids.workload_runs(workload_id), options=options, value=values, className="wl-runs"),
                ],
                open=bool(values) or unfold,
                className="workload",
                **{"data-experiment": experiment_id},
            )
        )
    return blocks


def count_line(matching: int, total: int, filtered: bool) -> str:
    """The sidebar's count: "10 runs", "1 run", "12 of 500 runs match" (it said "1 runs")."""
    if not filtered:
        return counted(total, "run")
    return f"{matching} of {counted(total, 'run')} " + ("matches" if total == 1 else "match")


def picker(runs: pd.DataFrame, selected: set[str], query: str = "", names: dict[str, str] | None = None) -> tuple[list, str, str]:
    """The tree of the runs the filter leaves, under their experiments' names (``names``: experiment id -> name), the count
    line ("12 of 500 runs match") and the filter's error line ('' when it reads)."""
    if runs.empty:
        return [html.P("Tick an experiment to list its workloads and runs.", className="hint")], "", ""
    narrowed: Narrowed = narrow(runs, query)
    filtered = bool((query or "").strip()) and not narrowed.error
    blocks = _blocks(runs, narrowed.runs, selected, filtered, names or {})
    count = count_line(len(narrowed.runs), len(runs), filtered)
    if not blocks:
        blocks = [html.P(narrowed.hint or "No run matches the filter.", className="hint")]
    return blocks, count, narrowed.error


def sidebar(experiments: list[dict], experiment_ids: list[str], runs: pd.DataFrame, selected: set[str], query: str) -> list:
    """The picker's part of the explore page: experiments, the filter with its error and count lines, the tree."""
    tree, count, error = picker(runs, selected, query, experiment_names(experiments))
    return [
        html.H3("Experiments"),
        dcc.Checklist(
            id=ids.EXPERIMENTS,
            options=[{"label": f"{e['name']} ({e['runs']})", "value": e["experiment_id"]} for e in experiments],
            value=experiment_ids,
            className="experiments",
        ),
        # applied once typing pauses: applied only on Enter or on leaving the box, a typed filter left the old one's count in view
        dcc.Input(id=ids.RUN_FILTER, type="search", value=query, placeholder=PLACEHOLDER, debounce=FILTER_PAUSE_S, className="filter"),
        html.P(error, id=ids.RUN_FILTER_ERROR, className="filter-error", role="alert"),
        html.Div(
            [
                html.Span(count, id=ids.RUN_FILTER_COUNT, className="hint"),
                html.Button("tick all matching", id=ids.RUN_TICK_MATCHING, className="tick-matching"),
            ],
            className="filter-count",
        ),
        html.Details([html.Summary("filter syntax"), html.P(HELP)], className="filter-help"),
        html.H3("Workloads and runs"),
        html.Div(tree, id=ids.RUN_TREE),
    ]


def refresh_tree(experiment_ids, text, current):
    selected = set(View.from_dict({"runs": current if isinstance(current, list) else []}).runs)
    query = View.from_dict({"q": text}).query
    names = experiment_names()
    return picker(_runs(View.from_dict({"exp": experiment_ids}).experiments), selected, query, names)


def select_workload(all_value, options):
    return [o["value"] for o in options if isinstance(o, dict) and "value" in o] if all_value and isinstance(options, list) else []


def sync_workload(all_value, run_values, options):
    """A workload's box and its runs' boxes kept in agreement both ways: the box ticks or unticks every run, and the box is
    ticked exactly when every run is (unticking one run unticks it)."""
    if ids.is_workload_all(ctx.triggered_id):
        return select_workload(all_value, options), no_update
    runs = select_workload(["all"], options)
    ticked = set(run_values) if isinstance(run_values, list) else set()
    every = bool(runs) and all(run in ticked for run in runs)
    return no_update, ["all"] if every else []


def tick_matching(n_clicks, option_lists):
    """Every run box in the tree ticked: the tree holds the runs the filter leaves, and nothing else."""
    boxes = len(ctx.outputs_list)  # one answer per box the request names, whatever else it carries
    if not inputs.count(n_clicks) or not isinstance(option_lists, list) or len(option_lists) != boxes:
        raise PreventUpdate  # (no_update is not an answer for a wildcard output)
    return [select_workload(["all"], options) for options in option_lists]


def keep_query(text, view):
    """The filter into the view the URL shows, whenever the filter or the view (drawn without it) changes; nothing when it is there."""
    if not isinstance(view, dict):
        return no_update
    query = View.from_dict({"q": text}).query
    if view.get("q", "") == query:
        return no_update
    kept = {k: v for k, v in view.items() if k != "q"}
    return kept | ({"q": query} if query else {})


def register() -> None:
    """The picker's callbacks, for the dashboard Dash is building now (called as Dash loads the explore page)."""
    callback(
        Output(ids.RUN_TREE, "children"),
        Output(ids.RUN_FILTER_COUNT, "children"),
        Output(ids.RUN_FILTER_ERROR, "children"),
        Input(ids.EXPERIMENTS, "value"),
        Input(ids.RUN_FILTER, "value"),
        State(ids.workload_runs(ALL), "value"),
        prevent_initial_call=True,
    )(refresh_tree)
    callback(
        Output(ids.workload_runs(MATCH), "value"),
        Output(ids.workload_all(MATCH), "value"),
        Input(ids.workload_all(MATCH), "value"),
        Input(ids.workload_runs(MATCH), "value"),
        State(ids.workload_runs(MATCH), "options"),
        prevent_initial_call=True,
    )(sync_workload)
    callback(
        Output(ids.workload_runs(ALL), "value", allow_duplicate=True),
        Input(ids.RUN_TICK_MATCHING, "n_clicks"),
        State(ids.workload_runs(ALL), "options"),
        prevent_initial_call=True,
    )(tick_matching)
    callback(
        Output(ids.VIEW, "data", allow_duplicate=True),
        Input(ids.RUN_FILTER, "value"),
        Input(ids.VIEW, "data"),
        prevent_initial_call=True,
    )(keep_query)
