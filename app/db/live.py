"""The Live tab's read side: which runs train now, their newest values, and the points a browser lacks.

Every query is bounded by time, not by a run's age: the newest values come from MLflow's
``latest_metrics`` (one row per run and key), new points from a range of MLflow's primary key
(key, timestamp, ...) starting at the browser's last timestamp.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import sqlalchemy as sa

from radt import catalogue, evidence, settings
from radt.app.db import rollupseries
from radt.app.db.runs import describe_runs, run_rows
from radt.app.db.store import EXPERIMENTS, LATEST, METRICS, Series, chunks, plain_rows
from radt.catalogue import MetricName
from radt.diagnosis import Diagnosis, diagnose
from radt.runmodel import HOST_TAG, INTERVAL_TAG

LINGER_MS = 120_000  # an ended run stays on the Live tab this long, with its final status
STALE_INTERVALS = 3  # no sample for this many sampling intervals: the run is marked stale
IDLE_MS = 60_000  # GPU activity near zero this long while RUNNING: flagged
IDLE_RATIO = 0.05  # "near zero" for activity ratios (GPU util: 5 %)
FINDINGS_REFRESH_S = evidence.RESOLUTION  # the findings change only as a 10-second rollup bucket fills: judged anew once per bucket

# What a run's live chart draws, in this order: GPU activity on the left axis (0-1), CPU on the right (%).
CHART_METRICS = [
    MetricName.SM_ACTIVE,
    MetricName.SM_OCCUPANCY,
    MetricName.GR_ENGINE_ACTIVE,
    MetricName.UTILIZATION_PERCENTAGE,
    MetricName.CPU_UTILIZATION_PERCENTAGE,
    MetricName.PROCESS_CPU_UTILIZATION_PERCENTAGE,
]
# The current values shown as numbers: per GPU, then the host.
VALUE_METRICS = [
    MetricName.SM_ACTIVE,
    MetricName.SM_OCCUPANCY,
    MetricName.GR_ENGINE_ACTIVE,
    MetricName.DRAM_ACTIVE,
    MetricName.UTILIZATION_PERCENTAGE,
    MetricName.RUN_SM_UTILIZATION_PERCENTAGE,  # the run's own share of the GPU's time (NVML's per-process samples), beside the device's
    MetricName.MEMORY_USAGE_MEGABYTES,
    MetricName.PROCESS_MEMORY_MEGABYTES,  # the run's own processes' (NVML's per-process lists): beside a collocated run, its part of the GPU's
    MetricName.POWER_USAGE_WATTS,
    MetricName.RUN_POWER_WATTS,  # an estimate of the run's own part of the GPU's power
    MetricName.CPU_UTILIZATION_PERCENTAGE,
    MetricName.PROCESS_CPU_UTILIZATION_PERCENTAGE,
    MetricName.SYSTEM_MEMORY_USAGE_MEGABYTES,
]
ACTIVITY = (MetricName.SM_ACTIVE, MetricName.GR_ENGINE_ACTIVE, MetricName.UTILIZATION_PERCENTAGE)  # what "the GPU is busy" is read from
OWN_LIMIT = 8  # a run's own metrics (loss, accuracy) shown on its card, by name


def card_values(values: dict[str, tuple[float, int]]) -> list[tuple[catalogue.Device, catalogue.Metric, float]]:
    """The current values a run's card shows, as (device, metric, value): VALUE_METRICS of radt's own keys, per GPU (MIG
    slice, node) in that order, the host's last; radT's legacy keys and anything else left out."""
    order = {name: i for i, name in enumerate(VALUE_METRICS)}
    found = []
    for key, (value, _ts) in values.items():
        resolved = catalogue.resolve(key)
        if resolved is None or resolved.legacy or resolved.metric.name not in order or not key.startswith(catalogue.PREFIX):
            continue
        found.append((resolved.device, order[resolved.metric.name], resolved.metric, value))
    found.sort(key=lambda f: (f[0].gpu is None, f[0].sort_key(), f[1]))
    return [(device, metric, value) for device, _o, metric, value in found]


@dataclass(frozen=True)
class Trace:
    """One line of a live chart: the stored key, its metric's name with its unit (the legend entry, one per metric), the
    device it measured (its dash style and tooltip), and its axis."""

    key: str
    name: str
    axis: str  # "y" (0-1 activity) or "y2" (percent)
    metric: str = ""  # catalogue name: the line's colour
    device: str = ""  # "GPU 0", "node-7 · GPU 1 · MIG 3", "" for the host


def live_runs(engine: sa.Engine, now_ms: int | None = None, linger_ms: int = LINGER_MS) -> pd.DataFrame:
    """Runs RUNNING (or SCHEDULED) now, and those that ended within ``linger_ms``; list_runs' columns
    plus ``host``, ``interval_s`` and ``experiment_name``."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    with engine.connect() as conn:
        frame = describe_runs(conn, run_rows(conn, live_since_ms=now_ms - linger_ms), now_ms)
        names = dict(plain_rows(conn, sa.select(EXPERIMENTS.c.experiment_id, EXPERIMENTS.c.name)))
    if frame.empty:
        return frame.assign(host=pd.Series(dtype="object"), interval_s=pd.Series(dtype="float64"), experiment_name=pd.Series(dtype="object"))
    frame["host"] = [t.get(HOST_TAG) or "unknown host" for t in frame["tags"]]
    frame["interval_s"] = [_interval(p) for p in frame["params"]]
    frame["experiment_name"] = [names.get(int(e), str(e)) if str(e).isdigit() else str(e) for e in frame["experiment_id"]]
    return frame.sort_values(["host", "experiment_name", "workload_label", "letter", "run_name"], kind="stable").reset_index(drop=True)


def _interval(params: Mapping[str, str]) -> float:
    """The run's sampling interval as it recorded it (radt's default where it did not)."""
    default = settings.INTERVAL.default
    try:
        return max(settings.MIN_INTERVAL, float(params.get(INTERVAL_TAG) or params.get("interval") or default))
    except ValueError:
        return default


def latest_values(engine: sa.Engine, run_ids: Sequence[str]) -> dict[str, dict[str, tuple[float, int]]]:
    """run_id -> key -> (newest value, its timestamp ms), from latest_metrics (NaN where it is a NaN)."""
    out: dict[str, dict[str, tuple[float, int]]] = defaultdict(dict)
    with engine.connect() as conn:
        for chunk in chunks(list(run_ids)):
            stmt = sa.select(LATEST.c.run_uuid, LATEST.c.key, LATEST.c.value, LATEST.c.is_nan, LATEST.c.timestamp).where(LATEST.c.run_uuid.in_(chunk))
            for run_id, key, value, is_nan, ts in plain_rows(conn, stmt):
                out[run_id][key] = (float("nan") if is_nan else float(value), int(ts))
    return dict(out)


def own_metrics(values: Mapping[str, tuple[float, int]], limit: int = OWN_LIMIT) -> list[tuple[str, float]]:
    """(key, newest value) of what the run's script logged itself (loss, accuracy), by name: no system series, no radT legacy key."""
    own = [(key, value) for key, (value, _ts) in values.items() if not key.startswith(catalogue.PREFIX) and catalogue.resolve(key) is None]
    return sorted(own)[:limit]


def chart_traces(keys: Sequence[str]) -> list[Trace]:
    """The live chart's lines for a run that stored these keys: per GPU (node, MIG slice) activity, then CPU."""
    found: list[tuple[tuple, int, Trace]] = []
    order = {name: i for i, name in enumerate(CHART_METRICS)}
    has_gpm = {r.device for k in keys if (r := catalogue.resolve(k)) and r.metric.name in (MetricName.SM_ACTIVE, MetricName.GR_ENGINE_ACTIVE)}
    for key in keys:
        resolved = catalogue.resolve(key)
        if resolved is None or resolved.legacy or resolved.metric.name not in order or not key.startswith(catalogue.PREFIX):
            continue
        metric, device = resolved.metric, resolved.device
        if metric.name == MetricName.UTILIZATION_PERCENTAGE and device in has_gpm:
            continue  # GRACT says it better where GPM is there
        axis = "y" if metric.unit == "ratio" else "y2"
        name = metric.label if metric.unit == "ratio" else f"{metric.label} ({catalogue.unit_text(metric)})"
        found.append(((device.gpu is None, device.sort_key()), order[metric.name], Trace(key, name, axis, metric.name, device.label)))
    found.sort(key=lambda item: (item[0], item[1]))  # per GPU, the host last
    return [trace for _d, _o, trace in found]


def new_points(engine: sa.Engine, cursors: Mapping[str, int | Mapping[str, int]], keys: Mapping[str, Sequence[str]]) -> dict[str, dict[str, Series]]:
    """run_id -> key -> (timestamps, values) of the points strictly after the run's cursor, by timestamp.

    A cursor is one timestamp for all the run's keys, or one per key: a series whose points are written after newer
    points of other series (a Prometheus scrape, stored at its own time a tick later) is then never skipped.
    One range scan of MLflow's primary key per key, from the oldest cursor: what a poll reads
    depends on how far behind the browser is, not on how long the run has trained.
    """
    by_key: dict[str, list[str]] = defaultdict(list)
    for run_id, run_keys in keys.items():
        if run_id in cursors:
            for key in run_keys:
                by_key[key].append(run_id)
    out: dict[str, dict[str, Series]] = defaultdict(dict)
    with engine.connect() as conn:
        for key, run_ids in by_key.items():
            after = {r: _cursor(cursors[r], key) for r in run_ids}
            since = min(after.values())
            for chunk in chunks(run_ids):
                stmt = (
                    sa.select(METRICS.c.run_uuid, METRICS.c.timestamp, METRICS.c.value, METRICS.c.is_nan)
                    .where(METRICS.c.key == key, METRICS.c.timestamp > since, METRICS.c.run_uuid.in_(chunk))
                    .order_by(METRICS.c.timestamp, METRICS.c.step)
                )
                rows: dict[str, tuple[list, list]] = defaultdict(lambda: ([], []))
                for run_id, ts, value, is_nan in plain_rows(conn, stmt):
                    if ts > after[run_id]:
                        xs, ys = rows[run_id]
                        xs.append(int(ts))
                        ys.append(float("nan") if is_nan else float(value))
                for run_id, (xs, ys) in rows.items():
                    out[run_id][key] = (np.asarray(xs, dtype=np.int64), np.asarray(ys, dtype=np.float64))
    return dict(out)


def _cursor(cursor: int | Mapping[str, int], key: str) -> int:
    if isinstance(cursor, Mapping):
        return int(cursor[key])
    return int(cursor)


def idle_gpus(
    engine: sa.Engine, run_keys: Mapping[str, Sequence[str]], starts: Mapping[str, float], now_ms: int, idle_ms: int = IDLE_MS
) -> dict[str, list[int]]:
    """run_id -> GPUs whose activity stayed near zero over the last ``idle_ms``, in runs older than that."""
    wanted: dict[str, list[tuple[str, int, float]]] = defaultdict(list)  # key -> [(run, gpu, threshold)]
    for run_id, keys in run_keys.items():
        per_gpu: dict[int, tuple[int, str, float]] = {}  # gpu -> (rank in ACTIVITY, key, threshold)
        for key in keys:
            resolved = catalogue.resolve(key)
            if resolved is None or resolved.legacy or resolved.gpu is None or resolved.metric.name not in ACTIVITY or not key.startswith(catalogue.PREFIX):
                continue
            rank = ACTIVITY.index(resolved.metric.name)
            if resolved.gpu not in per_gpu or rank < per_gpu[resolved.gpu][0]:
                per_gpu[resolved.gpu] = (rank, key, IDLE_RATIO * (100.0 if resolved.metric.unit == "%" else 1.0))
        for gpu, (_rank, key, threshold) in per_gpu.items():
            wanted[key].append((run_id, gpu, threshold))
    out: dict[str, list[int]] = defaultdict(list)
    since = now_ms - idle_ms
    with engine.connect() as conn:
        for key, entries in wanted.items():
            run_ids = [run_id for run_id, _g, _t in entries]
            stmt = (
                sa.select(METRICS.c.run_uuid, sa.func.max(METRICS.c.value), sa.func.count())
                .where(METRICS.c.key == key, METRICS.c.timestamp > since, METRICS.c.run_uuid.in_(run_ids), METRICS.c.is_nan == sa.false())
                .group_by(METRICS.c.run_uuid)
            )
            found = {run_id: (peak, count) for run_id, peak, count in plain_rows(conn, stmt)}
            for run_id, gpu, threshold in entries:
                start = starts.get(run_id)
                if run_id not in found or start is None or start != start or start > since:
                    continue  # no recent samples (that is "stale"), or the run is younger than the window
                peak, count = found[run_id]
                if count >= 2 and float(peak) < threshold:
                    out[run_id].append(gpu)
    return dict(out)


def level(metric: catalogue.Metric, value: float) -> str:
    """A CSS class for a current value: activity below 0.2 (or 20 %) stands out as low."""
    if value != value:
        return "value-nan"
    if metric.name in (MetricName.SM_ACTIVE, MetricName.SM_OCCUPANCY, MetricName.GR_ENGINE_ACTIVE, MetricName.DRAM_ACTIVE, MetricName.UTILIZATION_PERCENTAGE):
        ratio = value / 100.0 if metric.unit == "%" else value
        return "value-low" if ratio < 0.2 else ("value-mid" if ratio < 0.5 else "value-high")
    return "value-plain"


def findings_window_ms() -> int:
    """RADT_LIVE_FINDINGS_WINDOW in milliseconds: the span of a running run that Live's findings are over."""
    return int(settings.LIVE_FINDINGS_WINDOW.get() * 60_000)


def recent_diagnoses(engine: sa.Engine, run_ids: Sequence[str], now_ms: int, window_ms: int | None = None) -> dict[str, Diagnosis]:
    """run id -> radt/diagnosis.py's findings over the run's last `window_ms`, from the 10-second rollups only (no raw
    point): the window's buckets are the evidence, and its span starts with the window, so every share, sentence and
    span is the window's, not the whole run's. Nothing while the store's rollups are unavailable (rollupseries)."""
    if not run_ids or not rollupseries.available(engine):
        return {}
    since = now_ms - (window_ms if window_ms is not None else findings_window_ms())
    try:  # the rollups' tables made and stale series rebuilt as a chart's read does: through its read-write engine
        found = evidence.gather(rollupseries.writable(engine), run_ids, since_ms=since, now_ms=now_ms)
    except sa.exc.SQLAlchemyError as exc:  # as a chart does: one line in the log, the cards without findings a while
        rollupseries.give_up(engine, exc)
        return {}
    out = {}
    for run_id, ev in found.items():
        ev.start_ms = max(ev.start_ms, since)
        ev.end_ms = max(ev.end_ms, ev.start_ms)
        out[run_id] = diagnose(ev)
    return out
