"""A view (the runs, metrics and chart settings a user picked) and the one path from it to a figure.

The explore page keeps a view in its URL; "save view" writes the same dict as JSON; `radt
export --view` reads it back. All three draw through `render()`, so an exported figure holds the
same traces as the screen, only at a larger point budget.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from app import data
from app.catalogue import METRICS
from app.data import DEFAULT_METRICS, X_MODES, spec_metric
from app.figures import GPU_MODES, Panel, overlay_figure

VIEW_VERSION = 1
SCREEN_BUDGET = 2000  # points per series sent to the browser
EXPORT_BUDGET = 20000  # points per series in an exported figure: beyond a print's resolution


class ViewError(ValueError):
    """A view that cannot be drawn; the message says what to change."""


def _split(value) -> list[str]:
    if isinstance(value, list | tuple):
        return [str(v) for v in value if str(v)]
    return [v for v in str(value or "").split(",") if v]


@dataclass
class View:
    experiments: list[str]
    runs: list[str]
    metrics: list[str] = field(default_factory=lambda: list(DEFAULT_METRICS))
    x: str = "relative"
    mode: str = "runs"
    smoothing: float = 0.0
    log_y: bool = False
    zoom: str | None = None  # "low,high" on the view's axis, as the URL writes it
    gpus: list[int] | None = None  # only these GPU indices (None: every GPU the runs used)
    gpu_mode: str = "each"  # "each": a trace per GPU; "mean": per run the mean across its GPUs, with a min-max band

    @classmethod
    def from_dict(cls, raw: dict) -> View:
        """The URL's query dict or a saved view file (the same keys)."""
        x = raw.get("x") if raw.get("x") in X_MODES else "relative"
        mode = raw.get("mode") if raw.get("mode") in ("runs", "grouped") else "runs"
        try:
            smoothing = min(max(float(raw.get("smooth") or 0), 0.0), 0.99)
        except ValueError:
            smoothing = 0.0
        gpus = sorted({int(g) for g in _split(raw.get("gpu")) if g.isdigit()}) or None
        gpu_mode = raw.get("gpuagg") if raw.get("gpuagg") in GPU_MODES else "each"
        return cls(_split(raw.get("exp")), _split(raw.get("runs")), _split(raw.get("metrics")) or list(DEFAULT_METRICS), x, mode, smoothing,
                   str(raw.get("log")) in ("1", "true", "True"), raw.get("xr") or None, gpus, gpu_mode)  # fmt: skip

    def to_dict(self) -> dict:
        out = {"exp": ",".join(self.experiments), "runs": ",".join(self.runs), "metrics": ",".join(self.metrics), "x": self.x, "mode": self.mode}
        out |= {"smooth": f"{self.smoothing:g}", "log": "1" if self.log_y else "0"}
        if self.zoom:
            out["xr"] = self.zoom
        if self.gpus:
            out["gpu"] = ",".join(map(str, self.gpus))
        if self.gpu_mode != "each":
            out["gpuagg"] = self.gpu_mode
        return out

    @property
    def axis(self) -> str:
        """The x axis really drawn: grouped runs share time since start, even on "wall"."""
        return "relative" if self.mode == "grouped" and self.x == "wall" else self.x


def load_view(path: Path) -> View:
    """A view saved by the dashboard's "save view" (JSON); one line saying what is wrong otherwise."""
    try:
        raw = json.loads(Path(path).read_text())
    except FileNotFoundError as exc:
        raise ViewError(f"view file '{path}' not found; save one with the dashboard's 'save view' button") from exc
    except (OSError, json.JSONDecodeError) as exc:
        raise ViewError(f"'{path}' is not a radt view ({exc}); save one with the dashboard's 'save view' button") from exc
    if not isinstance(raw, dict) or "runs" not in raw:
        raise ViewError(f"'{path}' is not a radt view (no 'runs'); save one with the dashboard's 'save view' button")
    return View.from_dict(raw.get("view", raw))


def save_view(view: View) -> str:
    """The JSON text of a saved view."""
    return json.dumps({"radt_view": VIEW_VERSION, **view.to_dict()}, indent=2)


def x_range(view: View) -> tuple | None:
    """The zoom as chart x values (minutes or steps as floats, wall clock as timestamps)."""
    parts = _split(view.zoom)
    if len(parts) != 2:
        return None
    try:
        if view.axis == "wall":
            return tuple(sorted((pd.Timestamp(parts[0]), pd.Timestamp(parts[1]))))
        low, high = sorted((float(parts[0]), float(parts[1])))
    except ValueError:
        return None
    return low, high


@dataclass
class Rendered:
    figure: object  # plotly Figure
    runs: pd.DataFrame  # the view's runs, rows of queries.list_runs
    panels: list[Panel]
    missing: dict[str, list[str]]  # metric spec -> names of the chosen runs that lack it


def view_runs(view: View) -> pd.DataFrame:
    table = data.runs(view.experiments)
    return table[table["run_id"].isin(view.runs)]


def render(view: View, budget: int = SCREEN_BUDGET, runs: pd.DataFrame | None = None) -> Rendered:
    """Panels and the overlay figure of a view (metrics no chosen run has are left out, and named)."""
    runs = view_runs(view) if runs is None else runs
    limits = x_range(view)
    windows = data.zoom_windows(limits, view.axis, runs) if limits else {}
    panels, missing = [], {}
    for spec in view.metrics:
        found = data.series(spec, runs, windows, budget=budget, x=view.x, gpus=view.gpus)
        lacking = [name for run_id, name in zip(runs["run_id"], runs["run_name"], strict=False) if run_id not in found]
        if lacking:
            missing[spec] = lacking
        if found:
            panels.append(Panel(spec_metric(spec), found))
    figure = overlay_figure(
        panels, runs, x_mode=view.x, grouped=view.mode == "grouped", smoothing=view.smoothing, log_y=view.log_y, x_range=limits, gpu_mode=view.gpu_mode
    )
    return Rendered(figure, runs, panels, missing)


def metric_spec(name: str) -> str:
    """A --metric argument as a spec: a catalogue name or short alias (smact, smocc, gract) or a stored key."""
    if name.startswith(("cat:", "key:")):
        return name
    lowered = name.lower()
    short = {"smact": "sm_active", "smocc": "sm_occupancy", "gract": "gr_engine_active", "drama": "dram_active", "tenso": "tensor_active"}
    lowered = short.get(lowered, lowered)
    if lowered in METRICS:
        return f"cat:{lowered}"
    for metric_name, metric in METRICS.items():
        if metric.label.lower() == lowered:
            return f"cat:{metric_name}"
    return f"key:{name}"
