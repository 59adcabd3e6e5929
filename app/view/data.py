"""Cached access to the store for the pages: run lists, series and summaries.

Finished runs are cached long (their data never changes), running runs for one poll interval,
listings for a few seconds. A metric spec is `cat:<catalogue name>` (resolved per run, radT
legacy keys included) or `key:<stored key>` (any other metric, e.g. the run's own loss).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Mapping

import numpy as np
import pandas as pd

from radt.app.db.downsample import ENVELOPE, Envelope
from radt.app.db.runs import RUN_COLUMNS, list_runs
from radt.app.db.series import load_devices, load_series, place_by_time, step_history, time_of_step
from radt.app.db.state import STATE
from radt.app.db.store import LIVE_STATUSES
from radt.app.summary.summaries import SUMMARY_COLUMNS, SUMMARY_VERSION, run_summary
from radt.app.summary.summarystore import store_summaries
from radt.app.view.cache import CACHE, FINISHED_TIMEOUT, LISTING_TIMEOUT, RUNNING_TIMEOUT, ZOOM_TIMEOUT
from radt.catalogue import HOST, METRICS, Device, Metric, MetricName, display_name, missing_values, resolve

DEFAULT_METRICS = [
    f"cat:{name}"
    for name in (
        MetricName.SM_ACTIVE,
        MetricName.SM_OCCUPANCY,
        MetricName.GR_ENGINE_ACTIVE,
        MetricName.DRAM_ACTIVE,
        MetricName.MEMORY_USAGE_MEGABYTES,
        MetricName.POWER_USAGE_WATTS,
        MetricName.CPU_UTILIZATION_PERCENTAGE,
        MetricName.SYSTEM_MEMORY_USAGE_MEGABYTES,
    )
]
X_MODES = ("relative", "wall", "step")
ABSENT = "absent"  # cached marker: this run has no such metric

Window = tuple[int | None, int | None]


def spec_metric(spec: str) -> Metric:
    """The catalogue entry for a spec (a stored per-GPU key: its metric, labelled with its device); other keys get a unitless stand-in."""
    kind, _, name = spec.partition(":")
    if kind == "cat" and name in METRICS:
        return METRICS[name]
    resolved = resolve(name)
    if resolved is not None:
        return dataclasses.replace(resolved.metric, label=display_name(name))
    return Metric(name, name, "", False, None, None)


def _key(*parts) -> str:
    return "radt:" + hashlib.sha1("|".join(map(str, parts)).encode()).hexdigest()


def _timeout(status: str) -> int:
    return RUNNING_TIMEOUT if status in LIVE_STATUSES else FINISHED_TIMEOUT


def cached(parts: tuple, timeout: int, compute):
    """`compute()` through the cache under a key made of `parts` (the store URI goes in by itself)."""
    cache_key = _key(STATE.store_uri, *parts)
    value = CACHE.get(cache_key)
    if value is None:
        value = compute()
        CACHE.set(cache_key, value, timeout=timeout)
    return value


def _per_run(runs: pd.DataFrame, parts, load, longest=lambda _run_id: FINISHED_TIMEOUT) -> dict:
    """run_id -> value through the cache: hits as they are, `load(missing run ids)` for the rest,
    each cached as long as its run's status allows, and `longest(run_id)` seconds at most
    (a run without a value is cached as absent)."""
    out: dict = {}
    missing: list[str] = []
    keys = {run_id: _key(STATE.store_uri, *parts(run_id)) for run_id in runs["run_id"]}
    for (run_id, _), hit in zip(keys.items(), CACHE.get_many(*keys.values()), strict=True):  # one round trip to Redis, not one a run
        if hit is None:
            missing.append(run_id)
        elif not isinstance(hit, str):
            out[run_id] = hit
    if missing:
        status = dict(zip(runs["run_id"], runs["status"], strict=False))
        loaded = load(missing)
        by_timeout: dict[int, dict] = {}
        for run_id in missing:
            value = loaded.get(run_id)
            timeout = min(_timeout(status.get(run_id, "")), longest(run_id))
            by_timeout.setdefault(timeout, {})[keys[run_id]] = ABSENT if value is None else value
            if value is not None:
                out[run_id] = value
        for timeout, entries in by_timeout.items():
            CACHE.set_many(entries, timeout=timeout)
    return {r: out[r] for r in runs["run_id"] if r in out}


def runs(experiment_ids: list[str]) -> pd.DataFrame:
    """runs.list_runs through the cache (a few seconds: statuses and new runs show up quickly)."""
    ids = sorted(set(experiment_ids or []))
    if not ids:
        return pd.DataFrame(columns=RUN_COLUMNS)
    return cached(("runs", *ids), LISTING_TIMEOUT, lambda: list_runs(STATE.engine, ids))


Series = tuple[np.ndarray, np.ndarray]
SHAPES = ("points", "envelope")  # a long series as chosen points (MinMax), or as per-bucket mean with a min-max band


def hardware(spec: str) -> bool:
    """A sampled metric (catalogue or a stored system key), not one the run's script logged at its own steps."""
    kind, _, name = spec.partition(":")
    return kind == "cat" or resolve(name) is not None


def _load(spec: str, run_ids: list[str], windows: Mapping[str, Window], budget: int, x: str, shape: str) -> dict[str, dict[Device, Series]]:
    kind, _, name = spec.partition(":")
    options = {"windows": windows, "x": "step" if x == "step" else "timestamp"} | ({"method": ENVELOPE} if shape == "envelope" else {})
    if kind == "cat":
        return load_devices(STATE.engine, run_ids, name, budget=budget, **options)
    resolved = resolve(name)  # a stored key typed in the picker: one series, on the device its key names
    device = resolved.device if resolved else HOST
    found = load_series(STATE.engine, run_ids, name, budget=budget, missing=missing_values(name), **options)
    return {run_id: {device: values} for run_id, values in found.items()}


def series(
    spec: str,
    runs: pd.DataFrame,
    windows: Mapping[str, Window] | None = None,
    budget: int = 2000,
    x: str = "relative",
    gpus: list[int] | None = None,
    shape: str = "points",
) -> dict[str, dict[Device, Series | Envelope]]:
    """Series of `spec` for the runs (rows of runs.list_runs), through the cache: run_id -> {device: (x, values)}.

    A catalogue metric has one series per GPU, MIG slice and node the run stored it for (host
    metrics one, on ``catalogue.HOST``); ``gpus`` keeps only those GPU indices. `windows` gives a run
    its own x range (ms, or steps when x is "step"): a zoomed chart asks for that range again at
    full detail. x "step" returns stored steps instead of timestamps; ``shape="envelope"`` returns a
    series longer than the budget as an app.db.downsample.Envelope (per-bucket mean, minimum, maximum).
    """
    windows = dict(windows or {})
    if x == "step" and hardware(spec):
        return placed_on_steps(spec, runs, windows, budget, gpus, shape)
    x = "step" if x == "step" else "timestamp"
    shape = shape if shape in SHAPES else "points"
    found = _per_run(
        runs,
        lambda run_id: ("devices", spec, run_id, windows.get(run_id), budget, x, shape),
        lambda missing: _load(spec, missing, {r: windows[r] for r in missing if r in windows}, budget, x, shape),
        lambda run_id: ZOOM_TIMEOUT if windows.get(run_id) else FINISHED_TIMEOUT,  # every zoom is a new window: kept briefly
    )
    if gpus is None:
        return found
    wanted = set(gpus)
    kept = {run_id: {d: v for d, v in devices.items() if d.gpu is None or d.gpu in wanted} for run_id, devices in found.items()}
    return {run_id: devices for run_id, devices in kept.items() if devices}


def step_histories(runs: pd.DataFrame) -> dict[str, Series]:
    """series.step_history per run through the cache: run_id -> (timestamps, steps) of its own most-logged metric."""
    return _per_run(runs, lambda run_id: ("steps", run_id), lambda missing: step_history(STATE.engine, missing))


def placed_on_steps(
    spec: str, runs: pd.DataFrame, windows: Mapping[str, Window], budget: int, gpus: list[int] | None, shape: str
) -> dict[str, dict[Device, Series | Envelope]]:
    """A hardware metric on the training-step axis: read by time, each sample placed at the step its run's script was at.

    A step window is read as the time window between those steps; runs that logged no metric of their own are absent."""
    histories = step_histories(runs)
    runs = runs[runs["run_id"].isin(list(histories))]
    if runs.empty:
        return {}
    times = {r: (None if lo is None else int(time_of_step(lo, histories[r])) - 1, None if hi is None else int(time_of_step(hi, histories[r])) + 1)
             for r, (lo, hi) in windows.items() if r in histories}  # fmt: skip
    found = series(spec, runs, times, budget=budget, x="timestamp", gpus=gpus, shape=shape)
    out: dict[str, dict[Device, Series | Envelope]] = {}
    for run_id, devices in found.items():
        for device, values in devices.items():
            steps = place_by_time(values[0], histories[run_id])
            kept = ~np.isnan(steps)
            if kept.any():
                out.setdefault(run_id, {})[device] = (
                    Envelope(steps[kept], *(v[kept] for v in values[1:])) if isinstance(values, Envelope) else (steps[kept], values[1][kept])
                )
    return out


def summary(runs: pd.DataFrame) -> pd.DataFrame:
    """summaries.run_summary per run through the cache (finished runs long, running ones briefly); an ended run's
    summary is computed once and stored (app/summary/summarystore.py), a cache miss reads it back."""
    if runs.empty:
        return run_summary(STATE.engine, [])
    rows = _per_run(
        runs,
        lambda run_id: ("summary", SUMMARY_VERSION, run_id),
        lambda missing: {row["run_id"]: row for row in store_summaries(STATE.engine, missing).to_dict("records")},
    )
    return pd.DataFrame(list(rows.values()), columns=SUMMARY_COLUMNS)


def zoom_windows(x_range: tuple | None, x_mode: str, runs: pd.DataFrame) -> dict[str, Window]:
    """Per-run query windows for a zoomed x range of the chart (None: the whole runs).

    Relative axis: minutes since each run's start; wall clock: one absolute range; step: steps.
    """
    if not x_range or runs.empty:
        return {}
    low, high = x_range
    out: dict[str, Window] = {}
    for run_id, start in zip(runs["run_id"], runs["start_time"], strict=False):
        if x_mode == "relative":
            if start is None or (isinstance(start, float) and math.isnan(start)):
                continue
            out[run_id] = (int(start + low * 60_000) - 1, int(start + high * 60_000) + 1)
        elif x_mode == "wall":
            out[run_id] = (int(pd.Timestamp(low).value // 1_000_000) - 1, int(pd.Timestamp(high).value // 1_000_000) + 1)
        else:
            out[run_id] = (math.floor(float(low)), math.ceil(float(high)))
    return out
