"""Figure builders: stacked overlay charts with a shared x axis, per run or grouped per workload.

Pure functions from series to Plotly figures, so the dashboard and static exports draw the same.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from radt.catalogue import Device, Metric
from radt.runmodel import GPUS_TAG, MIG_ACTIVITY_TAG

PALETTE = qualitative.D3 + qualitative.Set2
DEVICE_DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")  # a run's GPUs, when colour tells runs apart
GROUP_GRID = 600  # points of a workload's mean and band
X_TITLES = {"relative": "time since run start (min)", "wall": "wall clock (UTC)", "step": "step"}
GPU_MODES = ("each", "mean")  # every GPU its own trace, or per run the mean across its GPUs with a min-max band

Series = tuple[np.ndarray, np.ndarray]
CHART_GAP_PX = 80  # at most this much space between two stacked charts (less than 0.04 of the figure when there are many)


def plain(value) -> str:
    """A name (run, experiment, workload, param, metric key) as Plotly text: shown as typed, never as Plotly's pseudo-HTML.

    Plotly draws <a href>, <b>, <br> and entities in legend entries, titles, annotations and
    tooltips; escaped, `<a href="http://x">evil</a>` is that text, not a link."""
    return str(value).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def in_template(text: str) -> str:
    """Plain text (see plain()) inside a hovertemplate, where `%{...}` would be read as a variable: its % as an entity."""
    return text.replace("%{", "&#37;{")


@dataclass
class Panel:
    """One chart: a catalogue metric and its series per run and device (timestamps ms or steps, values)."""

    metric: Metric
    series: dict[str, dict[Device, Series]]


def trace_id(run_id: str, device: Device) -> str:
    """The identity of one drawn series: a run's device (its legend entry, colour and style in every chart)."""
    return f"{run_id}|{device.label}" if device.label else run_id


def series_name(device: Device) -> str:
    """The name a device's series has in radt's keys and the radt.gpus tag: gpu_0, gpu_0_mig_3."""
    if device.gpu is None:
        return ""
    return f"gpu_{device.gpu}" + (f"_mig_{device.mig}" if device.mig is not None else "")


def gpu_identity(meta: pd.Series, device: Device) -> str:
    """'NVIDIA A100-SXM4-40GB · GPU-5fd15f35… · 00000000:07:00.0' from the run's radt.gpus tag, '' when unrecorded."""
    tags = meta.get("tags") if hasattr(meta, "get") else None
    raw = (tags or {}).get(GPUS_TAG) if isinstance(tags, dict) else None
    if not raw or device.gpu is None or device.node is not None:
        return ""
    try:
        entries = json.loads(raw)
    except ValueError:
        return ""
    wanted = series_name(device)
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, dict) and entry.get("series") == wanted:
            uuid = str(entry.get("uuid") or "")
            parts = [entry.get("name"), entry.get("mig_profile"), uuid[:13] + "…" if len(uuid) > 14 else uuid, entry.get("pci_bus_id")]
            return " · ".join(str(p) for p in parts if p)
    return ""


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
    """The run's lines of a tooltip, its names and params as text (ready for a hovertemplate)."""
    params = row.get("params") or {}
    params = params if isinstance(params, dict) else {}
    shown = ", ".join(f"{k}={v}" for k, v in list(params.items())[:6] if not str(k).startswith("radt."))
    letter = f" {row['letter']}" if row.get("letter") else ""
    return in_template(f"<b>{plain(row['run_name'])}</b><br>{plain(row['workload_label'])}{plain(letter)}<br>{plain(shown)}")


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
    gpu_mode: str = "each",
) -> go.Figure:
    """Stacked charts, one per metric, sharing the x axis.

    One trace per run and device ("run · GPU 1"), or with ``gpu_mode="mean"`` per run the mean
    across its GPUs with a min-max band; ``grouped``: per workload, the mean of all its runs' series
    with a min-max band. Several runs: a colour per run, a dash style per GPU of a run; one run: a
    colour per GPU. `x_range` zooms the shared x axis.
    """
    rows = max(1, len(panels))
    spacing = min(0.04, CHART_GAP_PX / (panel_height * rows)) if rows > 1 else 0.0  # Plotly refuses spacing × (rows - 1) > 1
    fig = make_subplots(rows=rows, cols=1, shared_xaxes=True, vertical_spacing=spacing, subplot_titles=[plain(unit_label(p.metric)) for p in panels])
    runs = runs.set_index("run_id", drop=False) if "run_id" in runs else runs
    colors = run_colors(list(runs.index))
    workloads = list(dict.fromkeys(runs["workload_id"])) if len(runs) else []
    wl_colors = {w: PALETTE[i % len(PALETTE)] for i, w in enumerate(workloads)}
    gpus_of = _gpus_of(panels)
    single_run = len({r for p in panels for r in p.series if r in runs.index}) == 1
    in_legend: set[str] = set()  # a series is in the legend once, from the first chart it appears in
    for row_index, panel in enumerate(panels, start=1):
        if grouped:
            members = {}
            for run_id, devices in panel.series.items():
                if run_id in runs.index:
                    wl = runs.loc[run_id, "workload_id"]
                    members.setdefault(wl, []).extend((run_id, xs, ys) for xs, ys in devices.values())
            for workload_id, found in members.items():
                label = runs.loc[runs["workload_id"] == workload_id, "workload_label"].iloc[0]
                count = len({run_id for run_id, _xs, _ys in found})
                series = len(found)
                what = f"mean of {count}" if series == count else f"mean of {count} runs, {series} GPU series"
                _add_band(
                    fig,
                    runs,
                    found,
                    x_mode,
                    smoothing,
                    row_index,
                    in_legend,
                    workload_id,
                    plain(f"{label} ({what})"),
                    wl_colors[workload_id],
                    {"workload_id": workload_id},
                )
        else:
            for run_id, devices in panel.series.items():
                if run_id not in runs.index:
                    continue
                meta = runs.loc[run_id]
                if gpu_mode == "mean" and sum(1 for d in devices if d.gpu is not None) > 1:
                    found = [(run_id, xs, ys) for xs, ys in devices.values()]
                    name = plain(f"{meta['run_name']} · mean of {len(found)} GPUs")
                    _add_band(fig, runs, found, x_mode, smoothing, row_index, in_legend, f"{run_id}|mean", name, colors[run_id], {"run_id": run_id})
                    continue
                for device, (ts, ys) in devices.items():
                    if len(ts) == 0:
                        continue
                    tid = trace_id(run_id, device)
                    position = gpus_of[run_id].index(device) if device in gpus_of[run_id] else 0
                    color = PALETTE[position % len(PALETTE)] if single_run else colors[run_id]
                    dash = "solid" if single_run else DEVICE_DASHES[position % len(DEVICE_DASHES)]
                    where = f" · {device.label}" if device.label else ""
                    identity = gpu_identity(meta, device)
                    caveat = _mig_caveat(meta) if device.gpu is not None and device.mig is None else ""
                    fig.add_trace(
                        go.Scattergl(
                            x=_compact(x_values(ts, meta["start_time"], x_mode)),
                            y=_compact(ema(ys, smoothing)),
                            mode="lines",
                            name=plain(f"{meta['run_name']}{where}"),
                            legendgroup=tid,
                            showlegend=tid not in in_legend,
                            line={"color": color, "width": 1.5, "dash": dash},
                            hovertemplate=_hover(meta)
                            + in_template((f"<br>{plain(device.label)}" if device.label else "") + (f" ({plain(identity)})" if identity else "") + caveat)
                            + "<br>%{y:.3g}<extra></extra>",
                            meta={"run_id": run_id, "device": device.label},
                        ),
                        row=row_index,
                        col=1,
                    )
                    in_legend.add(tid)
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
        uirevision=f"{x_mode}-{grouped}-{gpu_mode}",  # keeps the user's zoom across redraws until the axis changes
    )
    return fig


def _mig_caveat(meta: pd.Series) -> str:
    """A MIG run whose slice's own activity could not be read: its GPU series are the whole GPU's, say so in its tooltip."""
    tags = meta.get("tags") if hasattr(meta, "get") else None
    reason = tags.get(MIG_ACTIVITY_TAG) if isinstance(tags, dict) else None
    return f"<br>⚠ the whole GPU, not the run's MIG slice ({plain(reason)})" if reason else ""


def _gpus_of(panels: list[Panel]) -> dict[str, list[Device]]:
    """Per run, every device it has in any chart, sorted: a device's place gives it the same colour or dash in each chart."""
    found: dict[str, set[Device]] = {}
    for panel in panels:
        for run_id, devices in panel.series.items():
            found.setdefault(run_id, set()).update(d for d in devices if d.gpu is not None)
    return {run_id: sorted(devices, key=Device.sort_key) for run_id, devices in found.items()}


def _add_band(
    fig, runs: pd.DataFrame, found: list, x_mode: str, smoothing: float, row: int, in_legend: set, group: str, name: str, color: str, meta: dict
) -> None:
    """The mean and min-max band of several series (runs of a workload, GPUs of a run) on a shared grid.

    The grid is time since each run's start (or steps): runs started at different wall-clock
    times, so "wall" is drawn as time since start too.
    """
    mode = "step" if x_mode == "step" else "relative"
    members = []
    for run_id, xs, ys in found:
        if len(xs) == 0:
            continue
        grid_x = np.asarray(x_values(xs, runs.loc[run_id, "start_time"], mode), dtype=np.float64)
        members.append(pd.Series(ema(ys, smoothing), index=grid_x))
    if not members:
        return
    low_x = min(s.index.min() for s in members)
    high_x = max(s.index.max() for s in members)
    grid = np.linspace(low_x, high_x, GROUP_GRID) if high_x > low_x else np.array([low_x])
    stacked = np.vstack([np.interp(grid, s.index.to_numpy(), s.to_numpy(), left=np.nan, right=np.nan) for s in members])
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns (a gap in every series) stay NaN
        mean, low, high = np.nanmean(stacked, axis=0), np.nanmin(stacked, axis=0), np.nanmax(stacked, axis=0)
    fig.add_trace(go.Scatter(x=grid, y=high, mode="lines", line={"width": 0}, legendgroup=group, showlegend=False, hoverinfo="skip"), row=row, col=1)
    fig.add_trace(
        go.Scatter(
            x=grid,
            y=low,
            mode="lines",
            line={"width": 0},
            fill="tonexty",
            fillcolor=_alpha(color, 0.18),
            legendgroup=group,
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
            name=name,
            legendgroup=group,
            showlegend=group not in in_legend,
            line={"color": color, "width": 2},
            hovertemplate=f"<b>{in_template(name)}</b><br>mean %{{y:.3g}}<extra></extra>",
            meta=meta,
        ),
        row=row,
        col=1,
    )
    in_legend.add(group)


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
    fig.add_annotation(text=plain(message), showarrow=False, font={"size": 15, "color": "#666"}, xref="paper", yref="paper", x=0.5, y=0.5)
    fig.update_layout(template="plotly_white", height=260, xaxis={"visible": False}, yaxis={"visible": False})
    return fig
