"""Paper figures and the data behind them, from a view: PNG/SVG/PDF through kaleido, CSV.

The figure is the dashboard's own (app/views.render) at a larger point budget, restyled for
print: a fixed size in inches, one font size, colour or monochrome (dash styles and markers),
the legend where asked. Static images need a Chromium: kaleido drives `BROWSER_PATH`, else
/usr/bin/chromium, else whatever Chrome it finds on PATH.
"""

from __future__ import annotations

import atexit
import csv
import dataclasses
import io
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
    return dataclasses.replace(style, font_size=font, dpi=round(dpi) if dpi is not None else 300, monochrome=bool(style.monochrome), charts=charts)


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


def restyle(figure: go.Figure, style: ExportStyle, charts: int) -> go.Figure:
    """The screen figure as a print figure: WebGL traces as SVG paths, fixed size, fonts, legend, monochrome."""
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
    width_in, row_in = SIZES[style.size]
    height_in = width_in * 9 / 16 if row_in is None else row_in * charts + 0.6
    font = {"size": style.font_size, "family": "DejaVu Sans, Arial, sans-serif", "color": "#000000"}
    legend = {"top": {"orientation": "h", "x": 0, "y": 1.02, "yanchor": "bottom"}, "bottom": {"orientation": "h", "x": 0, "y": -0.15, "yanchor": "top"},
              "right": {"orientation": "v", "x": 1.02, "y": 1, "xanchor": "left"}}.get(style.legend)  # fmt: skip
    out.update_layout(
        width=round(width_in * CSS_DPI),
        height=round(height_in * CSS_DPI),
        font=font,
        showlegend=legend is not None,
        legend=legend or {},
        margin={"l": 6 * style.font_size, "r": 8 * style.font_size if style.legend == "right" else 10, "t": 3.5 * style.font_size, "b": 5 * style.font_size},
        template="simple_white",
        hovermode=False,
    )
    out.update_annotations(font={"size": style.font_size})  # the charts' titles
    return out


def _monochrome(trace, number: int) -> None:
    """Series told apart by dash style and marker instead of colour (a band stays a light grey fill)."""
    if trace.fill == "tonexty" or (trace.line and trace.line.width == 0):
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
    """The print figure of a view and, per metric, the runs that lack it (exported without them)."""
    runs = chosen_runs(view)
    if style.charts:
        view = dataclasses.replace(view, metrics=[m for m in view.metrics if m in style.charts] or style.charts)
    rendered = render(view, budget=EXPORT_BUDGET, runs=runs)
    if not rendered.panels:
        raise ExportError(f"none of the metrics {', '.join(view.metrics)} exists in the chosen runs; pick others")
    return restyle(rendered.figure, style, len(rendered.panels)), rendered.missing


_KALEIDO = threading.Lock()
_kaleido_running = False


def _kaleido_server() -> None:
    """One Chromium kept for every export of this process: 4 s to start, 0.4 s an image after that."""
    global _kaleido_running
    with _KALEIDO:
        if not _kaleido_running:
            import kaleido

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
            return figure.to_image(format=fmt, scale=scale)
    except Exception as exc:  # kaleido's browser failed to start or crashed
        _kaleido_restart()
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise ExportError(f"rendering the {fmt.upper()} with {os.environ['BROWSER_PATH']} failed ({reason}); set BROWSER_PATH to a working Chromium") from exc


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
