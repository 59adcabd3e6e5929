"""Paper figures and the data behind them, from a view: PNG/SVG/PDF through kaleido, CSV.

The figure is the dashboard's own (app/views.render) at a larger point budget, restyled for
print: a fixed size in inches, one font size, colour or monochrome (dash styles and markers),
the legend where asked, in margin kept free for it. Many charts become a grid of small multiples that
fits a page (7 × 9 in unless a height is given). A PDF's title is the view's. Static images need a Chromium: kaleido drives `BROWSER_PATH`, else
/usr/bin/chromium, else whatever Chrome it finds on PATH.
"""

from __future__ import annotations

import atexit
import csv
import dataclasses
import io
import logging
import math
import os
import shutil
import threading
import warnings
from dataclasses import dataclass

import pandas as pd
import plotly.graph_objects as go

from radt.app import data
from radt.app.views import EXPORT_BUDGET, View, render, view_runs, x_range

CSS_DPI = 96  # Plotly's pixel is a CSS pixel: 96 per inch
SIZES = {  # width in inches, height of one chart row in inches (slide: the whole 16:9 page)
    "single-column": (3.5, 1.9),
    "double-column": (7.0, 2.2),
    "slide": (10.0, None),
}
LEGENDS = ("top", "bottom", "right", "none")
FORMATS = ("png", "svg", "pdf", "csv")
DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")
MARKERS = ("circle", "square", "triangle-up", "diamond", "x", "cross", "star", "triangle-down")
GREYS = ("#000000", "#555555", "#888888")
DPI_RANGE = (30, 2400)  # PNG resolution, `radt export --dpi` and the dashboard's field alike
FONT_RANGE = (4.0, 48.0)  # points
PAGE_HEIGHT = 9.0  # inches: the default height a figure must fit (a double-column page's text block)
HEIGHT_RANGE = (1.0, 30.0)  # inches, `radt export --height` and the panel's field alike
MIN_ROW = 1.5  # inches: a chart row shorter than this is unreadable, so more columns are used first
MAX_COLUMNS = {"single-column": 1, "double-column": 2, "slide": 3}
MAX_PIXELS = 50_000_000  # a PNG's width × height: 2400 dpi on a tall figure would take the server gigabytes of memory


class ExportError(ValueError):
    """An export that cannot be made; the message says what to do."""


@dataclass
class ExportStyle:
    size: str = "double-column"
    font_size: float = 9.0
    monochrome: bool = False
    legend: str = "top"
    dpi: int = 300
    charts: list[str] | None = None  # metric specs to keep; None: every chart of the view
    height: float | None = None  # inches; None: as tall as the charts need, at most PAGE_HEIGHT


def check_style(style: ExportStyle, fmt: str | None = None) -> ExportStyle:
    """The style as a figure can be drawn from it, whatever a form or the command line sent; ExportError says what to change.

    The DPI is checked for PNG (`fmt` None: always, as `radt export --dpi` is); the size in pixels once the figure is known (image_bytes)."""
    if style.size not in SIZES:
        raise ExportError(f"size '{str(style.size)[:40]}' is not one of {', '.join(SIZES)}")
    if style.legend not in LEGENDS:
        raise ExportError(f"legend '{str(style.legend)[:40]}' is not one of {', '.join(LEGENDS)}")
    font = _number(style.font_size)
    if font is None or not FONT_RANGE[0] <= font <= FONT_RANGE[1]:
        raise ExportError(f"font size {str(style.font_size)[:40]} is out of range; use {FONT_RANGE[0]:g} to {FONT_RANGE[1]:g} points (9 for a paper)")
    dpi = _number(style.dpi)
    if fmt in (None, "png") and (dpi is None or not DPI_RANGE[0] <= dpi <= DPI_RANGE[1]):
        given = "no DPI given" if style.dpi in (None, "") else f"DPI {str(style.dpi)[:40]} is out of range"
        raise ExportError(f"{given}; use {DPI_RANGE[0]} to {DPI_RANGE[1]} (300 for print)")
    charts = [c for c in style.charts if isinstance(c, str)] if isinstance(style.charts, list) else None
    height = None if style.height in (None, "") else _number(style.height)
    if style.height not in (None, "") and (height is None or not HEIGHT_RANGE[0] <= height <= HEIGHT_RANGE[1]):
        raise ExportError(f"height {str(style.height)[:40]} is out of range; use {HEIGHT_RANGE[0]:g} to {HEIGHT_RANGE[1]:g} inches (9 for a page)")
    return dataclasses.replace(
        style, font_size=font, dpi=round(dpi) if dpi is not None else 300, monochrome=bool(style.monochrome), charts=charts, height=height
    )


def _number(value) -> float | None:
    """A finite number from a form field or an option (None, text, NaN: None)."""
    if isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def chromium() -> str:
    """The browser kaleido will drive; ExportError naming the fix when there is none."""
    path = os.environ.get("BROWSER_PATH")
    if path:
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            raise ExportError(f"BROWSER_PATH={path} is not an executable; point it at Chromium or Chrome, or unset it")
        return path
    for candidate in ("/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = candidate if os.path.isabs(candidate) and os.access(candidate, os.X_OK) else shutil.which(candidate)
        if found:
            return found
    raise ExportError(
        "PNG, SVG and PDF need Chromium or Chrome: install it (Debian: apt install chromium) or set BROWSER_PATH=/path/to/chrome; CSV needs neither"
    )


def page_grid(charts: int, style: ExportStyle) -> int:
    """How many columns `charts` charts take at the style's width so that they fit its height (MIN_ROW tall rows or more)."""
    limit = style.height or PAGE_HEIGHT
    overhead = 1.0 + (0.4 if style.legend in ("top", "bottom") else 0.0)  # titles, axes and a legend of about two lines, in inches
    widest = MAX_COLUMNS.get(style.size, 1)
    for columns in range(1, widest + 1):
        if math.ceil(charts / columns) * MIN_ROW + overhead <= limit:
            return columns
    return widest


def legend_names(figure: go.Figure) -> list[str]:
    """The names the legend shows: one per legend group (a run's GPUs and bands share one)."""
    names: dict[str, str] = {}
    for trace in figure.data:
        if trace.showlegend is False or not trace.name:
            continue
        names.setdefault(trace.legendgroup or trace.name, str(trace.name))
    return list(names.values())


def _text_px(text: str, font: float) -> float:
    """About how wide a line of text is in pixels (DejaVu Sans averages 0.62 em a character, with its spaces and capitals)."""
    return len(text) * 0.62 * font


def legend_lines(names: list[str], width_px: float, font: float) -> int:
    """How many lines a horizontal legend of `names` takes in `width_px` (symbol and gap beside each entry)."""
    lines, used = (1 if names else 0), 0.0
    for name in names:
        entry = _text_px(name, font) + 56  # Plotly's 40 px symbol and the gaps around an item
        if used and used + entry > width_px:
            lines, used = lines + 1, 0.0
        used += entry
    return lines


def restyle(figure: go.Figure, style: ExportStyle, charts: int, title: str | None = None) -> go.Figure:
    """The screen figure as a print figure: WebGL traces as SVG paths, fixed size, fonts, legend in its own margin, monochrome.

    `charts` rows-worth of charts are the figure's grid rows (the figure is laid out in columns already); the height is
    what the rows need, at most the style's height (default PAGE_HEIGHT), or exactly the style's height when it has one.
    `title` becomes the PDF's title (kept in layout.meta)."""
    if style.size not in SIZES:
        raise ExportError(f"size '{style.size}' is not one of {', '.join(SIZES)}")
    if style.legend not in LEGENDS:
        raise ExportError(f"legend '{style.legend}' is not one of {', '.join(LEGENDS)}")
    out = go.Figure(figure)
    out.data = ()
    series: dict[str, int] = {}  # a run (or workload) keeps its dash style and marker in every chart
    for number, trace in enumerate(figure.data):
        spec = trace.to_plotly_json()
        if spec.get("type") == "scattergl":  # WebGL would become a bitmap inside an SVG or PDF
            spec["type"] = "scatter"
        out.add_trace(go.Scatter(spec) if spec.get("type") == "scatter" else trace)
        if style.monochrome:
            _monochrome(out.data[-1], series.setdefault(trace.legendgroup or str(number), len(series)))
    font_size = style.font_size
    width_in, row_in = SIZES[style.size]
    width_px = width_in * CSS_DPI
    names = legend_names(out) if style.legend != "none" else []
    margin = {"l": 6 * font_size, "r": 10, "t": 3.5 * font_size, "b": 4.5 * font_size}  # t: the first row's chart titles
    legend: dict = {}
    if names and style.legend in ("top", "bottom"):
        lines = legend_lines(names, width_px - margin["l"] - 10, font_size)
        reserved = lines * (1.4 * font_size + 17) + 6  # Plotly's legend row: the text's line and the symbol's 16 px box, plus gaps
        if style.legend == "top":
            margin["t"] += reserved
            legend = {"orientation": "h", "x": 0, "xanchor": "left", "y": 1, "yanchor": "top", "yref": "container"}
        else:
            margin["b"] += reserved
            legend = {"orientation": "h", "x": 0, "xanchor": "left", "y": 0, "yanchor": "bottom", "yref": "container"}
    elif names:  # right: as wide as its longest name
        margin["r"] = min(width_px * 0.45, max(_text_px(n, font_size) for n in names) + 4 * font_size)
        legend = {"orientation": "v", "x": 1, "xanchor": "right", "xref": "container", "y": 1, "yanchor": "top"}
    if style.height:
        height_in = style.height
    elif row_in is None:
        height_in = width_in * 9 / 16
    else:
        height_in = min(
            PAGE_HEIGHT, math.ceil((charts * row_in + (margin["t"] + margin["b"]) / CSS_DPI) * 2) / 2
        )  # whole half inches: whole pixels at any even DPI
    out.update_layout(
        width=round(width_px),
        height=round(height_in * CSS_DPI),
        font={"size": font_size, "family": "DejaVu Sans, Arial, sans-serif", "color": "#000000"},
        showlegend=bool(names),
        legend=legend | {"font": {"size": font_size}, "bgcolor": "rgba(0,0,0,0)"},
        margin=margin,
        template="simple_white",
        hovermode=False,
        meta={"title": title} if title else None,
    )
    out.update_annotations(font={"size": font_size})  # the charts' titles
    return out


def _monochrome(trace, number: int) -> None:
    """Series told apart by dash style and marker instead of colour (a band stays a light grey fill)."""
    if trace.fill == "tonexty" or (trace.line and trace.line.width == 0) or (isinstance(trace.meta, dict) and trace.meta.get("band")):
        trace.fillcolor = "rgba(0,0,0,0.12)"
        trace.line.color = "rgba(0,0,0,0)"
        return
    trace.line.color = GREYS[number % len(GREYS)]
    trace.line.dash = DASHES[number % len(DASHES)]
    trace.mode = "lines+markers"
    # a dozen markers per line (Plotly's maxdisplayed), so they stay readable on a dense series
    trace.marker = {"symbol": MARKERS[number % len(MARKERS)], "size": 5, "color": trace.line.color, "maxdisplayed": 12}


def chosen_runs(view: View) -> pd.DataFrame:
    """The view's runs as the store lists them; ExportError saying what to do when there are none."""
    if not view.runs:
        raise ExportError("no runs selected; pick runs in the dashboard and save the view, or give --experiment (and --workload/--run)")
    runs = view_runs(view)
    if runs.empty:
        raise ExportError(f"none of the view's {len(view.runs)} runs is in this store; check --store, or save the view again")
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
    return f"{', '.join(dict.fromkeys(what))} · {len(names)} run{'s' if len(names) != 1 else ''}: {shown}"[:300]


def comparison_figure(view: View, style: ExportStyle, kind: str, stat: str = "smact_mean", by: str = "workload", run_id: str | None = None) -> go.Figure:
    """A comparison figure (app/aggregates.py: bar, box, cdf of a per-run statistic by workload or collocation; activity of one run), for print."""
    from radt.app.aggregates import STATS, FigureError, activity_figure, aggregate_figure

    runs = chosen_runs(view)
    try:
        if kind == "activity":
            chosen = run_id or str(runs["run_id"].iloc[0])
            series, title = activity_series(view, chosen)
            figure = activity_figure(series, title)
        else:
            figure = aggregate_figure(kind, comparison_table(view, runs), stat, by)
            title = f"{STATS.get(stat, (stat,))[0]} by {by} ({kind})"
    except FigureError as exc:
        raise ExportError(str(exc)) from exc
    figure.update_layout(title=None)  # the paper's caption says it; the PDF's metadata keeps it
    return restyle(figure, style, 1, view_title([title], runs))


def activity_series(view: View, run_id: str) -> tuple[dict[str, tuple], str]:
    """GRACT, SMACT, SMOCC (and nvidia-smi's utilisation) of one run's busiest GPU, seconds since start; and the figure's title."""
    from radt.app.aggregates import ACTIVITY, busiest

    runs = view_runs(dataclasses.replace(view, runs=[run_id]))
    if runs.empty:
        raise ExportError(f"run {run_id[:40]} is not in the view's experiments; pick one of its runs")
    row = runs.iloc[0]
    found = {name: data.series(f"cat:{name}", runs, budget=EXPORT_BUDGET, gpus=view.gpus).get(run_id, {}) for name, *_ in ACTIVITY}
    device = busiest(found.get("gr_engine_active") or found.get("sm_active") or {})
    start = row["start_time"] if pd.notna(row["start_time"]) else None
    series = {}
    for name, devices in found.items():
        if device in devices:
            ts, values = devices[device]
            first = start if start is not None else (ts[0] if len(ts) else 0)
            series[name] = ((ts - first) / 1000.0, values)
    where = f" · {device.label}" if device is not None and getattr(device, "label", "") else ""
    return series, f"GRACT vs SMACT vs SMOCC · {row['run_name']}{where}"


_KALEIDO = threading.Lock()
_kaleido_running = False


def _kaleido_server() -> None:
    """One Chromium kept for every export of this process: 4 s to start, 0.4 s an image after that."""
    global _kaleido_running
    with _KALEIDO:
        if not _kaleido_running:
            import kaleido

            _quiet_browser_logs()
            kaleido.start_sync_server(silence_warnings=True)
            atexit.register(kaleido.stop_sync_server, silence_warnings=True)
            _kaleido_running = True


def _kaleido_restart() -> None:
    """After a failure the browser may be gone: the next export starts a new one."""
    global _kaleido_running
    with _KALEIDO:
        if _kaleido_running:
            import kaleido

            kaleido.stop_sync_server(silence_warnings=True)
            _kaleido_running = False


def image_bytes(figure: go.Figure, fmt: str, dpi: int) -> bytes:
    """PNG at `dpi` (width in pixels = inches × dpi), or SVG/PDF at the figure's size in inches."""
    scale = dpi / CSS_DPI if fmt == "png" else 1
    if fmt == "png":
        width, height = round((figure.layout.width or 700) * scale), round((figure.layout.height or 500) * scale)
        if width * height > MAX_PIXELS:
            fits = math.floor(dpi * math.sqrt(MAX_PIXELS / (width * height)))
            raise ExportError(
                f"a PNG of {width} × {height} pixels ({width * height / 1e6:.0f} MP) at {dpi} DPI is over the {MAX_PIXELS // 1_000_000} MP limit; "
                f"use {fits} DPI or less, fewer charts, or SVG/PDF (sharp at any size)"
            )
    os.environ.setdefault("BROWSER_PATH", chromium())
    try:
        _kaleido_server()
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="The kopts argument is ignored")
            image = figure.to_image(format=fmt, scale=scale)
    except Exception as exc:  # kaleido's browser failed to start or crashed
        _kaleido_restart()
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise ExportError(f"rendering the {fmt.upper()} with {os.environ['BROWSER_PATH']} failed ({reason}); set BROWSER_PATH to a working Chromium") from exc
    meta = figure.layout.meta
    title = meta.get("title") if isinstance(meta, dict) else None
    return with_pdf_title(image, title) if fmt == "pdf" and title else image


def with_pdf_title(pdf: bytes, title: str) -> bytes:
    """The PDF with its document title set (kaleido leaves its own, "Kaleido-fier"), and radt as its creator."""
    from pypdf import PdfReader, PdfWriter

    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(pdf)))
    writer.add_metadata({"/Title": title, "/Creator": "radt export", "/Producer": "radt export (Plotly, kaleido, pypdf)"})
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


BROWSER_LOGGERS = ("kaleido", "choreographer", "logistro")


def _quiet_browser_logs() -> None:
    """Keep kaleido's and choreographer's logging (browser JSON, tracebacks as the browser closes at exit) off the user's terminal:
    a failed image is reported once, as an ExportError."""
    for name in BROWSER_LOGGERS:
        logger = logging.getLogger(name)
        logger.setLevel(logging.CRITICAL + 1)
        logger.propagate = False


def data_csv(view: View, charts: list[str] | None = None) -> tuple[str, dict[str, list[str]]]:
    """Every stored point of the view's runs and metrics (within its zoom), long format; and the runs lacking a metric."""
    runs = chosen_runs(view)
    limits = x_range(view)
    windows = data.zoom_windows(limits, view.axis, runs) if limits else {}
    buffer = io.StringIO()
    out = csv.writer(buffer, lineterminator="\n")
    out.writerow(
        ["run_id", "run_name", "experiment_id", "workload", "letter", "node", "gpu", "mig_instance", "metric", "timestamp_ms", "seconds_since_start", "value"]
    )
    missing: dict[str, list[str]] = {}
    meta = runs.set_index("run_id", drop=False)
    for spec in charts or view.metrics:
        found = data.series(spec, runs, windows, budget=10**9, x="relative", gpus=view.gpus)
        lacking = [meta.loc[r, "run_name"] for r in runs["run_id"] if r not in found]
        if lacking:
            missing[spec] = lacking
        name = spec.partition(":")[2]
        for run_id, devices in found.items():
            row = meta.loc[run_id]
            for device, (ts, ys) in devices.items():
                start = row["start_time"] if pd.notna(row["start_time"]) else (ts[0] if len(ts) else 0)
                where = ["" if v is None else v for v in (device.node, device.gpu, device.mig)]
                for t, y in zip(ts.tolist(), ys.tolist(), strict=False):
                    out.writerow(
                        [
                            run_id,
                            row["run_name"],
                            row["experiment_id"],
                            row["workload_label"],
                            row["letter"],
                            *where,
                            name,
                            int(t),
                            f"{(t - start) / 1000:.3f}",
                            repr(float(y)),
                        ]
                    )
    return buffer.getvalue(), missing


def comparison_table(view: View, runs: pd.DataFrame | None = None) -> pd.DataFrame:
    """The view's comparison table (app/compare.py): its runs (`runs` when the caller has them listed already),
    and the groups of runs that ran together against the same runs alone. Groups and alone runs are found
    among every run of the runs' experiments, so ticking some runs of a workload gives the same figures."""
    from radt.app.compare import comparison, related_runs

    runs = chosen_runs(view) if runs is None else runs
    library = data.runs(sorted({*view.experiments, *runs["experiment_id"]}))
    related = related_runs(runs, library)
    return comparison(runs, data.summary(runs), library, data.summary(related))
