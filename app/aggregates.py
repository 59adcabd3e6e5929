"""Comparison figures the radT papers print: per-run aggregates grouped by workload or collocation method, and one run's activity.

Pure functions from the comparison table (app/compare.py, one row per run) or a run's series to Plotly figures; the
dashboard's comparison section and `radt export --figure` draw the same ones.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from radt.app.compare import METHODS

# per-run aggregates: comparison-table column -> (label, unit)
STATS = {
    "smact_mean": ("mean SMACT", "ratio"),
    "smact_p95": ("p95 SMACT", "ratio"),
    "smocc_mean": ("mean SMOCC", "ratio"),
    "smocc_p95": ("p95 SMOCC", "ratio"),
    "steps_per_h": ("throughput", "steps/h"),
    "normalised": ("normalised throughput", "× alone"),
    "energy_kj": ("energy", "kJ"),
    "energy_per_step_j": ("energy per step", "J/step"),
    "peak_memory_per_gpu_mb": ("peak memory per GPU", "MB"),
}
BY = {"workload": "workload", "collocation": "collocation"}  # grouping -> comparison-table column
KINDS = ("bar", "box", "cdf")
ACTIVITY = (  # the activity figure's series: (catalogue name, label, scale to 0-1, dash)
    ("gr_engine_active", "GRACT", 1.0, "solid"),
    ("sm_active", "SMACT", 1.0, "dash"),
    ("sm_occupancy", "SMOCC", 1.0, "dot"),
    ("utilization_percentage", "nvidia-smi GPU util ÷ 100", 0.01, "dashdot"),
)
COLOURS = ("#6c3fb5", "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#8c564b", "#17becf", "#e377c2", "#7f7f7f", "#bcbd22")


class FigureError(ValueError):
    """A comparison figure that cannot be drawn from these runs; the message says what to pick instead."""


def check(stat: str, by: str) -> None:
    """FigureError for a statistic or grouping radt does not know."""
    if stat not in STATS:
        raise FigureError(f"statistic '{str(stat)[:40]}' is not one of {', '.join(STATS)}")
    if by not in BY:
        raise FigureError(f"grouping '{str(by)[:40]}' is not one of {', '.join(BY)}")


def groups(table: pd.DataFrame, stat: str, by: str) -> dict[str, np.ndarray]:
    """Group name -> the stat of each of its runs (NaN left out), in a stable order: collocation methods as the papers list them."""
    check(stat, by)
    runs = table[table["kind"] == "run"] if "kind" in table.columns else table
    out: dict[str, np.ndarray] = {}
    for name, members in runs.groupby(BY[by], sort=False, dropna=False):
        values = pd.to_numeric(members[stat], errors="coerce").to_numpy(dtype=float)
        values = values[~np.isnan(values)]
        if len(values):
            out[str(name)] = values
    order = METHODS if by == "collocation" else sorted(out)
    return {name: out[name] for name in [*[o for o in order if o in out], *[n for n in out if n not in order]]}


def _axis_title(stat: str) -> str:
    label, unit = STATS[stat]
    return f"{label} ({unit})"


def _empty(stat: str, by: str) -> FigureError:
    return FigureError(f"no run of these has a {STATS[stat][0]} to group by {by}; pick other runs or another statistic")


def _layout(figure: go.Figure, title: str, x_title: str, y_title: str, ratio: bool) -> go.Figure:
    figure.update_layout(
        title={"text": title, "x": 0, "xanchor": "left"}, template="simple_white", showlegend=False, margin={"l": 60, "r": 20, "t": 40, "b": 60}
    )
    figure.update_xaxes(title=x_title)
    figure.update_yaxes(title=y_title, rangemode="tozero")
    if ratio:
        figure.update_yaxes(range=[0, 1.02])
    return figure


def bar_figure(table: pd.DataFrame, stat: str, by: str) -> go.Figure:
    """One bar per group: the mean of its runs' stat; the whiskers its runs' minimum and maximum; n runs on hover."""
    found = groups(table, stat, by)
    if not found:
        raise _empty(stat, by)
    names = list(found)
    means = [float(np.mean(v)) for v in found.values()]
    figure = go.Figure(
        go.Bar(
            x=names,
            y=means,
            marker_color=[COLOURS[i % len(COLOURS)] for i in range(len(names))],
            error_y={
                "type": "data",
                "symmetric": False,
                "array": [float(np.max(v)) - m for v, m in zip(found.values(), means, strict=True)],
                "arrayminus": [m - float(np.min(v)) for v, m in zip(found.values(), means, strict=True)],
                "thickness": 1,
                "width": 4,
            },  # fmt: skip
            customdata=[len(v) for v in found.values()],
            hovertemplate="%{x}<br>mean %{y:.4g}<br>%{customdata} runs<extra></extra>",
        )
    )
    return _layout(figure, f"{STATS[stat][0]} by {by} (mean of runs, min–max)", by, _axis_title(stat), STATS[stat][1] == "ratio")


def box_figure(table: pd.DataFrame, stat: str, by: str) -> go.Figure:
    """A box per group over its runs' stat, every run a point beside it."""
    found = groups(table, stat, by)
    if not found:
        raise _empty(stat, by)
    figure = go.Figure(
        [
            go.Box(y=values, name=name, boxpoints="all", jitter=0.3, pointpos=0, marker_color=COLOURS[i % len(COLOURS)], line_width=1)
            for i, (name, values) in enumerate(found.items())
        ]
    )
    return _layout(figure, f"{STATS[stat][0]} by {by} (runs)", by, _axis_title(stat), STATS[stat][1] == "ratio")


def cdf_points(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The empirical CDF as a step line: the sorted values and the share of runs at or below each (1/n .. 1)."""
    xs = np.sort(np.asarray(values, dtype=float))
    return xs, np.arange(1, len(xs) + 1) / len(xs)


def cdf_figure(table: pd.DataFrame, stat: str, by: str) -> go.Figure:
    """Per group the empirical CDF of its runs' stat (share of runs at or below a value)."""
    found = groups(table, stat, by)
    if not found:
        raise _empty(stat, by)
    figure = go.Figure()
    for i, (name, values) in enumerate(found.items()):
        xs, ys = cdf_points(values)
        figure.add_scatter(x=xs, y=ys, name=f"{name} ({len(xs)})", mode="lines+markers", line={"shape": "hv", "color": COLOURS[i % len(COLOURS)]},
                           marker={"size": 5}, hovertemplate=f"{name}<br>%{{x:.4g}}: %{{y:.0%}} of runs<extra></extra>")  # fmt: skip
    figure = _layout(figure, f"CDF of {STATS[stat][0]} by {by}", _axis_title(stat), "share of runs", False)
    figure.update_yaxes(range=[0, 1.02])
    if STATS[stat][1] == "ratio":
        figure.update_xaxes(range=[0, 1.02])
    figure.update_layout(showlegend=True, legend={"orientation": "h", "x": 0, "y": 1.02, "yanchor": "bottom"})
    return figure


def aggregate_figure(kind: str, table: pd.DataFrame, stat: str, by: str) -> go.Figure:
    """The bar, box or CDF figure of a comparison table."""
    if kind not in KINDS:
        raise FigureError(f"figure '{str(kind)[:40]}' is not one of {', '.join(KINDS)}")
    return {"bar": bar_figure, "box": box_figure, "cdf": cdf_figure}[kind](table, stat, by)


def busiest(per_device: Mapping[object, tuple[np.ndarray, np.ndarray]]) -> object | None:
    """The device whose series has the highest mean (a 5-GPU run's busy GPU); None when there are none."""
    means = {d: float(np.nanmean(v)) for d, (_x, v) in per_device.items() if len(v) and not np.all(np.isnan(v))}
    return max(means, key=means.get) if means else None


def activity_figure(series: Mapping[str, tuple[np.ndarray, np.ndarray]], title: str) -> go.Figure:
    """GRACT, SMACT and SMOCC of one GPU on one 0–1 axis over seconds since start, and nvidia-smi's utilisation where recorded:
    the engine can read busy (GRACT, nvidia-smi ~1) while few SMs work (SMACT) and fewer warps are resident (SMOCC).

    `series`: catalogue name -> (seconds since start, values as stored)."""
    figure = go.Figure()
    for i, (name, label, scale, dash) in enumerate(ACTIVITY):
        if name not in series:
            continue
        xs, values = series[name]
        mean = float(np.nanmean(values)) * scale if len(values) else math.nan
        figure.add_scatter(x=xs, y=np.asarray(values, dtype=float) * scale, name=f"{label} (mean {mean:.3f})", mode="lines",
                           line={"color": COLOURS[i], "dash": dash, "width": 1.5}, meta={"metric": name},
                           hovertemplate=f"{label}<br>%{{x:.0f}} s: %{{y:.3f}}<extra></extra>")  # fmt: skip
    if not figure.data:
        raise FigureError("the run recorded none of GRACT, SMACT, SMOCC; pick a run with DCGM or GPM metrics")
    figure = _layout(figure, title, "time since start (s)", "activity (0–1)", True)
    figure.update_layout(showlegend=True, legend={"orientation": "h", "x": 0, "y": 1.02, "yanchor": "bottom"})
    return figure
