"""The Cluster view: every Slurm job `radt import --slurm` made a run of, totalled by user, account or partition, with
each job's diagnosis, the jobs that left the most GPU-hours idle first; a job opens in Explore like any run.

The URL holds the view (`/cluster?by=partition&user=alice&finding=input_starved`), so a link to one user's starved jobs
can be passed on; the jobs listed stop at RADT_CLUSTER_ROWS, and the line above them says how many there are."""

from __future__ import annotations

from urllib.parse import urlencode

import dash
from dash import html

from radt import settings
from radt.app.db.jobs import FINDING, GROUPS, SUMMED, Cluster, cluster, finding_sentences
from radt.app.db.state import STATE
from radt.diagnosis import CODES, LABELS
from radt.pages.parts.unreadable import reads_store

dash.register_page(__name__, path="/cluster", name="Cluster", title="radt · cluster", order=2)

COLUMNS = ("job", "user", "account", "partition", "state", "GPUs", "hours", "GPU-h", "idle GPU-h", "diagnosis")
TOTAL_COLUMNS = ("jobs", "GPU-hours", "idle GPU-h", "idle share", "no idle figure", "energy kWh", "CO₂eq kg", "cost")
NOTE = (
    "Idle GPU-hours: each GPU's share of the job with its engine idle × the job's hours, summed over its GPUs "
    "(radt.footprint.idle_gpu_hours; radt diagnose). Worst first."
)
CHOICES = (*GROUPS, FINDING)  # what the URL may narrow by
MAKING = (
    "radt is making its table of this store's jobs (once: they were imported by an older radt, or written by another "
    "tool); {:,} runs to go. Reload this page to go on."
)


def _explore(row: dict) -> str:
    """Explore's URL of the job's run (its experiment ticked, the run picked)."""
    return settings.dashboard_path("/?" + urlencode({"exp": row["experiment_id"], "runs": row["run_id"]}))


def _here(by: str, chosen: dict[str, str]) -> str:
    """This page's URL for a grouping and a choice of user / account / partition / finding."""
    query = {"by": by} if by != GROUPS[0] else {}
    query.update((k, v) for k, v in chosen.items() if v)
    return settings.dashboard_path("/cluster" + ("?" + urlencode(query) if query else ""))


def _text(value) -> str:
    """A query value as text: Dash hands a repeated parameter over as a list; anything else is not a choice."""
    if isinstance(value, list):
        value = value[-1] if value else ""
    return value if isinstance(value, str) else ""


def _number(value: float | None, digits: int) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def _diagnosis(row: dict, sentences: dict[str, str]) -> html.Td:
    """The job's findings in words, each finding's sentence on hover; 'none' for a job diagnosed clean; for one never
    diagnosed, why it has no series where the import said."""
    if row["codes"]:
        text = ", ".join(LABELS[c] for c in row["codes"])
        return html.Td(text, className="diagnosis", title="\n".join(sentences.get(c) or LABELS[c] for c in row["codes"]))
    return html.Td("none" if row["diagnosed"] else (row.get("no_series") or "not diagnosed"), className="diagnosis")


def _cells(row: dict, sentences: dict[str, str]) -> list:
    return [
        html.Td(html.A(row["job"], href=_explore(row), className="job-link")),
        html.Td(row.get("user", "")),
        html.Td(row.get("account", "")),
        html.Td(row.get("partition", "")),
        html.Td(row.get("state", "")),
        html.Td("unknown" if row["gpus"] is None else str(row["gpus"]), className="num"),
        html.Td(f"{row['hours']:.2f}", className="num"),
        html.Td(_number(row["gpu_hours"], 2), className="num"),
        html.Td(_number(row["idle_gpu_hours"], 2), className="num"),
        _diagnosis(row, sentences),
    ]


def _totals(view: Cluster, by: str, chosen: dict[str, str]) -> html.Div:
    """The totals per `by`, each name a link narrowing the page to it, and links to total by the other groups."""
    switch = [html.A(f"by {g}", href=_here(g, chosen), className="group-by" + (" chosen" if g == by else ""), id=f"cluster-by-{g}") for g in GROUPS]
    body = []
    for group in view.totals:
        name = group["name"]
        label = html.A(name, href=_here(by, {**chosen, by: name}), className="group-link") if name else html.I("(none)")
        share = group["idle_share"]
        body.append(
            html.Tr(
                [
                    html.Td(label),
                    html.Td(f"{group['jobs']:,}", className="num"),
                    _gpu_hours(group),
                    html.Td(_number(group["idle_gpu_hours"], 2), className="num"),
                    html.Td("" if share is None else f"{share:.0%}", className="num"),
                    html.Td(f"{group['jobs'] - group['ranked']:,}", className="num"),
                    *(html.Td(_number(group[name], 3), className="num") for name in SUMMED),
                ],
                className="total-row",
            )
        )
    head = html.Thead(html.Tr([html.Th(by)] + [html.Th(c) for c in TOTAL_COLUMNS]))
    bases = "; ".join(view.bases)
    said = html.P(f"Energy, CO₂eq and cost as each job's diagnosis figured them: {bases}.", id="cluster-basis", className="note") if bases else None
    return html.Div([html.P(switch, className="group-switch"), html.Table([head, html.Tbody(body)], id="cluster-totals", className="jobs"), said])


def _gpu_hours(group: dict) -> html.Td:
    """A group's GPU-hours, marked as a floor where some of its jobs' GPUs are not known (their hours are not in it)."""
    unknown = group["gpus_unknown"]
    if not unknown:
        return html.Td(f"{group['gpu_hours']:.2f}", className="num")
    return html.Td(f"≥ {group['gpu_hours']:.2f}", className="num", title=f"without the {unknown:,} job{'s' if unknown != 1 else ''} whose GPUs are not known")


def _findings(counts: list[tuple[str, int]], by: str, chosen: dict[str, str]) -> html.P:
    """The jobs per finding (of those the user / account / partition choice leaves), each a link narrowing to it."""
    if not counts:
        return html.P("No job has a finding.", id="cluster-findings", className="note")
    picked = chosen.get(FINDING, "")
    links: list = ["Jobs by finding: "]
    for i, (code, count) in enumerate(counts):
        links += [" · "] if i else []
        links.append(
            html.A(
                f"{LABELS[code]} {count:,}",
                href=_here(by, {**chosen, FINDING: code}),
                className="finding-link" + (" chosen" if code == picked else ""),
                **{"data-code": code},
            )
        )
    if picked:
        links += [" — ", html.A("every finding", href=_here(by, {k: v for k, v in chosen.items() if k != FINDING}), id="cluster-every-finding")]
    return html.P(links, id="cluster-findings")


def _chosen_line(by: str, chosen: dict[str, str]) -> html.P | None:
    if not chosen:
        return None
    parts = [f"{k} {LABELS[v] if k == FINDING else v}" for k, v in chosen.items()]
    return html.P(["Jobs of " + " · ".join(parts) + " — ", html.A("all jobs", href=_here(by, {}), id="cluster-all")], id="cluster-chosen")


def _choices(query: dict) -> dict[str, str]:
    """The user / account / partition / finding the URL names; a finding that is no code is no choice."""
    chosen = {g: _text(query.get(g)) for g in CHOICES if _text(query.get(g))}
    if chosen.get(FINDING) not in (None, *CODES):
        chosen.pop(FINDING)
    return chosen


@reads_store
def layout(by=None, **query):
    by = _text(by)
    by = by if by in GROUPS else GROUPS[0]
    chosen = _choices(query)
    view = cluster(STATE.engine, by, chosen, settings.CLUSTER_ROWS.get())
    if view.making:
        return html.Div([html.H2("Cluster"), html.P(MAKING.format(view.making), id="cluster-making")], className="cluster")
    if not view.has_jobs:
        return html.Div(
            [
                html.H2("Cluster"),
                html.P("No Slurm jobs in this store yet: radt import --slurm-since 1d makes a run of each (see the README).", id="cluster-empty"),
            ],
            className="cluster",  # the page's margin, as with jobs
        )
    shown = view.rows
    sentences = finding_sentences(STATE.engine, [row["run_id"] for row in shown if row["codes"]])
    count = f"{view.count:,} job{'s' if view.count != 1 else ''}"
    if len(shown) < view.count:
        count = f"The {len(shown):,} with the most idle GPU-hours of {count}; narrow by {', '.join(GROUPS)} or finding above to see the others ({settings.CLUSTER_ROWS.name})."
    head = html.Thead(html.Tr([html.Th(c) for c in COLUMNS]))
    body = html.Tbody([html.Tr(_cells(row, sentences.get(row["run_id"], {})), className="job-row", **{"data-run": row["run_id"]}) for row in shown])
    return html.Div(
        [
            html.H2("Cluster"),
            html.P(NOTE, className="note"),
            _chosen_line(by, chosen),
            _findings(view.findings, by, chosen),
            _totals(view, by, chosen),
            html.P(count, id="cluster-count", className="note"),
            html.Table([head, body], id="cluster-jobs", className="jobs"),
        ],
        className="cluster",
    )
