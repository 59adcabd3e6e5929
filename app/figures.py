"""Figure builders: stacked overlay charts with a shared x axis, per run or grouped per workload.

Pure functions from series to Plotly figures, so the dashboard and static exports draw the same.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from app.catalogue import Metric

PALETTE = qualitative.D3 + qualitative.Set2
GROUP_GRID = 600  # points of a workload's mean and band
X_TITLES = {"relative": "time since run start (min)", "wall": "wall clock (UTC)", "step": "step"}


@dataclass
class Panel:
    """One chart: a catalogue metric and its series per run (timestamps ms, values)."""

    metric: Metric
    series: dict[str, tuple[np.ndarray, np.ndarray]]


def run_colors(run_ids: list[str]) -> dict[str, str]:
    return {run_id: PALETTE[i % len(PALETTE)] for i, run_id in enumerate(run_ids)}


def ema(values: np.ndarray, smoothing: float) -> np.ndarray:
    """Exponential moving average like TensorBoard's slider: 0 = raw, 0.99 = very smooth."""
    if smoothing <= 0 or len(values) < 2:
        return values
    return pd.Series(values).ewm(alpha=1.0 - min(smoothing, 0.999), ignore_na=True).mean().to_numpy()


def x_values(xs: np.ndarray, start_ms: float, mode: str):
    """Chart x of stored x values: timestamps (ms) for "relative"/"wall", stored steps for "step"."""
    if mode == "wall":
        return pd.to_datetime(xs, unit="ms")
    if mode == "step":
        return xs
    return (xs - start_ms) / 60000.0


def _hover(row: pd.Series) -> str:
    params = row.get("params") or {}
    shown = ", ".join(f"{k}={v}" for k, v in list(params.items())[:6] if not str(k).startswith("radt."))
    letter = f" {row['letter']}" if row.get("letter") else ""
    return f"<b>{row['run_name']}</b><br>{row['workload_label']}{letter}<br>{shown}"


def unit_label(metric: Metric) -> str:
    return f"{metric.label} ({metric.unit})" if metric.unit not in ("", "ratio", "state") else metric.label


def overlay_figure(
    panels: list[Panel],
    runs: pd.DataFrame,
    x_mode: str = "relative",
    grouped: bool = False,
    smoothing: float = 0.0,
    log_y: bool = False,
    panel_height: int = 230,
    x_range: tuple | None = None,
) -> go.Figure:
    """Stacked charts, one per metric, sharing the x axis; one trace per run, or per workload
    as the mean with a min-max band when `grouped`. `x_range` zooms the shared x axis."""
    rows = max(1, len(panels))
    fig = make_subplots(rows=rows, cols=1, shared_xaxes=True, vertical_spacing=0.04 if rows > 1 else 0.0, subplot_titles=[unit_label(p.metric) for p in panels])
    runs = runs.set_index("run_id", drop=False) if "run_id" in runs else runs
    colors = run_colors(list(runs.index))
    workloads = list(dict.fromkeys(runs["workload_id"])) if len(runs) else []
    wl_colors = {w: PALETTE[i % len(PALETTE)] for i, w in enumerate(workloads)}
    in_legend: set[str] = set()  # a run is in the legend once, from the first chart it appears in
    for row_index, panel in enumerate(panels, start=1):
        if grouped:
            _add_groups(fig, panel, runs, x_mode, smoothing, row_index, in_legend, wl_colors)
        else:
            for run_id, (ts, ys) in panel.series.items():
                if run_id not in runs.index or len(ts) == 0:
                    continue
                meta = runs.loc[run_id]
                fig.add_trace(
                    go.Scattergl(
                        x=_compact(x_values(ts, meta["start_time"], x_mode)),
                        y=_compact(ema(ys, smoothing)),
                        mode="lines",
                        name=f"{meta['run_name']}",
                        legendgroup=run_id,
                        showlegend=run_id not in in_legend,
                        line={"color": colors[run_id], "width": 1.5},
                        hovertemplate=_hover(meta) + "<br>%{y:.3g}<extra></extra>",
                        meta={"run_id": run_id},
                    ),
                    row=row_index,
                    col=1,
                )
                in_legend.add(run_id)
        axis = {"row": row_index, "col": 1}
        if panel.metric.unit == "ratio" and not log_y:
            fig.update_yaxes(range=[0, 1.02], **axis)
        if log_y:
            fig.update_yaxes(type="log", **axis)
    x_title = X_TITLES["relative"] if grouped and x_mode == "wall" else X_TITLES.get(x_mode, "")
    fig.update_xaxes(title_text=x_title, row=rows, col=1)
    if x_range is not None:
        fig.update_xaxes(range=list(x_range))
    fig.update_layout(
        height=max(260, panel_height * rows),
        margin={"l": 60, "r": 20, "t": 40, "b": 50},
        template="plotly_white",
        hovermode="closest",
        legend={"orientation": "h", "y": 1.0 + 40 / max(260, panel_height * rows), "x": 0, "yanchor": "bottom"},
        uirevision=f"{x_mode}-{grouped}",  # keeps the user's zoom across redraws until the axis changes
    )
    return fig


def _add_groups(fig, panel: Panel, runs: pd.DataFrame, x_mode: str, smoothing: float, row: int, in_legend: set, colors: dict) -> None:
    """Mean and min-max band of each workload's runs on a shared grid (time since start, or steps).

    Runs of a workload started at different wall-clock times, so "wall" is drawn as time since start.
    """
    by_workload: dict[str, list[pd.Series]] = {}
    mode = "step" if x_mode == "step" else "relative"
    for run_id, (xs, ys) in panel.series.items():
        if run_id not in runs.index or len(xs) == 0:
            continue
        meta = runs.loc[run_id]
        grid_x = np.asarray(x_values(xs, meta["start_time"], mode), dtype=np.float64)
        by_workload.setdefault(meta["workload_id"], []).append(pd.Series(ema(ys, smoothing), index=grid_x))
    for workload_id, members in by_workload.items():
        low_x = min(s.index.min() for s in members)
        high_x = max(s.index.max() for s in members)
        grid = np.linspace(low_x, high_x, GROUP_GRID) if high_x > low_x else np.array([low_x])
        stacked = np.vstack([np.interp(grid, s.index.to_numpy(), s.to_numpy(), left=np.nan, right=np.nan) for s in members])
        with np.errstate(all="ignore"):
            mean, low, high = np.nanmean(stacked, axis=0), np.nanmin(stacked, axis=0), np.nanmax(stacked, axis=0)
        label = runs.loc[runs["workload_id"] == workload_id, "workload_label"].iloc[0]
        color = colors[workload_id]
        fig.add_trace(go.Scatter(x=grid, y=high, mode="lines", line={"width": 0}, legendgroup=workload_id, showlegend=False, hoverinfo="skip"), row=row, col=1)
        fig.add_trace(
            go.Scatter(
                x=grid,
                y=low,
                mode="lines",
                line={"width": 0},
                fill="tonexty",
                fillcolor=_alpha(color, 0.18),
                legendgroup=workload_id,
                showlegend=False,
                hoverinfo="skip",
            ),
            row=row,
            col=1,
        )
        fig.add_trace(
            go.Scatter(
                x=grid,
                y=mean,
                mode="lines",
                name=f"{label} (mean of {len(members)})",
                legendgroup=workload_id,
                showlegend=workload_id not in in_legend,
                line={"color": color, "width": 2},
                hovertemplate=f"<b>{label}</b><br>mean of {len(members)} runs<br>%{{y:.3g}}<extra></extra>",
                meta={"workload_id": workload_id},
            ),
            row=row,
            col=1,
        )
        in_legend.add(workload_id)


def _compact(values):
    """float32 for the browser: half the JSON of float64. Seven significant digits are more than a
    chart shows: minutes since start resolve 1 ms at 3 h, 60 ms at 10 days (steps exact to 16.7 M)."""
    if isinstance(values, np.ndarray) and values.dtype == np.float64:
        return values.astype(np.float32)
    return values


def _alpha(color: str, alpha: float) -> str:
    if color.startswith("#") and len(color) == 7:
        r, g, b = (int(color[i : i + 2], 16) for i in (1, 3, 5))
        return f"rgba({r},{g},{b},{alpha})"
    if color.startswith("rgb("):
        return color.replace("rgb(", "rgba(").replace(")", f",{alpha})")
    return color


def empty_figure(message: str) -> go.Figure:
    fig = go.Figure()
    fig.add_annotation(text=message, showarrow=False, font={"size": 15, "color": "#666"}, xref="paper", yref="paper", x=0.5, y=0.5)
    fig.update_layout(template="plotly_white", height=260, xaxis={"visible": False}, yaxis={"visible": False})
    return fig
