"""Figure builders: stacked overlay charts with a shared x axis, per run or grouped per workload.

Pure functions from series to Plotly figures, so the dashboard and static exports draw the same.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from radt.app.downsample import Envelope
from radt.catalogue import Device, Metric
from radt.runmodel import MIG_ACTIVITY_TAG, gpu_entries

PALETTE = qualitative.D3 + qualitative.Set2
DEVICE_DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")  # a run's GPUs, when colour tells runs apart
GROUP_GRID = 600  # points of a workload's mean and band
X_TITLES = {"relative": "time since run start (min)", "wall": "wall clock (UTC)", "step": "step"}
X_HOVERFORMAT = {"relative": ".2f", "wall": "%Y-%m-%d %H:%M:%S", "step": ",.1f"}  # the x value under the crosshair
X_STEP_PLACED = "training step (hardware samples placed by time)"  # hardware samples on the run's own logged steps
MAX_COLUMNS = 3  # charts side by side
LINE_WIDTH = 1.5
ENVELOPE_ALPHA = 0.18  # a downsampled run's min-max envelope: light, so many runs stay apart
GROUP_BAND_ALPHA = 0.3  # a workload's band across its runs: the point of grouped mode, clearly visible
BAND_BORDER_WIDTH = 1
MIN_SPAN = 1e-9  # no axis narrower than this (a constant series)
MIN_SPAN_SHARE = 0.05  # nor narrower than 5 % of its values' size on either side
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
    """One chart: a catalogue metric and its series per run and device (timestamps ms or steps, values; or an Envelope).

    `placed`: on the step axis, hardware samples placed at the training step their run logged at that time."""

    metric: Metric
    series: dict[str, dict[Device, Series | Envelope]]
    placed: bool = False


def trace_id(run_id: str, device: Device) -> str:
    """The identity of one drawn series: a run's device (its legend entry, colour and style in every chart)."""
    return f"{run_id}|{device.label}" if device.label else run_id


def series_name(device: Device) -> str:
    """The name a device's series has in radt's keys and the radt.gpus tag: gpu_0, gpu_0_mig_3."""
    if device.gpu is None:
        return ""
    return f"gpu_{device.gpu}" + (f"_mig_{device.mig}" if device.mig is not None else "")


def gpu_identity(meta: pd.Series, device: Device) -> str:
    """'NVIDIA A100-SXM4-40GB · GPU-5fd15f35… · 00000000:07:00.0' from the run's radt.gpus tag (its node's on a multi-node run), '' when unrecorded."""
    tags = meta.get("tags") if hasattr(meta, "get") else None
    if not isinstance(tags, dict) or device.gpu is None:
        return ""
    wanted = series_name(device)
    for entry in gpu_entries(tags, device.node):
        if entry.get("series") == wanted:
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


def unit_label(metric: Metric) -> str:
    return f"{metric.label} ({metric.unit})" if metric.unit not in ("", "ratio", "state") else metric.label


def unit_title(metric: Metric) -> str:
    """A chart's y axis title: the unit its values are in (CPU: percent of one core, shown above 100)."""
    if metric.unit == "ratio":
        return "ratio (0–1)"
    if metric.unit == "%" and "cpu" in metric.name:
        return "% (100 = one core)" if metric.high is None else "% of all cores"
    if metric.unit == "state":
        return "P-state"
    return metric.unit or "value"


def y_axis(metric: Metric, low: float | None, high: float | None, log_y: bool = False) -> dict:
    """The y axis of a chart from its metric's kind and the drawn values' extremes: fixed 0-1 ratios, percent from 0
    to at least 100 (CPU above 100 shows), other non-negative metrics from 0, and never a span too small to read."""
    title = {"text": plain(unit_title(metric)), "standoff": 4}
    if log_y:
        return {"type": "log", "title": title}
    if metric.unit == "ratio":
        return {"range": [0, 1.02], "title": title}
    top = 0.0 if high is None or not math.isfinite(high) else high
    if metric.unit == "%":
        return {"range": [0, max(metric.high or 100.0, top) * 1.05], "title": title}
    if metric.low is not None and metric.low >= 0:
        ceiling = metric.high if metric.high is not None else 0.0
        return {"range": [metric.low, max(top * 1.05, ceiling, MIN_SPAN)], "title": title}
    if low is None or high is None or not (math.isfinite(low) and math.isfinite(high)):
        return {"title": title}
    if low >= 0:
        return {"range": [0, max(high * 1.05, MIN_SPAN)], "title": title}
    pad = max((high - low) * 0.05, abs(high) * MIN_SPAN_SHARE, MIN_SPAN)
    return {"range": [low - pad, high + pad], "title": title}


def x_hover(x_mode: str, step_placed: bool = False) -> str:
    """The x value in a tooltip: minutes since start, UTC wall clock or the training step."""
    if x_mode == "wall":
        return "%{x|%Y-%m-%d %H:%M:%S} UTC"
    if x_mode == "step":
        return "step %{x:,.1f}" if step_placed else "step %{x:,.0f}"
    return "%{x:.2f} min since start"


def value_hover(metric: Metric, what: str = "") -> str:
    """The value line of a tooltip: metric, value and unit ('SMACT 0.532 ratio', 'Power mean 251 W')."""
    unit = {"ratio": "", "state": ""}.get(metric.unit, metric.unit)
    if metric.unit == "%" and "cpu" in metric.name:
        unit = "% of one core" if metric.high is None else "% of all cores"
    return in_template(f"{plain(metric.label)}{' ' + what if what else ''} ") + "%{y:.4g}" + in_template(f" {plain(unit)}" if unit else "")


def grid(count: int, columns: int) -> tuple[int, int]:
    """(rows, columns) of `count` charts in 1..MAX_COLUMNS columns (never more columns than charts)."""
    columns = min(max(int(columns), 1), MAX_COLUMNS, max(count, 1))
    return max(1, math.ceil(count / columns)), columns


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
    columns: int = 1,
) -> go.Figure:
    """Charts, one per metric, in a grid of `columns` (1-3) sharing one x axis.

    One trace per run and device ("run · GPU 1"), or with ``gpu_mode="mean"`` per run the mean
    across its GPUs with a min-max band; ``grouped``: per workload, the mean of all its runs' series
    with a min-max band. A series downsampled to an Envelope is its mean line inside a light
    min-max envelope. Several runs: a colour per run, a dash style per GPU of a run; one run: a
    colour per GPU. `x_range` zooms the shared x axis. Every trace's meta names its run (or workload).
    """
    rows, cols = grid(len(panels), columns)
    spacing = (
        min(0.04 * (1 + (cols > 1)), (CHART_GAP_PX + 20 * (cols > 1)) / (panel_height * rows)) if rows > 1 else 0.0
    )  # Plotly refuses spacing × (rows - 1) > 1
    fig = make_subplots(
        rows=rows,
        cols=cols,
        shared_xaxes="all",
        vertical_spacing=spacing,
        horizontal_spacing=0.07 if cols > 1 else 0.0,
        subplot_titles=[plain(unit_label(p.metric)) for p in panels],
    )
    runs = runs.set_index("run_id", drop=False) if "run_id" in runs else runs
    colors = run_colors(list(runs.index))
    workloads = list(dict.fromkeys(runs["workload_id"])) if len(runs) else []
    wl_colors = {w: PALETTE[i % len(PALETTE)] for i, w in enumerate(workloads)}
    gpus_of = _gpus_of(panels)
    single_run = len({r for p in panels for r in p.series if r in runs.index}) == 1
    step_placed = x_mode == "step" and any(p.placed for p in panels)
    in_legend: set[str] = set()  # a series is in the legend once, from the first chart it appears in
    for index, panel in enumerate(panels):
        cell = {"row": index // cols + 1, "col": index % cols + 1}
        hover_x = x_hover(x_mode if not (grouped and x_mode == "wall") else "relative", panel.placed)
        if grouped:
            members = {}
            for run_id, devices in panel.series.items():
                if run_id in runs.index:
                    wl = runs.loc[run_id, "workload_id"]
                    members.setdefault(wl, []).extend((run_id, *_points(found)) for found in devices.values())
            for workload_id, found in members.items():
                label = runs.loc[runs["workload_id"] == workload_id, "workload_label"].iloc[0]
                count = len({run_id for run_id, _xs, _ys in found})
                series = len(found)
                what = f"mean of {count}" if series == count else f"mean of {count} runs, {series} GPU series"
                band = Band(workload_id, plain(f"{label} ({what})"), wl_colors[workload_id], {"workload_id": workload_id}, GROUP_BAND_ALPHA, True)
                _add_band(fig, runs, found, x_mode, smoothing, cell, in_legend, band, panel.metric, hover_x)
        else:
            for run_id, devices in panel.series.items():
                if run_id not in runs.index:
                    continue
                meta = runs.loc[run_id]
                if gpu_mode == "mean" and sum(1 for d in devices if d.gpu is not None) > 1:
                    found = [(run_id, *_points(values)) for values in devices.values()]
                    name = plain(f"{meta['run_name']} · mean of {len(found)} GPUs")
                    band = Band(f"{run_id}|mean", name, colors[run_id], {"run_id": run_id}, ENVELOPE_ALPHA, False)
                    _add_band(fig, runs, found, x_mode, smoothing, cell, in_legend, band, panel.metric, hover_x)
                    continue
                for device, values in devices.items():
                    if len(values[0]) == 0:
                        continue
                    tid = trace_id(run_id, device)
                    position = gpus_of[run_id].index(device) if device in gpus_of[run_id] else 0
                    color = PALETTE[position % len(PALETTE)] if single_run else colors[run_id]
                    dash = "solid" if single_run else DEVICE_DASHES[position % len(DEVICE_DASHES)]
                    name = plain(f"{meta['run_name']}{f' · {device.label}' if device.label else ''}")
                    trace_meta = {"run_id": run_id, "device": device.label}
                    xs = x_values(values[0], meta["start_time"], x_mode)
                    if isinstance(values, Envelope):
                        _add_envelope(fig, xs, ema(values.low, smoothing), ema(values.high, smoothing), name, tid, color, trace_meta, cell)
                    identity = gpu_identity(meta, device)
                    caveat = _mig_caveat(meta) if device.gpu is not None and device.mig is None else ""
                    where = in_template((f"<br>{plain(identity)}" if identity else "") + caveat) + _run_context(meta)
                    fig.add_trace(
                        go.Scattergl(
                            x=_compact(xs),
                            y=_compact(ema(values[1], smoothing)),
                            mode="lines",
                            name=name,
                            legendgroup=tid,
                            showlegend=tid not in in_legend,
                            line={"color": color, "width": LINE_WIDTH, "dash": dash},
                            hovertemplate=f"<b>{in_template(name)}</b>{where}<br>"
                            + value_hover(panel.metric, "mean" if isinstance(values, Envelope) else "")
                            + f" · {hover_x}<extra></extra>",
                            meta=trace_meta,
                        ),
                        **cell,
                    )
                    in_legend.add(tid)
        low, high = _extremes(fig, index + 1)
        fig.update_yaxes(**y_axis(panel.metric, low, high, log_y), **cell)
    axis = "relative" if grouped and x_mode == "wall" else x_mode
    _x_axes(fig, len(panels), rows, cols, X_STEP_PLACED if step_placed else X_TITLES.get(axis, ""), X_HOVERFORMAT.get(axis, ""))
    if x_range is not None:
        fig.update_xaxes(range=list(x_range))
    height = max(260, panel_height * rows)
    fig.update_layout(
        height=height,
        margin={"l": 60, "r": 20, "t": 40, "b": 50},
        template="plotly_white",
        hovermode="x",  # with assets/charts.js: hovering one chart shows every chart's values at that x
        hoverlabel={"namelength": -1, "font": {"size": 11}},
        spikedistance=-1,
        legend={"orientation": "h", "y": 1.0 + 40 / height, "x": 0, "yanchor": "bottom"},
        uirevision=f"{x_mode}-{grouped}-{gpu_mode}-{cols}",  # keeps the user's zoom across redraws until the axis changes
    )
    return fig


def legend_entries(rendered) -> list[dict]:
    """The legend of a drawn view (a Rendered or its figure), once per series: its run (or workload) id, name, colour, dash.

    The page draws its own sticky legend from these; window.radtCharts.highlight(id) takes the id."""
    figure = getattr(rendered, "figure", rendered)
    out, seen = [], set()
    for trace in figure.data:
        meta = trace.meta if isinstance(trace.meta, dict) else {}
        key = trace.legendgroup or trace.name
        if trace.showlegend is False or meta.get("band") or key in seen or not (meta.get("run_id") or meta.get("workload_id")):
            continue
        seen.add(key)
        line = trace.line
        out.append({"id": meta.get("run_id") or meta.get("workload_id"), "name": trace.name, "color": line.color, "dash": line.dash or "solid"})
    return out


def _points(values) -> Series:
    """The line of a series: its points, or an Envelope's bucket means."""
    return (values.x, values.mean) if isinstance(values, Envelope) else (values[0], values[1])


def _extremes(fig: go.Figure, number: int) -> tuple[float | None, float | None]:
    """The lowest and highest value drawn on chart `number` (1-based), bands included; None when it has none."""
    axis = "y" if number == 1 else f"y{number}"
    arrays = [np.asarray(t.y, dtype=np.float64) for t in fig.data if (t.yaxis or "y") == axis and t.y is not None and len(t.y)]
    finite = [a[np.isfinite(a)] for a in arrays]
    finite = [a for a in finite if len(a)]
    if not finite:
        return None, None
    return float(min(a.min() for a in finite)), float(max(a.max() for a in finite))


def _x_axes(fig: go.Figure, count: int, rows: int, cols: int, title: str, hoverformat: str) -> None:
    """Crosshair spikes across every chart; tick labels and the title under each column's last chart."""
    fig.update_xaxes(showspikes=True, spikemode="across", spikesnap="cursor", spikethickness=1, spikedash="dot", spikecolor="#888", hoverformat=hoverformat)
    for col in range(1, cols + 1):
        last = max((i for i in range(count) if i % cols + 1 == col), default=None)
        if last is None:
            continue
        row = last // cols + 1
        fig.update_xaxes(showticklabels=True, title_text=title, row=row, col=col)
    for empty in range(count, rows * cols):  # the grid's unused cells at the end
        fig.update_xaxes(visible=False, row=empty // cols + 1, col=empty % cols + 1)
        fig.update_yaxes(visible=False, row=empty // cols + 1, col=empty % cols + 1)


def _add_envelope(fig: go.Figure, xs, low: np.ndarray, high: np.ndarray, name: str, group: str, color: str, meta: dict, cell: dict) -> None:
    """A downsampled series' min-max band: one light polygon in the run's colour (under its mean line), no tooltip."""
    xs = np.asarray(xs) if not isinstance(xs, pd.DatetimeIndex) else xs.to_numpy()
    keep = np.isfinite(low) & np.isfinite(high)
    if not keep.any():
        return
    xs, low, high = xs[keep], low[keep], high[keep]
    fig.add_trace(
        go.Scattergl(
            x=_compact(np.concatenate([xs, xs[::-1]])),
            y=_compact(np.concatenate([high, low[::-1]])),
            mode="lines",
            fill="toself",
            fillcolor=_alpha(color, ENVELOPE_ALPHA),
            line={"width": 0, "color": color},
            name=name,
            legendgroup=group,
            showlegend=False,
            hoverinfo="skip",
            meta=meta | {"band": True},
        ),
        **cell,
    )


def _run_context(row: pd.Series) -> str:
    """A tooltip's line on the run's workload, letter and first params, as text ready for a hovertemplate."""
    params = row.get("params") or {}
    params = params if isinstance(params, dict) else {}
    shown = ", ".join(f"{k}={v}" for k, v in list(params.items())[:6] if not str(k).startswith("radt."))
    letter = f" {row['letter']}" if row.get("letter") else ""
    line = f"{row.get('workload_label') or ''}{letter}" + (f" · {shown}" if shown else "")
    return in_template(f"<br>{plain(line)}") if line.strip() else ""


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


@dataclass
class Band:
    """How a mean with its min-max band is drawn: legend group, name, colour, meta, fill opacity, and a border line or not."""

    group: str
    name: str
    color: str
    meta: dict
    alpha: float
    border: bool


def _add_band(
    fig, runs: pd.DataFrame, found: list, x_mode: str, smoothing: float, cell: dict, in_legend: set, band: Band, metric: Metric, hover_x: str
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
    grid_x = np.linspace(low_x, high_x, GROUP_GRID) if high_x > low_x else np.array([low_x])
    stacked = np.vstack([np.interp(grid_x, s.index.to_numpy(), s.to_numpy(), left=np.nan, right=np.nan) for s in members])
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns (a gap in every series) stay NaN
        mean, low, high = np.nanmean(stacked, axis=0), np.nanmin(stacked, axis=0), np.nanmax(stacked, axis=0)
    edge = {"width": BAND_BORDER_WIDTH, "color": _alpha(band.color, 0.7)} if band.border else {"width": 0}
    meta = band.meta | {"band": True}
    common = {"mode": "lines", "legendgroup": band.group, "showlegend": False, "hoverinfo": "skip", "name": band.name, "meta": meta}
    fig.add_trace(go.Scatter(x=grid_x, y=high, line=edge, **common), **cell)
    fig.add_trace(go.Scatter(x=grid_x, y=low, line=edge, fill="tonexty", fillcolor=_alpha(band.color, band.alpha), **common), **cell)
    fig.add_trace(
        go.Scatter(
            x=grid_x,
            y=mean,
            mode="lines",
            name=band.name,
            legendgroup=band.group,
            showlegend=band.group not in in_legend,
            line={"color": band.color, "width": 2},
            hovertemplate=f"<b>{in_template(band.name)}</b><br>{value_hover(metric, 'mean')} · {hover_x}<extra></extra>",
            meta=band.meta,
        ),
        **cell,
    )
    in_legend.add(band.group)


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
