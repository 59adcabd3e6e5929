"""What `radt export` and the dashboard's export panel accept: sizes, formats, ranges, the comparison figures'
statistics and groupings, and the check of a style.

No plotting library or store here, so `radt export` answers a typo, an out-of-range DPI or `--help` before it imports
pandas and Plotly (0.8 s of CPU for a mistake otherwise).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from radt.catalogue import METRICS, MetricName, unit_text
from radt.errors import UserError

SIZES = {  # width in inches, height of one chart row in inches (slide: the whole 16:9 page)
    "single-column": (3.5, 1.9),
    "double-column": (7.0, 2.2),
    "slide": (10.0, None),
}
LEGENDS = ("top", "bottom", "right", "none")
FORMATS = ("png", "svg", "pdf", "csv")
DPI_RANGE = (30, 2400)  # PNG resolution, `radt export --dpi` and the dashboard's field alike
FONT_RANGE = (4.0, 48.0)  # points
HEIGHT_RANGE = (1.0, 30.0)  # inches, `radt export --height` and the panel's field alike

RATIO = unit_text(METRICS[MetricName.SM_ACTIVE])  # '0–1': the unit of SMACT and SMOCC, as every page writes it

# per-run aggregates: comparison-table column -> (label, unit)
STATS = {
    "smact_mean": ("mean SMACT", RATIO),
    "smact_p95": ("p95 SMACT", RATIO),
    "smocc_mean": ("mean SMOCC", RATIO),
    "smocc_p95": ("p95 SMOCC", RATIO),
    "smact_busiest": ("SMACT of the busiest GPU", RATIO),
    "gract_mean": ("mean GRACT", RATIO),
    "power_mean_w": ("mean power per GPU", "W"),
    "steps_per_h": ("throughput", "steps/h"),
    "normalised": ("normalised throughput", "× alone"),
    "energy_kj": ("energy", "kJ"),
    "run_energy_kj": ("the run's own energy (estimate)", "kJ"),
    "run_sm_share": ("the run's own SM share", "% of a GPU"),
    "energy_per_step_j": ("energy per step", "J/step"),
    "peak_memory_per_gpu_mb": ("peak memory per GPU, every process", "MB"),
    "run_memory_peak_mb": ("the run's own peak GPU memory", "MB"),
}
BY = {"workload": "workload", "collocation": "collocation", "partition": "partition", "user": "user"}  # grouping -> comparison-table column
KINDS = ("bar", "box", "cdf")
COLLOCATION = "collocation"  # the seed papers' figure: normalised throughput and GPU SMACT per method, per command


class ExportError(UserError, ValueError):
    """An export that cannot be made; the message says what to do."""


@dataclass
class ExportStyle:
    size: str = "double-column"
    font_size: float = 9.0
    monochrome: bool = False
    legend: str = "top"
    dpi: int = 300
    charts: list[str] | None = None  # metric specs to keep; None: every chart of the view
    height: float | None = None  # inches; None: as tall as the charts and legend need, at most the size's PAGE_LIMITS


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
