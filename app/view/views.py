"""A view (the runs, metrics and chart settings a user picked) and the one path from it to a figure.

The explore page keeps a view in its URL; "save view" writes the same dict as JSON; `radt
export --view` reads it back. All three draw through `render()`, so an exported figure holds the
same traces as the screen, only at a larger point budget.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from radt.app.db import deadline
from radt.app.figures.figures import GPU_MODES, MAX_COLUMNS, ChartChoices, DeviceLine, Panel, overlay_figure
from radt.app.figures.share import share_metric, shared_gpus
from radt.app.view import data
from radt.app.view.data import DEFAULT_METRICS, X_MODES, spec_metric
from radt.catalogue import METRICS, OWN_SHARE, Device, MetricName
from radt.errors import UserError

VIEW_VERSION = 1
SCREEN_BUDGET = 2000  # points per series sent to the browser
FULL_DETAIL_RUNS = 75  # a chart of more runs shares FULL_DETAIL_RUNS x budget points among them ...
MIN_SERIES_BUDGET = 200  # ... but never fewer than this per series (a 24 h run: a bucket every 20 minutes, its min and max kept)
EXPORT_BUDGET = 20000  # points per series in an exported figure: beyond a print's resolution
MAX_CHARTS = 30  # metrics drawn at once (each is a chart and a query per run); more are named and left out
MAX_IDS = 1000  # experiments or runs in one view
ID_PARTS_READ = 2 * MAX_IDS  # ids of one list a link is read for: 7 MB of run ids took 0.7 s to check one by one
RUN_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}\Z")  # MLflow's run ids (32 hex digits), as a link may carry them
EXPERIMENT_ID = re.compile(r"^[0-9]{1,18}\Z")
GPU_INDEX = re.compile(r"^[0-9]{1,4}\Z")
KEY_LIMIT = 250  # MLflow's longest metric key
QUERY_LIMIT = 1000  # characters of a run filter in a link
DEFAULT_COLUMNS = 1  # charts per row when the link does not say (cols) and no screen does: an export, a script
ZOOM_LIMITS = {"relative": 1e9, "step": 9e15}  # |x| of a zoom: minutes (1,900 years) and steps (exact as float64, inside int64)
WALL_LIMITS = (pd.Timestamp("1970-01-01"), pd.Timestamp("2200-01-01"))  # a wall-clock zoom: MLflow's epoch ms, in pandas' ns range


class ViewError(UserError, ValueError):
    """A view that cannot be drawn; the message says what to change."""


def _split(value, depth: int = 2, limit: int | None = None) -> list[str]:
    """A URL value (or a repeated one, a list; the run tree's lists of lists) as its comma-separated parts; other JSON types
    give nothing. With `limit`, a text is split at its first `limit` commas only (a link of megabytes is not split whole)."""
    if isinstance(value, list | tuple):
        return [part for v in value for part in _split(v, depth - 1, limit)] if depth > 0 else []
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        value = str(value)
    return [v.strip() for v in value.split(",", -1 if limit is None else limit) if v.strip()] if isinstance(value, str) else []


def _one(value) -> str | None:
    """A single-valued parameter: the first of repeated values, as text; None when absent or not text."""
    if isinstance(value, list | tuple):
        value = next((v for v in value if isinstance(v, str | int | float) and not isinstance(v, bool)), None)
    return None if value is None or isinstance(value, bool) or not isinstance(value, str | int | float) else str(value)


def _printable(text: str) -> bool:
    return text.isprintable()  # no NUL, no control character: nothing a store or a page should get


def _ids(value, pattern: re.Pattern, what: str, notes: list[str]) -> list[str]:
    parts = _split(value, limit=ID_PARTS_READ)  # a link of megabytes of ids (its fragment reaches the server in the page's request)
    listed = len(parts)
    parts = parts[:ID_PARTS_READ]
    kept = list(dict.fromkeys(p for p in parts if pattern.match(p)))
    if len(kept) < len(set(parts)):
        notes.append(f"ignored {len(set(parts)) - len(kept)} {what} id(s) that are not ids")
    if listed > ID_PARTS_READ:
        notes.append(f"kept {min(len(kept), MAX_IDS)} {what} ids: the link lists more than {ID_PARTS_READ:,}, and is read up to the {ID_PARTS_READ:,}th")
    elif len(kept) > MAX_IDS:
        notes.append(f"kept the first {MAX_IDS} of {len(kept)} {what}s")
    return kept[:MAX_IDS]


def _metrics(value, notes: list[str]) -> list[str]:
    """Metric specs (cat:<catalogue name>, key:<stored key>, or a name `radt export --metric` takes), each once, known ones only."""
    specs, unknown = [], []
    for part in _split(value):
        spec = metric_spec(part) if _printable(part) else None
        kind, _, name = (spec or "").partition(":")
        if (kind == "cat" and name in METRICS) or (kind == "key" and 0 < len(name) <= KEY_LIMIT):
            specs.append(spec)
        else:
            unknown.append(part)
    if unknown:
        shown = ", ".join(repr(u[:40]) for u in unknown[:3]) + (", ..." if len(unknown) > 3 else "")
        notes.append(f"ignored {len(unknown)} metric(s) that are not metrics: {shown}")
    specs = list(dict.fromkeys(specs))
    if len(specs) > MAX_CHARTS:
        notes.append(f"showing the first {MAX_CHARTS} of {len(specs)} metrics; pick fewer to see the others")
    return specs[:MAX_CHARTS]


def _choice(value, allowed, default: str, what: str, notes: list[str]) -> str:
    text = _one(value)
    if text is None or text in allowed:
        return text or default
    notes.append(f"{what} '{text[:40]}' is not one of {', '.join(allowed)}; showing {default}")
    return default


def _smoothing(value, notes: list[str]) -> float:
    text = _one(value)
    try:
        number = float(text or 0)
    except ValueError:
        number = math.nan
    if not math.isfinite(number):
        notes.append(f"smoothing '{str(text)[:40]}' is not a number from 0 to 0.99; showing none")
        return 0.0
    return min(max(number, 0.0), 0.99)


def _gpus(value, notes: list[str]) -> list[int] | None:
    parts = _split(value)
    bad = [g for g in parts if not GPU_INDEX.match(g)]
    if bad:
        notes.append(f"ignored {len(bad)} GPU filter entr{'y' if len(bad) == 1 else 'ies'} that {'is' if len(bad) == 1 else 'are'} not a GPU index")
    return sorted({int(g) for g in parts if GPU_INDEX.match(g)}) or None


def _zoom(value, axis: str, notes: list[str]) -> str | None:
    """The zoom "low,high" as given, if both ends are values of the axis within its bounds; else None, and a note."""
    text = _one(value)
    if not text:
        return None
    if _x_limits(text, axis) is None:
        notes.append(f"ignored the zoom '{text[:60]}': not two {'times' if axis == 'wall' else 'numbers'} on the {axis} axis; showing the whole runs")
        return None
    return text


def _x_limits(text: str, axis: str) -> tuple | None:
    parts = _split(text)
    if len(parts) != 2 or not all(_printable(p) for p in parts):
        return None
    try:
        if axis == "wall":
            stamps = [pd.Timestamp(p) for p in parts]
            if any(pd.isna(t) for t in stamps):
                return None
            stamps = sorted(t.tz_convert(None) if t.tzinfo else t for t in stamps)
            return tuple(stamps) if WALL_LIMITS[0] <= stamps[0] and stamps[1] <= WALL_LIMITS[1] else None
        low, high = sorted(float(p) for p in parts)
    except (ValueError, TypeError, OverflowError):
        return None
    bound = ZOOM_LIMITS.get(axis, ZOOM_LIMITS["relative"])
    return (low, high) if all(math.isfinite(v) and abs(v) <= bound for v in (low, high)) else None


def _query(value, notes: list[str]) -> str:
    """The run filter as typed (one line of printable text, QUERY_LIMIT characters at most); else empty, and a note."""
    text = (_one(value) or "").strip()
    if text and (not _printable(text) or len(text) > QUERY_LIMIT):
        notes.append(f"ignored the run filter: not one line of at most {QUERY_LIMIT} printable characters")
        return ""
    return text


def _cols(value, notes: list[str]) -> int | None:
    """Charts side by side: 1 to MAX_COLUMNS; a number out of range is clamped, anything else is 1, with a note; None when
    the link does not say (the explore page asks the screen: two per row at 1400 px or wider, assets/page.js)."""
    text = _one(value)
    if text is None or text == "":
        return None
    try:
        number = int(float(text))
    except (ValueError, OverflowError):
        notes.append(f"columns '{text[:40]}' is not a number from 1 to {MAX_COLUMNS}; showing 1")
        return 1
    if not 1 <= number <= MAX_COLUMNS:
        notes.append(f"columns {number} is not from 1 to {MAX_COLUMNS}; showing {min(max(number, 1), MAX_COLUMNS)}")
    return min(max(number, 1), MAX_COLUMNS)


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
    cols: int | None = None  # charts side by side (URL key cols, 1-3); None: the link did not say (DEFAULT_COLUMNS, or the screen's)
    query: str = ""  # the run filter (URL key q): words, or MLflow's search syntax and radt's summaries (app/view/filters.py)
    device: bool = False  # URL key dev: on a GPU runs shared, the device's line too (once), beside each run's own share
    notes: list[str] = field(default_factory=list, compare=False)  # what from_dict left out of the link, said on the page

    @classmethod
    def from_dict(cls, raw: dict) -> View:
        """The URL's query dict, a saved view file (the same keys) or the page's controls: whatever they hold.

        A link is typed, pasted and edited by hand: repeated parameters, lists, NUL bytes, unknown
        metrics, junk numbers and zooms out of range are each left out (or clamped) with a note,
        so the page always draws something and says what it ignored."""
        raw = raw if isinstance(raw, dict) else {}
        notes: list[str] = []  # in the order of the link's parameters
        experiments = _ids(raw.get("exp"), EXPERIMENT_ID, "experiment", notes)
        runs = _ids(raw.get("runs"), RUN_ID, "run", notes)
        metrics = _metrics(raw.get("metrics"), notes) if _split(raw.get("metrics")) else list(DEFAULT_METRICS)
        x = _choice(raw.get("x"), X_MODES, "relative", "x axis", notes)
        mode = _choice(raw.get("mode"), ("runs", "grouped"), "runs", "grouping", notes)
        smoothing = _smoothing(raw.get("smooth"), notes)
        log_y = _one(raw.get("log")) in ("1", "true", "True")
        gpus = _gpus(raw.get("gpu"), notes)
        view = cls(experiments, runs, metrics, x, mode, smoothing, log_y, None, gpus, _choice(raw.get("gpuagg"), GPU_MODES, "each", "GPU mode", notes))
        view.zoom = _zoom(raw.get("xr"), view.axis, notes)
        view.cols = _cols(raw.get("cols"), notes)
        view.query = _query(raw.get("q"), notes)
        view.device = _one(raw.get("dev")) in ("1", "true", "True")
        view.notes = notes
        return view

    def to_dict(self) -> dict:
        out = {"exp": ",".join(self.experiments), "runs": ",".join(self.runs), "metrics": ",".join(self.metrics), "x": self.x, "mode": self.mode}
        out |= {"smooth": f"{self.smoothing:g}", "log": "1" if self.log_y else "0"}
        if self.zoom:
            out["xr"] = self.zoom
        if self.gpus:
            out["gpu"] = ",".join(map(str, self.gpus))
        if self.gpu_mode != "each":
            out["gpuagg"] = self.gpu_mode
        if self.cols is not None:  # 1 included: a one-column choice survives a reload on a wide screen
            out["cols"] = str(self.cols)
        if self.query:
            out["q"] = self.query
        if self.device:
            out["dev"] = "1"
        return out

    @property
    def columns(self) -> int:
        """Charts per row as drawn without a screen to ask: the link's, else DEFAULT_COLUMNS."""
        return self.cols or DEFAULT_COLUMNS

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
    """The zoom as chart x values (minutes or steps as floats, wall clock as timestamps); None for no zoom or one out of bounds."""
    return _x_limits(view.zoom, view.axis) if view.zoom else None


def span_zoom(span: tuple[int, int], start_ms: float, x: str, mode: str) -> tuple[str, str]:
    """The x axis and zoom ("low,high", as View.zoom holds it) that show `span` (epoch ms, a finding's) of a run that
    started at `start_ms`: minutes since its start on "since start", UTC times on the wall clock. No time maps onto the
    step axis: it gives way to "since start"."""
    x = "relative" if x not in X_MODES or x == "step" else x
    low, high = sorted(span)
    if x == "wall" and mode != "grouped":  # a grouped view draws the wall clock as time since start (View.axis)
        return x, ",".join(pd.Timestamp(ms, unit="ms").strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] for ms in (low, high))
    return x, ",".join(f"{(ms - start_ms) / 60_000:.6g}" for ms in (low, high))


@dataclass
class Rendered:
    figure: object  # plotly Figure
    runs: pd.DataFrame  # the view's runs, rows of runs.list_runs
    panels: list[Panel]
    missing: dict[str, list[str]]  # metric spec -> names of the chosen runs that lack it
    notes: list[str] = field(default_factory=list)  # what the figure could not draw, and why (said on the page)


def view_runs(view: View) -> pd.DataFrame:
    """The view's runs as the store lists them, in the view's order: a run's place there is its colour (app/figures/palette.py)."""
    table = data.runs(view.experiments)
    chosen = table[table["run_id"].isin(view.runs)]
    place = chosen["run_id"].map({run_id: i for i, run_id in enumerate(view.runs)})
    return chosen.iloc[place.to_numpy().argsort(kind="stable")]


def in_added_order(before: list[str], ticked: list[str]) -> list[str]:
    """The ticked runs in the order they were added: those of the view `before` in its order, then the newly ticked ones in
    the order given (the picker's boxes list runs by workload, not by when they were ticked)."""
    now = set(ticked)
    kept = [r for r in dict.fromkeys(before) if r in now]
    shown = set(kept)
    return kept + [r for r in dict.fromkeys(ticked) if r not in shown]


def series_budget(budget: int, runs: int) -> int:
    """Points per series for a chart of `runs` runs: the whole budget up to FULL_DETAIL_RUNS runs, then a share of
    FULL_DETAIL_RUNS x budget (256 runs x 2,000 points were a 6 MB figure, and cost the store runs x budget)."""
    return max(min(MIN_SERIES_BUDGET, budget), min(budget, budget * FULL_DETAIL_RUNS // max(1, runs)))


def render(view: View, budget: int = SCREEN_BUDGET, runs: pd.DataFrame | None = None) -> Rendered:
    """Panels and the overlay figure of a view (metrics no chosen run has are left out, and named)."""
    runs = view_runs(view) if runs is None else runs
    budget = series_budget(budget, len(runs))
    limits = x_range(view)
    windows = data.zoom_windows(limits, view.axis, runs) if limits else {}
    panels, missing = [], {}
    for spec in view.metrics:
        deadline.check()  # a request past RADT_REQUEST_TIMEOUT stops between series (app/db/deadline.py)
        found = data.series(spec, runs, windows, budget=budget, x=view.x, gpus=view.gpus, shape="envelope")
        lacking = [name for run_id, name in zip(runs["run_id"], runs["run_name"], strict=False) if run_id not in found]
        if lacking:
            missing[spec] = lacking
        if found:
            panel = Panel(spec_metric(spec), found, placed=view.x == "step" and data.hardware(spec))
            panels.append(_own_shares(view, runs, panel, (windows, budget)))
    grouped = view.mode == "grouped"
    if not grouped and view.x != "step":
        panels += _share_panels(view, runs, panels, (windows, budget))
    deadline.check()
    names = experiment_names() if grouped and len(set(runs["experiment_id"])) > 1 else {}  # two experiments' "ungrouped" told apart
    choices = ChartChoices(
        x_mode=view.x, grouped=grouped, smoothing=view.smoothing, log_y=view.log_y, x_range=limits, gpu_mode=view.gpu_mode,
        columns=view.columns, experiments=names,
    )  # fmt: skip
    figure = overlay_figure(panels, runs, choices)
    return Rendered(figure, runs, panels, missing, _step_notes(view, runs))


def _own_shares(view: View, runs: pd.DataFrame, panel: Panel, reads: tuple) -> Panel:
    """A device metric's chart where drawn runs shared a GPU (catalogue.OWN_SHARE: GPU util, mem util, power): each sharing
    run's line is its own share, not the device's line that is the same for all of them; with view.device the device's
    line is drawn too, once per GPU. Grouped and step views keep the device's lines."""
    own_name = OWN_SHARE.get(panel.metric.name)
    if own_name is None or view.mode == "grouped" or view.x == "step" or len(panel.series) < 2:
        return panel
    windows, budget = reads
    sharing = runs[runs["run_id"].isin(list(panel.series))]
    shares = data.series(f"cat:{own_name}", sharing, windows, budget=budget, gpus=view.gpus, shape="envelope")
    own: set[tuple[str, Device]] = set()
    devices: list[DeviceLine] = []
    series = {run_id: dict(found) for run_id, found in panel.series.items()}  # the cache's dicts stay as they are
    starts = dict(zip(sharing["run_id"], sharing["start_time"].astype(float), strict=True))
    for gpu in shared_gpus(sharing, shares, {}):
        device = Device(gpu=gpu.gpu)
        members = [r for r in series if device in shares.get(r, {}) and r in gpu.shares]  # in the view's order
        line = next((series[r][device] for r in members if device in series[r]), None)
        for run_id in members:
            series[run_id][device] = shares[run_id][device]
            own.add((run_id, device))
        if view.device and line is not None:
            devices.append(DeviceLine(f"{gpu.host} · GPU {gpu.gpu} (device)", line, min(starts[r] for r in members)))
    return dataclasses.replace(panel, series=series, own=frozenset(own), devices=devices) if own else panel


def _share_panels(view: View, runs: pd.DataFrame, panels: list[Panel], reads: tuple) -> list[Panel]:
    """A "GPU share" chart per GPU the drawn runs shared, when the view shows the runs' own SM share (Run SM util)."""
    shares = next((p.series for p in panels if p.metric.name == MetricName.RUN_SM_UTILIZATION_PERCENTAGE and p.share is None), None)
    if not shares or len(shares) < 2:
        return []
    windows, budget = reads
    sharing = runs[runs["run_id"].isin(list(shares))]
    device = data.series(f"cat:{MetricName.UTILIZATION_PERCENTAGE}", sharing, windows, budget=budget, gpus=view.gpus, shape="envelope")
    found = shared_gpus(sharing, shares, device)
    return [Panel(share_metric(s), {r: {Device(gpu=s.gpu): v} for r, v in s.shares.items()}, share=s) for s in found]


def experiment_names(experiments: list[dict] | None = None) -> dict[str, str]:
    """Experiment id -> name, of `experiments` (runs.list_experiments' rows) or of the store's: for what shows runs of
    several experiments (a grouped view, the comparison figures, the run picker's tree)."""
    from radt.app.db.runs import list_experiments
    from radt.app.db.state import STATE

    if experiments is None:
        experiments = list_experiments(STATE.engine) if STATE.engine is not None else []
    return {str(e["experiment_id"]): e["name"] for e in experiments}


def _step_notes(view: View, runs: pd.DataFrame) -> list[str]:
    """On the step axis, hardware samples sit on each run's own logged steps: name the runs that logged none (drawn without them)."""
    if view.x != "step" or runs.empty or not any(data.hardware(spec) for spec in view.metrics):
        return []
    histories = data.step_histories(runs)
    lacking = sorted({name for run_id, name in zip(runs["run_id"], runs["run_name"], strict=False) if run_id not in histories})
    if not lacking:
        return []
    shown = ", ".join(lacking[:5]) + (f" and {len(lacking) - 5} more" if len(lacking) > 5 else "")
    placed = "on the step axis hardware samples are placed at the training step their run logged at that time"
    return [f"{placed}; {shown} logged no metric of its own, so no hardware series is drawn for it"]


def metric_spec(name: str) -> str:
    """A --metric argument as a spec: a catalogue name or short alias (smact, smocc, gract) or a stored key."""
    if name.startswith(("cat:", "key:")):
        return name
    lowered = name.lower()
    short = {
        "smact": MetricName.SM_ACTIVE,
        "smocc": MetricName.SM_OCCUPANCY,
        "gract": MetricName.GR_ENGINE_ACTIVE,
        "drama": MetricName.DRAM_ACTIVE,
        "tenso": MetricName.TENSOR_ACTIVE,
    }
    lowered = short.get(lowered, lowered)
    if lowered in METRICS:
        return f"cat:{lowered}"
    for metric_name, metric in METRICS.items():
        if metric.label.lower() == lowered:
            return f"cat:{metric_name}"
    return f"key:{name}"
