"""Paper figures from a view: the dashboard's own figure (app/view/views.render) at a larger point budget, restyled for
print (app/export/restyle.py); the comparison figures and the comparison table behind them. A PDF's title is the view's."""

from __future__ import annotations

import dataclasses
import math

import pandas as pd
import plotly.graph_objects as go

from radt.app.export.exportoptions import ExportError, ExportStyle
from radt.app.export.restyle import GREYS, page_grid, restyle
from radt.app.figures.words import counted
from radt.app.summary.caveats import profiled_by
from radt.app.view import data
from radt.app.view.views import EXPORT_BUDGET, View, experiment_names, render, view_runs
from radt.catalogue import MetricName


def chosen_runs(view: View) -> pd.DataFrame:
    """The view's runs as the store lists them; ExportError saying what to do when there are none."""
    if not view.runs:
        raise ExportError("no runs selected; pick runs in the dashboard and save the view, or give --experiment (and --workload/--run)")
    runs = view_runs(view)
    if runs.empty:
        raise ExportError(f"none of the view's {counted(len(view.runs), 'run')} is in this store; check --store, or save the view again")
    return runs


def figure_for(view: View, style: ExportStyle) -> tuple[go.Figure, dict[str, list[str]]]:
    """The print figure of a view and, per metric, the runs that lack it (exported without them): many charts as a grid that fits the page."""
    runs = chosen_runs(view)
    if style.charts:
        view = dataclasses.replace(view, metrics=[m for m in view.metrics if m in style.charts] or style.charts)
    charts = len(view.metrics)
    view = dataclasses.replace(view, cols=page_grid(charts, style), notes=[])
    rendered = render(view, budget=EXPORT_BUDGET, runs=runs)
    if not rendered.panels:
        raise ExportError(f"none of the metrics {', '.join(view.metrics)} exists in the chosen runs; pick others")
    rows = math.ceil(len(rendered.panels) / max(1, min(view.cols, len(rendered.panels))))
    title = view_title([p.metric.label for p in rendered.panels], runs)
    return restyle(rendered.figure, style, rows, title), rendered.missing


def view_title(what: list[str], runs: pd.DataFrame) -> str:
    """A figure's title for its PDF metadata: what it shows and of which runs ("SMACT, SMOCC · 4 runs: resnet50 2A, ...")."""
    names = [str(n) for n in runs["run_name"]] if "run_name" in runs.columns else []
    shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    return f"{', '.join(dict.fromkeys(what))} · {counted(len(names), 'run')}: {shown}"[:300]


def comparison_figure(view: View, style: ExportStyle, kind: str, stat: str = "smact_mean", by: str = "workload", run_id: str | None = None) -> go.Figure:
    """A comparison figure, for print (app/export/aggregates.py): bar, box, cdf of a per-run statistic by workload or collocation
    (per command); the collocation figure (throughput ÷ alone and GPU SMACT per method, per command); activity of one run."""
    from radt.app.export.aggregates import COLLOCATION, STATS, FigureError, activity_figure, aggregate_figure
    from radt.app.figures.palette import run_colors

    runs = chosen_runs(view)
    try:
        if kind == "activity":
            chosen = run_id or str(runs["run_id"].iloc[0])
            series, title = activity_series(view, chosen)
            figure = activity_figure(series, title)
        else:
            figure = aggregate_figure(kind, comparison_table(view, runs), stat, by, experiment_names(), run_colors(runs))
            what = f"{STATS.get(stat, (stat,))[0]} by {by} ({kind})"
            title = "throughput ÷ alone and GPU SMACT by collocation, per command" if kind == COLLOCATION else what
    except FigureError as exc:
        raise ExportError(str(exc)) from exc
    figure.update_layout(title=None)  # the paper's caption says it; the PDF's metadata keeps it
    lines_only = all(trace.type == "scatter" and trace.mode != "markers" for trace in figure.data)  # what restyle's monochrome knows
    printed = restyle(figure, style if lines_only else dataclasses.replace(style, monochrome=False), 1, view_title([title], runs))
    return printed if lines_only or not style.monochrome else _grey_bars(printed)


BAR_PATTERNS = ("", "/", "x", ".", "\\", "+", "-", "|")  # monochrome bars: a grey and a hatching per series


def _grey_bars(figure: go.Figure) -> go.Figure:
    """Bars and boxes in monochrome: a grey and a hatching per series (its legend group, one in both panels), run points black."""
    series: dict[str, int] = {}
    for trace in figure.data:
        number = series.setdefault(trace.legendgroup or trace.name or "", len(series))
        if trace.type == "bar":
            trace.marker.color = GREYS[number % len(GREYS)]
            trace.marker.pattern = {"shape": BAR_PATTERNS[number % len(BAR_PATTERNS)], "fgcolor": "#ffffff"}
        elif trace.type == "box":
            trace.line.color = GREYS[number % len(GREYS)]
        elif trace.type == "scatter":
            trace.marker.color = "#000000"
    return figure


def activity_series(view: View, run_id: str) -> tuple[dict[str, tuple], str]:
    """GRACT, SMACT, SMOCC (and nvidia-smi's utilisation) of one run's busiest GPU, seconds since start; and the figure's title."""
    from radt.app.export.aggregates import ACTIVITY, busiest

    runs = view_runs(dataclasses.replace(view, runs=[run_id]))
    if runs.empty:
        raise ExportError(f"run {run_id[:40]} is not in the view's experiments; pick one of its runs")
    row = runs.iloc[0]
    found = {name: data.series(f"cat:{name}", runs, budget=EXPORT_BUDGET, gpus=view.gpus).get(run_id, {}) for name, *_ in ACTIVITY}
    device = busiest(found.get(MetricName.GR_ENGINE_ACTIVE) or found.get(MetricName.SM_ACTIVE) or {})
    start = row["start_time"] if pd.notna(row["start_time"]) else None
    series = {}
    for name, devices in found.items():
        if device in devices:
            ts, values = devices[device]
            first = start if start is not None else (ts[0] if len(ts) else 0)
            series[name] = ((ts - first) / 1000.0, values)
    where = f" · {device.label}" if device is not None and getattr(device, "label", "") else ""
    by = profiled_by(row.get("tags"))  # a profiler's replays, not the training: the figure says so on its own
    return series, f"GRACT vs SMACT vs SMOCC · {row['run_name']}{where}{f' · under {by}' if by else ''}"


def comparison_table(view: View, runs: pd.DataFrame | None = None) -> pd.DataFrame:
    """The view's comparison table (app/summary/compare.py): its runs (`runs` when the caller has them listed already),
    and the groups of runs that ran together against the same runs alone. Groups and alone runs are found
    among every run of the runs' experiments, so ticking some runs of a workload gives the same figures."""
    from radt.app.summary.compare import comparison, related_runs

    runs = chosen_runs(view) if runs is None else runs
    library = data.runs(sorted({*view.experiments, *runs["experiment_id"]}))
    related = related_runs(runs, library)
    return comparison(runs, data.summary(runs), library, data.summary(related))
