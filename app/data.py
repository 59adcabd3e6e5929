"""Cached access to series for the pages: per run, finished runs long, running runs briefly.

A metric spec is `cat:<catalogue name>` (resolved per run, radT legacy keys included) or
`key:<stored key>` (any other metric, e.g. the run's own loss).
"""

from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd

from app import queries
from app.cache import CACHE, FINISHED_TIMEOUT, RUNNING_TIMEOUT
from app.catalogue import METRICS, Metric
from app.state import STATE

DEFAULT_METRICS = [
    "cat:sm_active",
    "cat:sm_occupancy",
    "cat:gr_engine_active",
    "cat:dram_active",
    "cat:memory_usage_megabytes",
    "cat:power_usage_watts",
    "cat:cpu_utilization_percentage",
    "cat:system_memory_usage_megabytes",
]


def spec_metric(spec: str) -> Metric:
    """The catalogue entry for a spec; other keys get a unitless stand-in."""
    kind, _, name = spec.partition(":")
    if kind == "cat" and name in METRICS:
        return METRICS[name]
    return Metric(name, name, "", False, None, None)


def _cache_key(spec: str, run_id: str, window: tuple | None, budget: int) -> str:
    raw = f"{spec}|{run_id}|{window}|{budget}"
    return "series:" + hashlib.sha1(raw.encode()).hexdigest()


def _load(spec: str, run_ids: list[str], window: tuple | None, budget: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    start, end = window if window else (None, None)
    kind, _, name = spec.partition(":")
    if kind == "cat":
        return queries.load_metric(STATE.engine, run_ids, name, None, start_ms=start, end_ms=end, budget=budget)
    return queries.load_series(STATE.engine, run_ids, name, start_ms=start, end_ms=end, budget=budget)


def series(spec: str, runs: pd.DataFrame, window: tuple | None = None, budget: int = 2000) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Series of `spec` for the runs (rows of queries.list_runs), through the cache."""
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    missing: list[str] = []
    status = dict(zip(runs["run_id"], runs["status"], strict=False))
    for run_id in runs["run_id"]:
        hit = CACHE.get(_cache_key(spec, run_id, window, budget))
        if hit is None:
            missing.append(run_id)
        elif hit != "absent":
            out[run_id] = hit
    if missing:
        loaded = _load(spec, missing, window, budget)
        for run_id in missing:
            timeout = RUNNING_TIMEOUT if status.get(run_id) == "RUNNING" else FINISHED_TIMEOUT
            value = loaded.get(run_id)
            CACHE.set(_cache_key(spec, run_id, window, budget), value if value is not None else "absent", timeout=timeout)
            if value is not None:
                out[run_id] = value
    return out
