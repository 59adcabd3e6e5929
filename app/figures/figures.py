"""Figure builders: stacked overlay charts with a shared x axis, per run or grouped per workload.

Pure functions from series to Plotly figures, so the dashboard and static exports draw the same.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from radt.app.db.downsample import Envelope, coarser, swings
from radt.app.figures.palette import SCREEN, colors, dash_of, run_colors, themed
from radt.app.figures.share import SharedGpu, draw_share
from radt.app.figures.words import counted
from radt.app.summary.caveats import profiled_by, series_caveats
from radt.catalogue import Device, Metric, unit_text
from radt.runmodel import GPU_SHARE_TAG, gpu_entries

GROUP_GRID = 600  # points of a workload's mean and band
X_TITLES = {"relative": "time since run start (min)", "wall": "wall clock (UTC)", "step": "step"}
X_HOVERFORMAT = {"relative": ".2f", "wall": "%Y-%m-%d %H:%M:%S", "step": ",.1f"}  # the x value under the crosshair
SECONDS_BELOW_MIN = 2.0  # "since start" in seconds when every shown run is shorter than this many minutes
X_SECONDS_TITLE = "time since run start (s)"
OWN_SHARE_TITLE = " · each run's own share where runs shared a GPU"  # catalogue.OWN_SHARE: drawn instead of the device's line
OWN_SHARE_NOTE = "the run's own share of a GPU it shared (NVML per process)"
DEVICE_LINE_COLOUR = "#7f7f7f"  # a shared GPU's device line: no run's colour
IDLE_MARGIN = 0.02  # share of an axis below 0: a series at 0 (an idle GPU) is drawn above the axis line, not on it
X_STEP_PLACED = "training step (hardware samples placed by time)"  # hardware samples on the run's own logged steps
MAX_COLUMNS = 3  # charts side by side
LINE_WIDTH = 1.5
ENVELOPE_ALPHA = 0.18  # a downsampled run's min-max envelope: light, so many runs stay apart
GROUP_BAND_ALPHA = 0.3  # a workload's band across its runs: the point of grouped mode, clearly visible
BAND_BORDER_WIDTH = 1
SWING_SHARE = 0.1  # a swing moves a line by more than this share of its chart's value span (less is noise, drawn as it is)
CHART_SWINGS = 250  # swings a chart one column wide shows apart (one every 4 px of 1,000 px); a series with more is drawn as its envelope
DENSE_BUCKETS = 100  # that envelope's buckets across a chart one column wide: several swings each, so its mean line holds still
MIN_SPAN = 1e-9  # no axis narrower than this (a constant series)
MIN_SPAN_SHARE = 0.05  # nor narrower than 5 % of its values' size on either side
GPU_MODES = ("each", "mean")  # every GPU its own trace, or per run the mean across its GPUs with a min-max band

GRAPH_CONFIG = {  # every chart's modebar: no logo, no "Share chart..." (plotly.js 4 would upload the data to Plotly Cloud), SVG downloads
    "displaylogo": False,
    "showSendToCloud": False,
    "showEditInChartStudio": False,
    "toImageButtonOptions": {"format": "svg"},
}
SVG_POINTS = 200_000  # a figure of at most this many points draws SVG lines (bench/chart_render.py), more: WebGL

Series = tuple[np.ndarray, np.ndarray]
CHART_GAP_PX = 80  # at most this much space between two stacked charts (less than 0.04 of the figure when there are many)


def plain(value) -> str:
    """A name (run, experiment, workload, param, metric key) as Plotly text: shown as typed, never as Plotly's pseudo-HTML.

    Plotly draws <a href>, <b>, <br> and entities in legend entries, titles, annotations and
    tooltips; escaped, `<a href="http://x">evil</a>` is that text, not a link."""
    return str(value).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def wrap_words(words: list[str], fits: Callable[[str], bool]) -> list[str]:
    """Words into lines, each as long as `fits` allows (a word that fits no line stays whole): the one word wrap of
    legends (by characters) and of exported titles and labels (by their width in pixels)."""
    rows: list[str] = []
    for word in words:
        if rows and fits(f"{rows[-1]} {word}"):
            rows[-1] += f" {word}"
        else:
            rows.append(word)
    return rows


def wrap_chars(text: str, width: int, lines: int) -> list[str]:
    """Text in at most `lines` lines of at most `width` characters, wrapped at words, a longer word cut (a path in a
    command is one word: whole, it ran past the figure's edge), the rest '…'."""
    rows = wrap_words([word[i : i + width] for word in text.split() for i in range(0, len(word), width)], lambda line: len(line) <= width)
    return [*rows[: lines - 1], rows[lines - 1][: width - 2] + " …"] if len(rows) > lines else rows


@dataclass
class Panel:
    """One chart: a catalogue metric and its series per run and device (timestamps ms or steps, values; or an Envelope).

    `placed`: on the step axis, hardware samples placed at the training step their run logged at that time."""

    metric: Metric
    series: dict[str, dict[Device, Series | Envelope]]
    placed: bool = False
    share: SharedGpu | None = None  # a "GPU share" chart: the runs that shared this GPU, stacked (app/figures/share.py)
    own: frozenset[tuple[str, Device]] = frozenset()  # (run, GPU) drawn as the run's own share of a GPU runs shared
    devices: list[DeviceLine] = field(default_factory=list)  # a shared GPU's device line, drawn once (not once per run)

    @property
    def title(self) -> str:
        """The chart's title: its metric and unit, and where runs shared a GPU, that their lines are their own shares."""
        return unit_label(self.metric) + (OWN_SHARE_TITLE if self.own else "")


@dataclass
class DeviceLine:
    """A GPU's own series where runs shared it: the same for every run, so drawn once, grey, named by host and GPU."""

    name: str
    values: Series | Envelope
    start_ms: float  # the first sharing run's start: where "since start" counts from


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
    """A chart's title: the metric and its unit as catalogue.unit_text names it ('CPU (% of all cores)', 'Power (W)')."""
    return f"{metric.label} ({unit_text(metric)})" if metric.unit not in ("", "ratio", "state") else metric.label


def unit_title(metric: Metric) -> str:
    """A chart's y axis title: the unit its values are in, as catalogue.unit_text names it everywhere ('ratio (0–1)')."""
    return f"ratio ({unit_text(metric)})" if metric.unit == "ratio" else (unit_text(metric) or "value")


def y_axis(metric: Metric, low: float | None, high: float | None, log_y: bool = False) -> dict:
    """The y axis of a chart from its metric's kind and the drawn values' extremes: fixed 0-1 ratios, percent from 0
    to at least 100 (CPU above 100 shows), other non-negative metrics from 0, and never a span too small to read."""
    title = {"text": plain(unit_title(metric)), "standoff": 4}
    if log_y:
        return {"type": "log", "title": title}
    if metric.unit == "ratio":
        return {"range": _above_axis(0.0, 1.02), "title": title}
    top = 0.0 if high is None or not math.isfinite(high) else high
    if metric.unit == "%":
        return {"range": _above_axis(0.0, max(metric.high or 100.0, top) * 1.05), "title": title}
    if metric.low is not None and metric.low >= 0:
        ceiling = metric.high if metric.high is not None else 0.0
        return {"range": _above_axis(metric.low, max(top * 1.05, ceiling, MIN_SPAN)), "title": title}
    if low is None or high is None or not (math.isfinite(low) and math.isfinite(high)):
        return {"title": title}
    if low >= 0:
        return {"range": _above_axis(0.0, max(high * 1.05, MIN_SPAN)), "title": title}
    pad = max((high - low) * 0.05, abs(high) * MIN_SPAN_SHARE, MIN_SPAN)
    return {"range": [low - pad, high + pad], "title": title}


def _above_axis(low: float, high: float) -> list[float]:
    """A range whose floor sits IDLE_MARGIN of the span below `low`: a series at its floor (an idle GPU's 0) shows as a line."""
    return [low - (high - low) * IDLE_MARGIN, high]


def grid(count: int, columns: int) -> tuple[int, int]:
    """(rows, columns) of `count` charts in 1..MAX_COLUMNS columns (never more columns than charts)."""
    columns = min(max(int(columns), 1), MAX_COLUMNS, max(count, 1))
    return max(1, math.ceil(count / columns)), columns


class ChartChoices(NamedTuple):
    """The view's choices an overlay figure is drawn with (see overlay_figure)."""

    x_mode: str = "relative"
    grouped: bool = False
    smoothing: float = 0.0
    log_y: bool = False
    panel_height: int = 230
    x_range: tuple | None = None
    gpu_mode: str = "each"
    columns: int = 1
    experiments: Mapping[str, str] | None = None


def overlay_figure(panels: list[Panel], runs: pd.DataFrame, choices: ChartChoices = ChartChoices()) -> go.Figure:
    """Charts, one per metric, in a grid of `columns` (1-3) sharing one x axis.

    One trace per run and device, or with ``gpu_mode="mean"`` per run the mean across its GPUs with a min-max band;
    ``grouped``: per workload, the mean of all its runs' series with a min-max band. A series downsampled to an
    Envelope, or one swinging faster than its chart can show (_legible), is its mean line inside a light min-max envelope.
    A run is one colour (app/figures/palette.py: its place in `runs`, the view's order) and
    one legend group in every chart, its GPU and host series alike; which GPU, node or slice a line is, is its dash
    style (the same in every chart) and its tooltip. `x_range` zooms the shared x axis (minutes on "relative").
    Every trace's meta names its run (or workload) and device; tooltips are drawn by assets/charts.js from it.
    """
    x_mode, grouped, smoothing, log_y, panel_height, x_range, gpu_mode, columns, experiments = choices
    rows, cols = grid(len(panels), columns)
    spacing = (
        min(0.06 * (1 + (cols > 1)), (CHART_GAP_PX + 20 * (cols > 1)) / (panel_height * rows)) if rows > 1 else 0.0
    )  # Plotly refuses spacing × (rows - 1) > 1
    fig = make_subplots(
        rows=rows,
        cols=cols,
        shared_xaxes="all",
        vertical_spacing=spacing,
        horizontal_spacing=0.07 if cols > 1 else 0.0,
        subplot_titles=[plain(p.title) for p in panels],
    )
    runs = runs.set_index("run_id", drop=False) if "run_id" in runs else runs
    run_colour = run_colors(runs)
    wl_colors = colors(dict.fromkeys(str(w) for w in runs["workload_id"])) if len(runs) and "workload_id" in runs else {}  # in the view's order, as runs
    dashes = device_dashes(panels)
    per_minute = 60.0 if x_mode == "relative" and not grouped and _short(panels, runs) else 1.0
    line_trace = line_trace_class(panels)
    step_placed = x_mode == "step" and any(p.placed for p in panels)
    labels = _workload_labels(runs, experiments or {}) if grouped else {}
    drawing = _Drawing(fig, runs, x_mode, smoothing, gpu_mode, per_minute, line_trace, run_colour, wl_colors, dashes, set(), labels, cols)
    for index, panel in enumerate(panels):
        cell = {"row": index // cols + 1, "col": index % cols + 1}
        if panel.share is not None:
            _draw_shared(drawing, panel, cell, index)
        elif grouped:
            _draw_workloads(drawing, panel, cell)
        else:
            _draw_runs(drawing, panel, cell)
        low, high = _extremes(fig, index + 1)
        fig.update_yaxes(**y_axis(panel.metric, low, high, log_y), **cell)
    axis = "relative" if grouped and x_mode == "wall" else x_mode
    title = X_STEP_PLACED if step_placed else (X_SECONDS_TITLE if per_minute != 1 else X_TITLES.get(axis, ""))
    _x_axes(fig, len(panels), rows, cols, title, X_HOVERFORMAT.get(axis, ""))
    if x_range is not None:
        low_x, high_x = x_range
        fig.update_xaxes(range=[low_x * per_minute, high_x * per_minute] if per_minute != 1 else list(x_range))
    height = max(260, panel_height * rows)
    themed(fig, SCREEN).update_layout(
        height=height,
        margin={"l": 60, "r": 20, "t": 40, "b": 50},
        hovermode="x",  # every run's point at the cursor's x, for assets/charts.js's one box per chart and its crosshair
        hoverlabel={"namelength": -1, "font": {"size": 11}},
        spikedistance=-1,
        legend={"orientation": "h", "y": 1.0 + 40 / height, "x": 0, "yanchor": "bottom", "groupclick": "togglegroup"},
        meta={"x_per_minute": per_minute, "x_title": title},  # assets/zoom.js turns a zoom in seconds back into the view's minutes
        uirevision=f"{x_mode}-{grouped}-{gpu_mode}-{cols}-{per_minute}",  # keeps the user's zoom across redraws until the axis changes
    )
    return fig


class _Drawing(NamedTuple):
    """What every chart of one overlay figure draws with: the figure, its runs and their colours, and the view's choices."""

    fig: go.Figure
    runs: pd.DataFrame
    x_mode: str
    smoothing: float
    gpu_mode: str
    per_minute: float
    line_trace: type
    run_colour: dict[str, str]
    wl_colors: dict[str, str]
    dashes: dict
    in_legend: set[str]  # a run (or workload) is in the legend once, from the first chart it appears in
    labels: dict[str, str]  # workload id -> its name in a grouped view (_workload_labels)
    columns: int  # charts side by side: each one that much narrower


def _workload_labels(runs: pd.DataFrame, experiments: Mapping[str, str]) -> dict[str, str]:
    """Workload id -> its legend name: its label, and its experiment's name where another workload shown has the same
    label (each experiment's "ungrouped", two CSVs' "workload 1 alone": the legend read the same name twice)."""
    if runs.empty or "experiment_id" not in runs:
        return {}
    first = runs.drop_duplicates("workload_id")
    shared = first["workload_label"].duplicated(keep=False)
    return {
        str(w): f"{label} · {experiments.get(str(e)) or f'experiment {e}'}" if twice else str(label)
        for w, label, e, twice in zip(first["workload_id"], first["workload_label"], first["experiment_id"], shared, strict=True)
    }


def _draw_workloads(d: _Drawing, panel: Panel, cell: dict) -> None:
    """One chart of a grouped view: per workload, the mean of all its runs' series inside their min-max band."""
    runs, look = d.runs, _value_look(panel.metric)
    members: dict[str, list] = {}
    for run_id, devices in panel.series.items():
        if run_id in runs.index:
            members.setdefault(runs.loc[run_id, "workload_id"], []).extend((run_id, *_points(found)) for found in devices.values())
    for workload_id, found in members.items():
        label = d.labels.get(str(workload_id)) or runs.loc[runs["workload_id"] == workload_id, "workload_label"].iloc[0]
        count = len({run_id for run_id, _xs, _ys in found})
        what = f"mean of {count}" if len(found) == count else f"mean of {count} run{'s' if count > 1 else ''}, {len(found)} GPU series"
        band_meta = {"workload_id": workload_id, "name": f"{label} ({what})", "device": "", "dash": "solid"} | look
        band = Band(workload_id, plain(f"{label} ({what})"), d.wl_colors[workload_id], band_meta, GROUP_BAND_ALPHA, True)
        _add_band(d, found, cell, band)


def _draw_shared(d: _Drawing, panel: Panel, cell: dict, index: int) -> None:
    """A GPU share chart: its runs' shares stacked with the idle remainder, x from the first of them to start."""
    shared = panel.share
    present = [r for r in shared.shares if r in d.runs.index]
    origin = min((float(d.runs.loc[r, "start_time"]) for r in present), default=0.0)
    names = {r: legend_name(d.runs.loc[r]) for r in present}

    def chart_x(grid: np.ndarray):
        xs = x_values(grid, origin, "wall" if d.x_mode == "wall" else "relative")
        return xs if d.x_mode == "wall" else _compact(np.asarray(xs, dtype=np.float64) * d.per_minute)

    labels = {r: str(d.runs.loc[r, "run_name"]) for r in present}
    chart = {"cell": cell, "x": chart_x, "colour": d.run_colour, "name": names, "label": labels, "stack": f"share{index}"}
    draw_share(d.fig, shared, chart, _value_look(panel.metric))


def _devices_counted(devices: Mapping) -> str:
    """What a run's GPU mean is over, in words: "2 GPUs", "1 GPU", "2 MIG slices" (slices of one GPU are not GPUs)."""
    if all(device.mig is not None for device in devices):
        return counted(len(devices), "MIG slice")
    return counted(len({(device.node, device.gpu) for device in devices if device.gpu is not None}), "GPU")


def _draw_runs(d: _Drawing, panel: Panel, cell: dict) -> None:
    """One chart of a run view: a line per run and device (a run's colour, a device's dash), or per run the mean of its GPUs."""
    look = _value_look(panel.metric)
    room = _room(d, panel)
    for run_id, devices in panel.series.items():
        if run_id not in d.runs.index:
            continue
        meta = d.runs.loc[run_id]
        if d.gpu_mode == "mean" and sum(1 for device in devices if device.gpu is not None) > 1:
            found = [(run_id, *_points(values)) for values in devices.values()]
            series_meta = {"run_id": run_id, "name": str(meta["run_name"]), "device": f"mean of {_devices_counted(devices)}", "dash": "solid"} | look
            caveats = series_caveats(meta.get("tags"), Device())
            if caveats:
                series_meta["where"] = " · ".join(caveats)
            band = Band(run_id, legend_name(meta), d.run_colour[run_id], series_meta | _details(meta, run_id, d.in_legend), ENVELOPE_ALPHA, False)
            _add_band(d, found, cell, band, d.per_minute)
            continue
        for device, values in devices.items():
            if len(values[0]):
                own = {"own": True} if (run_id, device) in panel.own else {}
                _draw_line(d, run_id, meta, device, _legible(values, room, d.smoothing), look | own, cell)
    for line in panel.devices:
        _draw_device_line(d, line, _legible(line.values, room, d.smoothing), look, cell)


def _draw_device_line(d: _Drawing, line: DeviceLine, values, look: dict, cell: dict) -> None:
    """A shared GPU's device series, once: grey and dotted, in the legend by its host and GPU."""
    xs = x_values(values[0], line.start_ms, d.x_mode)
    xs = xs * d.per_minute if d.per_minute != 1 else xs
    group = f"device:{line.name}"
    d.fig.add_trace(
        d.line_trace(
            x=_compact(xs),
            y=_compact(ema(values[1], d.smoothing)),
            mode="lines",
            name=line.name,
            legendgroup=group,
            showlegend=group not in d.in_legend,
            line={"color": DEVICE_LINE_COLOUR, "width": LINE_WIDTH, "dash": "dot"},
            hoverinfo="none",
            meta={"run_id": group, "name": line.name, "device": "the whole GPU, every run on it", "dash": "dot"} | look,
        ),
        **cell,
    )
    d.in_legend.add(group)


class _Room(NamedTuple):
    """What one chart has room to show: the span of its y axis, the x extent of its series (stored units), its columns."""

    span: float
    width: float
    columns: int


def _room(d: _Drawing, panel: Panel) -> _Room:
    """The chart's value span as its axis draws it (a ratio's 0-1, 0 to the highest value or the metric's ceiling) and the
    extent of its runs' series on the chart's x (each run from its own start on "since start")."""
    lows, highs, firsts, lasts = [0.0], [panel.metric.high or 0.0, 1.0 if panel.metric.unit == "ratio" else 0.0], [], []
    starts = dict(zip(d.runs["run_id"], d.runs["start_time"].astype(float), strict=True)) if "start_time" in d.runs else {}
    for run_id, devices in panel.series.items():
        if run_id not in d.runs.index:
            continue  # not drawn (_draw_runs)
        offset = starts.get(run_id, 0.0) if d.x_mode == "relative" else 0.0
        for values in devices.values():
            low, high = (values.low, values.high) if isinstance(values, Envelope) else (values[1], values[1])
            finite_low, finite_high = low[np.isfinite(low)], high[np.isfinite(high)]
            lows += [float(finite_low.min())] if len(finite_low) else []
            highs += [float(finite_high.max())] if len(finite_high) else []
            if len(values[0]):
                firsts.append(float(values[0][0]) - offset)
                lasts.append(float(values[0][-1]) - offset)
    width = max(lasts) - min(firsts) if firsts else 0.0
    return _Room(max(max(highs) - min(lows), MIN_SPAN), width, d.columns)


def _legible(values: Series | Envelope, room: _Room, smoothing: float) -> Series | Envelope:
    """A series as its chart can show it: as it is or, where its line swings up and down more often than the chart has room
    for (a run starved by its data loader: SMACT 0 <-> 0.7 every few seconds), its mean over a light min-max envelope of
    coarser buckets, as a long run is drawn: its solid block of colour hid every run under it. The legend's numbers are
    the series' own, whichever way it is drawn."""
    xs = values[0]
    share = min(1.0, float(xs[-1] - xs[0]) / room.width) if room.width > 0 and len(xs) > 1 else 1.0
    line = values.mean if isinstance(values, Envelope) else values[1]
    if swings(ema(line, smoothing), SWING_SHARE * room.span) <= CHART_SWINGS * share / room.columns:
        return values
    return coarser(values, max(2, math.ceil(DENSE_BUCKETS * share / room.columns)))


def legend_name(meta: pd.Series) -> str:
    """A run's name in a legend, as Plotly text; a profiled run's with its profiler ('bert-1 (under ncu)'), so a figure
    exported without the dashboard around it still says which of its lines are profiling's; a run whose GPU gave no
    per-process figure (radt.gpu_share) says "device only": its GPU lines are the whole device's, not its own share."""
    tags = meta.get("tags")
    by = profiled_by(tags)
    name = f"{meta['run_name']} (under {by})" if by else str(meta["run_name"])
    return plain(f"{name} (device only)" if isinstance(tags, dict) and tags.get(GPU_SHARE_TAG) else name)


def _draw_line(d: _Drawing, run_id: str, meta: pd.Series, device, values, look: dict, cell: dict) -> None:
    """One run's series of one device: its line (inside its min-max envelope where it was downsampled to one)."""
    run_name, colour = legend_name(meta), d.run_colour[run_id]
    dash = d.dashes.get(device, "solid")
    trace_meta = {"run_id": run_id, "name": str(meta["run_name"]), "device": device.label, "dash": dash} | look
    where = [gpu_identity(meta, device), *series_caveats(meta.get("tags"), device), OWN_SHARE_NOTE if look.get("own") else ""]
    if any(where):
        trace_meta["where"] = " · ".join(w for w in where if w)
    xs = x_values(values[0], meta["start_time"], d.x_mode)
    xs = xs * d.per_minute if d.per_minute != 1 else xs
    if isinstance(values, Envelope):
        envelope = (ema(values.low, d.smoothing), ema(values.high, d.smoothing))
        _add_envelope(d, xs, envelope, Band(run_id, run_name, colour, trace_meta, ENVELOPE_ALPHA, False), cell)
        trace_meta["mean"] = True  # the line is the mean of each bucket; the band its min-max
    d.fig.add_trace(
        d.line_trace(
            x=_compact(xs),
            y=_compact(ema(values[1], d.smoothing)),
            mode="lines" if len(xs) > 1 else "lines+markers",  # one point is no line: a dot, not nothing
            marker={"size": 6, "color": colour} if len(xs) < 2 else None,
            name=run_name,
            legendgroup=run_id,
            showlegend=run_id not in d.in_legend,
            line={"color": colour, "width": LINE_WIDTH, "dash": dash},
            hoverinfo="none",  # assets/charts.js draws one small box per chart from the points and their meta
            meta=trace_meta | _details(meta, run_id, d.in_legend),
        ),
        **cell,
    )
    d.in_legend.add(run_id)


def _short(panels: list[Panel], runs: pd.DataFrame) -> bool:
    """Whether every drawn run is shorter than SECONDS_BELOW_MIN minutes: then "since start" counts seconds. A run's length
    is its own (duration_s), not what a zoom window loaded of it, so zooming into a long run keeps its minutes."""
    longest = 0.0
    for panel in panels:
        for run_id, devices in panel.series.items():
            if run_id not in runs.index:
                continue
            duration = runs.loc[run_id, "duration_s"] if "duration_s" in runs else math.nan
            if duration == duration and duration is not None:
                longest = max(longest, float(duration) / 60.0)
                continue
            start = runs.loc[run_id, "start_time"]
            for values in devices.values():
                xs = values.x if isinstance(values, Envelope) else values[0]
                if len(xs) and start == start:
                    longest = max(longest, (float(np.nanmax(xs)) - float(start)) / 60000.0)
    return longest < SECONDS_BELOW_MIN


def _value_look(metric: Metric) -> dict:
    """How a tooltip and the legend print a chart's values: its label, unit text and a d3 format."""
    unit = "" if metric.unit in ("ratio", "state") else unit_text(metric)
    return {"metric": metric.label, "unit": unit, "fmt": ".3f" if metric.unit == "ratio" else (".0f" if metric.unit == "state" else ",.4~g")}


def _details(meta: pd.Series, run_id: str, in_legend: set[str]) -> dict:
    """The run's details, on its first trace only (the tooltip shows them on a click): workload, letter, status, parameters."""
    if run_id in in_legend:
        return {}
    params = meta.get("params") if hasattr(meta, "get") else None
    params = {str(k): str(v)[:200] for k, v in (params.items() if isinstance(params, dict) else []) if not str(k).startswith("radt.")}
    head = " ".join(str(x) for x in (meta.get("workload_label") or "", meta.get("letter") or "") if x).strip()
    return {"detail": {"run": str(meta.get("run_name") or run_id), "workload": head, "status": str(meta.get("status") or ""), "params": params}}


def legend_entries(rendered) -> list[dict]:
    """The legend of a drawn view (a Rendered or its figure): one entry per run (or workload), its id, name, colour and dash,
    and, from a Rendered, per chart the mean / max / last of the shown window over the run's series and per device.

    The page draws its sticky table legend from these (pages/parts/legend.py); window.radtCharts.highlight(id) takes the id."""
    figure = getattr(rendered, "figure", rendered)
    out, seen = [], set()
    for trace in figure.data:
        meta = trace.meta if isinstance(trace.meta, dict) else {}
        owner = meta.get("run_id") or meta.get("workload_id")
        if meta.get("band") and not meta.get("mean"):
            continue
        if not owner or owner in seen:
            continue
        seen.add(owner)
        line = trace.line
        out.append({"id": owner, "name": trace.name, "color": line.color, "dash": "solid"})
    panels = getattr(rendered, "panels", None)
    if panels and not any("workload_id" in (t.meta or {}) for t in figure.data if isinstance(t.meta, dict)):
        dashes = device_dashes(panels)
        for entry in out:
            entry["stats"], entry["devices"] = _run_stats(panels, entry["id"], dashes)
    runs = getattr(rendered, "runs", None)
    if isinstance(runs, pd.DataFrame) and {"run_id", "params"} <= set(runs.columns):
        _name_commands(out, runs)
    return out


def _name_commands(entries: list[dict], runs: pd.DataFrame) -> None:
    """Each run entry's whole command, for its legend row's hover: MLflow's random run names alone do not say which line
    was which learning rate, and the row has no room to print it (the summary table prints what tells them apart)."""
    from radt.app.summary.compare import run_command

    whole = {r.run_id: run_command(r) for r in runs.itertuples()}
    for entry in entries:
        if whole.get(entry["id"]):
            entry["command"] = whole[entry["id"]]


def window_stats(values) -> tuple[float, float, float]:
    """(mean, max, last) of one drawn series over the shown window, NaN left out: an Envelope's bucket means (equal-width
    buckets: a time-weighted mean) and its true maximum; NaN when the window holds no value."""
    line = np.asarray(values.mean if isinstance(values, Envelope) else values[1], dtype=np.float64)
    peak = np.asarray(values.high if isinstance(values, Envelope) else values[1], dtype=np.float64)
    finite, peaks = line[np.isfinite(line)], peak[np.isfinite(peak)]
    if not len(finite):
        return math.nan, math.nan, math.nan
    return float(finite.mean()), float(peaks.max()) if len(peaks) else math.nan, float(finite[-1])


def _run_stats(panels: list[Panel], run_id: str, dashes: dict[Device, str]) -> tuple[list[dict], list[dict]]:
    """Per chart a run's mean / max / last over its devices (the mean of each device's mean, the highest max, the mean of the
    lasts), and the same per device: a GPU lying on the axis reads 0.000 in the legend."""
    stats, devices = [], {}
    for panel in panels:
        look = _value_look(panel.metric)
        found = panel.series.get(run_id) or {Device(): line.values for line in panel.devices if f"device:{line.name}" == run_id}
        per = {d: window_stats(v) for d, v in found.items() if len(v[0])}
        cell = {"metric": look["metric"], "unit": look["unit"], "fmt": look["fmt"]}
        if per:
            means, peaks, lasts = zip(*per.values(), strict=True)
            cell |= {"mean": _nan_mean(means), "max": _nan_max(peaks), "last": _nan_mean(lasts), "series": len(per)}
        stats.append(cell)
        for device, (mean, peak, last) in per.items():
            row = devices.setdefault(device, {"label": device.label or "host", "dash": dashes.get(device, "solid"), "stats": {}})
            row["stats"][look["metric"] + "|" + look["unit"]] = {"mean": mean, "max": peak, "last": last, "fmt": look["fmt"]}
    ordered = [devices[d] for d in sorted(devices, key=Device.sort_key)]
    keys = [s["metric"] + "|" + s["unit"] for s in stats]
    for row in ordered:  # one cell per chart, in the charts' order (empty where the device has no series there)
        row["stats"] = [row["stats"].get(k, {}) for k in keys]
    return stats, ordered if sum(1 for d in devices if d.gpu is not None) > 1 or len(devices) > 2 else []


def _nan_mean(values) -> float:
    finite = [v for v in values if v == v]
    return float(sum(finite) / len(finite)) if finite else math.nan


def _nan_max(values) -> float:
    finite = [v for v in values if v == v]
    return float(max(finite)) if finite else math.nan


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
    """Crosshair spikes across every chart; tick labels under every chart (a screen shows a few rows at once), the title
    under each column's last chart."""
    fig.update_xaxes(
        showspikes=True,
        spikemode="across",
        spikesnap="cursor",
        spikethickness=1,
        spikedash="dot",
        spikecolor="#888",
        hoverformat=hoverformat,
        showticklabels=True,
    )
    for col in range(1, cols + 1):
        last = max((i for i in range(count) if i % cols + 1 == col), default=None)
        if last is None:
            continue
        row = last // cols + 1
        fig.update_xaxes(showticklabels=True, title_text=title, row=row, col=col)
    for empty in range(count, rows * cols):  # the grid's unused cells at the end
        fig.update_xaxes(visible=False, row=empty // cols + 1, col=empty % cols + 1)
        fig.update_yaxes(visible=False, row=empty // cols + 1, col=empty % cols + 1)


def line_trace_class(panels: list[Panel]) -> type:
    """go.Scatter (SVG) for a figure of up to SVG_POINTS points, go.Scattergl (WebGL) beyond.

    SVG paints 60,000 points in 0.3 s where WebGL without a GPU (a VM's or a headless browser's software GL) takes 1.7 s
    and grows to 10 s at 480,000 points (bench/chart_render.py); SVG stays crisp in the modebar's SVG download too.
    A band counts twice its buckets (its polygon) beside its mean line."""
    points = 0
    for panel in panels:
        for devices in panel.series.values():
            for values in devices.values():
                points += len(values[0]) * (3 if isinstance(values, Envelope) else 1)
    return go.Scatter if points <= SVG_POINTS else go.Scattergl


def _add_envelope(d: _Drawing, xs, envelope: tuple[np.ndarray, np.ndarray], band: Band, cell: dict) -> None:
    """A downsampled series' min-max band: one light polygon in the run's colour (under its mean line), no tooltip."""
    fig, trace, (low, high) = d.fig, d.line_trace, envelope
    xs = np.asarray(xs) if not isinstance(xs, pd.DatetimeIndex) else xs.to_numpy()
    keep = np.isfinite(low) & np.isfinite(high)
    if not keep.any():
        return
    xs, low, high = xs[keep], low[keep], high[keep]
    fig.add_trace(
        trace(
            x=_compact(np.concatenate([xs, xs[::-1]])),
            y=_compact(np.concatenate([high, low[::-1]])),
            mode="lines",
            fill="toself",
            fillcolor=_alpha(band.color, band.alpha),
            line={"width": 0, "color": band.color},
            name=band.name,
            legendgroup=band.group,
            showlegend=False,
            hoverinfo="skip",
            meta=band.meta | {"band": True},
        ),
        **cell,
    )


def device_dashes(panels: list[Panel]) -> dict[Device, str]:
    """Every device any run has in any chart, sorted, each with its dash style: GPU 1 is the same dash in every run and chart.

    The run's own host (no node, no GPU) is solid; so is the first device, so a view of one-GPU runs is all solid lines."""
    found = {d for panel in panels for devices in panel.series.values() for d in devices if d != Device()}
    ordered = sorted(found, key=Device.sort_key)
    return {device: dash_of(i) for i, device in enumerate(ordered)}


@dataclass
class Band:
    """How a mean with its min-max band is drawn: legend group, name, colour, meta, fill opacity, and a border line or not."""

    group: str
    name: str
    color: str
    meta: dict
    alpha: float
    border: bool


def _add_band(d: _Drawing, found: list, cell: dict, band: Band, per_minute: float = 1.0) -> None:
    """The mean and min-max band of several series (runs of a workload, GPUs of a run) on a shared grid.

    The grid is time since each run's start (or steps): runs started at different wall-clock
    times, so "wall" is drawn as time since start too. `per_minute` scales the grid (the run view's minutes axis).
    """
    fig, runs, x_mode, smoothing, in_legend = d.fig, d.runs, d.x_mode, d.smoothing, d.in_legend
    mode = "step" if x_mode == "step" else "relative"
    members = []
    for run_id, xs, ys in found:
        if len(xs) == 0:
            continue
        grid_x = np.asarray(x_values(xs, runs.loc[run_id, "start_time"], mode), dtype=np.float64) * per_minute
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
    owner = {k: v for k, v in band.meta.items() if k in ("run_id", "workload_id")}
    common = {"mode": "lines", "legendgroup": band.group, "showlegend": False, "hoverinfo": "skip", "name": band.name, "meta": owner | {"band": True}}
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
            hoverinfo="none",
            meta=band.meta | {"mean": True},
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


MESSAGE_CHARS, MESSAGE_LINES = 80, 6  # a figure's message: ~600 px of 15 px text a line, inside the narrowest chart a page draws


def empty_figure(message: str) -> go.Figure:
    """A figure holding only its message, wrapped at words (a longer word cut) to at most MESSAGE_LINES lines: on one line a
    170-character FigureError ran past both edges of a 1,064 px figure."""
    lines = wrap_chars(str(message), MESSAGE_CHARS, MESSAGE_LINES)
    fig = go.Figure()
    fig.add_annotation(
        text="<br>".join(plain(line) for line in lines), showarrow=False, font={"size": 15, "color": "#666"}, xref="paper", yref="paper", x=0.5, y=0.5
    )
    themed(fig, SCREEN).update_layout(height=260, xaxis={"visible": False}, yaxis={"visible": False})
    return fig
