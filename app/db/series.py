"""Series of many runs, read and downsampled right after the database: one stored key (load_series) or one
catalogue metric on every device (load_devices, load_metric), at most ``budget`` points per run with minima and maxima kept.

Speed: a series is read through MLflow's primary key (key, timestamp, step, run_uuid, value,
is_nan), which covers the query (PostgreSQL answers with an index-only scan; a time window is a
range of it). On PostgreSQL each run comes back as one row, its points packed into two bytea
(``int8send``/``float8send``) that numpy reads directly, with psycopg 3 in the binary protocol;
SQLite rows come straight off the DBAPI cursor. Downsampling (tsdownsample) follows in Python.

Long time-axis charts are drawn from radt's rollups instead (app/db/rollupseries.py): each bucket's minimum
and maximum at their own times, from the coarsest resolution that still gives the budget, so a cold chart
costs runs x budget whatever the runs' length; windows short enough for the budget, the step axis and
stores whose rollups cannot be made read the raw points as above.
"""

from __future__ import annotations

import contextvars
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numpy as np
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from radt import catalogue, settings
from radt.app.db import rollupseries
from radt.app.db.downsample import DEFAULT_BUDGET, ENVELOPE, ENVELOPE_POINTS, Envelope, downsample_indices, envelope
from radt.app.db.keys import cumulative_legacy, device_keys
from radt.app.db.runs import keys_by_run
from radt.app.db.store import METRICS, Series, binary_rows, chunks, not_nan, plain_rows, unique, value_or_null

KEY_SCAN_WHOLE = False  # PostgreSQL reads whole series run by run, not by scanning the key (measured faster; see _fetch_postgresql)
READ_THREADS = max(1, settings.READ_THREADS.get())  # PostgreSQL connections one chart reads on at once
PARALLEL_MIN_RUNS = 8  # fewer runs are read on one connection
USE_ROLLUPS = True  # long time-axis charts drawn from radt's rollups (app/db/rollupseries.py); False: raw points only (the benchmark's baseline)


# --- fetching -------------------------------------------------------------------------------------


def _x_column(x: str):
    """The metrics column a chart's x axis reads: the timestamp (ms) or the step."""
    if x == "timestamp":
        return METRICS.c.timestamp
    if x == "step":
        return METRICS.c.step
    raise ValueError(f"x must be 'timestamp' or 'step', not {x!r}")


def _fetch(conn: sa.Connection, run_ids: Sequence[str], key: str, lo: int | None, hi: int | None, x: str = "timestamp") -> dict[str, Series]:
    """run_id -> (x, values with NaN) for one key, raw and unsorted, x within [lo, hi]."""
    xcol = _x_column(x)
    conditions = [METRICS.c.key == key]
    if lo is not None:
        conditions.append(xcol >= int(lo))
    if hi is not None:
        conditions.append(xcol <= int(hi))
    out: dict[str, Series] = {}
    if conn.dialect.name == "postgresql":
        return _fetch_postgresql(conn, run_ids, key, conditions, xcol, windowed=lo is not None or hi is not None)
    parts: dict[str, tuple[list, list]] = {}
    for chunk in chunks(list(run_ids)):
        stmt = sa.select(METRICS.c.run_uuid, xcol, value_or_null()).where(METRICS.c.run_uuid.in_(chunk), *conditions)
        for run_id, xv, value in plain_rows(conn, stmt):
            xs, values = parts.setdefault(run_id, ([], []))
            xs.append(xv)
            values.append(value)
    for run_id, (xs, values) in parts.items():
        out[run_id] = (np.asarray(xs, dtype=np.int64), np.asarray(values, dtype=np.float64))
    return out


def _fetch_postgresql(conn: sa.Connection, run_ids: Sequence[str], key: str, conditions: list, xcol, windowed: bool) -> dict[str, Series]:
    """One row per run: its points packed into two bytea (int8send/float8send, big-endian) that numpy
    reads without a Python object per point. Both aggregates see the rows in the same order.

    Whole series are read run by run through MLflow's (run_uuid, key, step) index: the cost follows
    the selected runs, not the store's history of that key (32 runs x 10,800 points: 196 ms, against
    275 ms for an index-only scan of the key; bench/overlay_query.py). A window (a zoomed chart) is an
    index-only range scan of MLflow's primary key (key, timestamp, ...), which reads just the window.
    """
    runs = sa.bindparam("runs", list(run_ids), type_=postgresql.ARRAY(sa.String))
    value = sa.case((METRICS.c.is_nan == sa.true(), sa.cast("NaN", postgresql.DOUBLE_PRECISION)), else_=METRICS.c.value)
    empty = sa.literal(b"", sa.LargeBinary)
    points = (sa.func.string_agg(sa.func.int8send(xcol), empty), sa.func.string_agg(sa.func.float8send(value), empty))
    if not windowed and not KEY_SCAN_WHOLE:
        selected = sa.func.unnest(runs).table_valued("run_uuid").render_derived(name="selected")
        per_run = sa.select(*points).where(METRICS.c.run_uuid == selected.c.run_uuid, *conditions).lateral("points")
        stmt = sa.select(selected.c.run_uuid, per_run).select_from(selected.join(per_run, sa.true()))
    else:
        stmt = sa.select(METRICS.c.run_uuid, *points).where(METRICS.c.run_uuid == sa.any_(runs), *conditions).group_by(METRICS.c.run_uuid)
    out: dict[str, Series] = {}
    for run_id, xs, values in binary_rows(conn, stmt):
        if xs is not None:
            out[run_id] = (np.frombuffer(xs, dtype=">i8").astype(np.int64), np.frombuffer(values, dtype=">f8").astype(np.float64))
    return out


def _fetch_all(engine: sa.Engine, run_ids: Sequence[str], key: str, lo: int | None, hi: int | None, x: str = "timestamp") -> dict[str, Series]:
    """_fetch on READ_THREADS connections at once for a large PostgreSQL selection (the server reads
    each part on its own core); otherwise on one connection."""
    run_ids = list(run_ids)
    if engine.dialect.name != "postgresql" or READ_THREADS < 2 or len(run_ids) < PARALLEL_MIN_RUNS:
        with engine.connect() as conn:
            return _fetch(conn, run_ids, key, lo, hi, x)

    def part(ids: list[str]) -> dict[str, Series]:
        with engine.connect() as conn:
            return _fetch(conn, ids, key, lo, hi, x)

    out: dict[str, Series] = {}
    parts = [run_ids[i::READ_THREADS] for i in range(READ_THREADS)]
    contexts = [contextvars.copy_context() for _ in parts]  # each part keeps the request's deadline (app/db/deadline.py)
    for found in _read_pool().map(lambda context, ids: context.run(part, ids), contexts, parts):
        out.update(found)
    return out


_POOL: ThreadPoolExecutor | None = None


def _read_pool() -> ThreadPoolExecutor:
    """One pool of READ_THREADS for the process, made on first use (most dashboards never read that many runs at once)."""
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(READ_THREADS, thread_name_prefix="radt-read")
    return _POOL


# --- windowing ------------------------------------------------------------------------------------


def _sorted(xs: np.ndarray, values: np.ndarray) -> Series:
    """By x, ties by value (NaN last), so both backends give the same order."""
    if len(xs) < 2 or bool(np.all(xs[1:] > xs[:-1])):
        return xs, values
    order = np.lexsort((values, xs))
    return xs[order], values[order]


def _window(xs: np.ndarray, values: np.ndarray, lo: int | None, hi: int | None) -> Series:
    """The points of a sorted series with x in [lo, hi] (either open): a run's own window out of a read that covered them all."""
    if lo is None and hi is None:
        return xs, values
    left = 0 if lo is None else int(np.searchsorted(xs, lo, side="left"))
    right = len(xs) if hi is None else int(np.searchsorted(xs, hi, side="right"))
    return xs[left:right], values[left:right]


def raw_by_pair(engine: sa.Engine, pairs: Iterable[tuple[str, str]]) -> dict[tuple[str, str], Series]:
    """(run_id, key) -> raw series (sorted), for each asked pair that has points."""
    by_key: dict[str, list[str]] = defaultdict(list)
    for run_id, key in pairs:
        by_key[key].append(run_id)
    out: dict[tuple[str, str], Series] = {}
    for key, runs in by_key.items():
        for run_id, series in _fetch_all(engine, runs, key, None, None).items():
            out[(run_id, key)] = _sorted(*series)
    return out


# --- loading --------------------------------------------------------------------------------------


def load_series(
    engine: sa.Engine,
    run_ids: list[str],
    key: str,
    start_ms: int | None = None,
    end_ms: int | None = None,
    budget: int = DEFAULT_BUDGET,
    *,
    method: str = "minmax",
    windows: Mapping[str, tuple[int | None, int | None]] | None = None,
    x: str = "timestamp",
    missing: tuple[float, ...] = (),
) -> dict[str, Series]:
    """run_id -> (x, values) of one stored key, sorted by x, at most ``budget`` points per run.

    x is the timestamp in ms (or the step with ``x="step"``; then the window is in steps too).
    ``[start_ms, end_ms]`` (inclusive, either open) restricts every run; ``windows`` gives some
    runs their own window instead (for a time-since-start axis: each run's start + offsets).
    A window with ``budget`` points or fewer comes back raw; a longer one is downsampled with
    ``method`` (app.db.downsample: MinMax by default, minima and maxima kept; ``"envelope"``: an
    app.db.downsample.Envelope of per-bucket mean, minimum and maximum instead of points). NaN points are NaN.
    Runs without the key, or without points in their window, are absent. Stored values listed in
    ``missing`` (radT's "no reading" sentinels, catalogue.missing_values) become NaN before downsampling.
    A time window longer than the budget's worth of 10 s buckets is drawn from the rollups (rebuilt first
    where another writer added points): bucket minima and maxima at their own times, a bucket of no
    readings a NaN; the rollups leave out the catalogue's sentinels of ``key`` themselves.
    """
    run_ids = unique(run_ids)
    if not run_ids:
        return {}
    windows = dict(windows or {})
    drawn: dict[str, Series | Envelope | None] = {}
    if x == "timestamp" and USE_ROLLUPS:
        drawn = _from_rollups(engine, run_ids, key, {r: windows.get(r, (start_ms, end_ms)) for r in run_ids}, budget, method)
    rest = [r for r in run_ids if r not in drawn]
    if rest:
        drawn.update(_from_raw(engine, rest, key, Drawing(start_ms, end_ms, budget, method, windows, x, missing)))
    return {r: drawn[r] for r in run_ids if r in drawn and drawn[r] is not None}


def _from_rollups(
    engine: sa.Engine, run_ids: list[str], key: str, window_of: Mapping[str, tuple[int | None, int | None]], budget: int, method: str
) -> dict[str, Series | Envelope | None]:
    """The runs whose window is long enough for the rollups, drawn from them (None: no points in the window);
    {} where the store's rollups cannot be made or read (rollupseries.give_up: the raw path draws them all)."""
    if not rollupseries.available(engine):
        return {}
    try:
        found = rollupseries.prepare(engine, run_ids, key)
        groups: dict[tuple[int, int | None, int | None], list[str]] = defaultdict(list)
        for run_id, extent in found.items():
            res = rollupseries.resolution(extent, *window_of[run_id], budget, ENVELOPE_POINTS if method == ENVELOPE else 2)
            if res is not None:
                groups[(res, *window_of[run_id])].append(run_id)
        buckets = _read_buckets(engine, groups, key) if groups else {}
    except sa.exc.SQLAlchemyError as exc:
        rollupseries.give_up(engine, exc)
        return {}
    out: dict[str, Series | Envelope | None] = {}
    for (res, lo, hi), runs in groups.items():
        for run_id in runs:
            out[run_id] = None
            if run_id not in buckets:
                continue
            if method == ENVELOPE:
                drawn = rollupseries.envelope(buckets[run_id], res, lo, hi, budget)
            else:
                drawn = rollupseries.points(buckets[run_id], lo, hi, budget, method)
            if len(drawn[0]):
                out[run_id] = drawn
    return out


def _read_buckets(engine: sa.Engine, groups: Mapping[tuple[int, int | None, int | None], list[str]], key: str) -> dict:
    """rollupseries.read on READ_THREADS connections at once for a large PostgreSQL selection, as _fetch_all reads raw points."""
    total = sum(len(runs) for runs in groups.values())
    if engine.dialect.name != "postgresql" or READ_THREADS < 2 or total < PARALLEL_MIN_RUNS:
        return rollupseries.read(engine, groups, key)
    parts = [{group: runs[i::READ_THREADS] for group, runs in groups.items() if runs[i::READ_THREADS]} for i in range(READ_THREADS)]
    contexts = [contextvars.copy_context() for _ in parts]  # each part keeps the request's deadline (app/db/deadline.py)
    out: dict = {}
    for found in _read_pool().map(lambda context, part: context.run(rollupseries.read, engine, part, key), contexts, parts):
        out.update(found)
    return out


class Drawing(NamedTuple):
    """How load_series draws the runs: the common window and the runs' own, the budget and method, the x axis, the sentinels."""

    start_ms: int | None
    end_ms: int | None
    budget: int
    method: str
    windows: Mapping[str, tuple[int | None, int | None]]
    x: str
    missing: tuple[float, ...]


def _from_raw(engine: sa.Engine, run_ids: list[str], key: str, drawing: Drawing) -> dict[str, Series | Envelope]:
    """The runs drawn from their raw points: read, windowed per run, downsampled past the budget."""
    start_ms, end_ms, budget, method, windows, x, missing = drawing
    bounds = [windows.get(r, (start_ms, end_ms)) for r in run_ids]
    lows = [b[0] for b in bounds]
    highs = [b[1] for b in bounds]
    lo = None if any(v is None for v in lows) else min(lows)
    hi = None if any(v is None for v in highs) else max(highs)
    raw = _fetch_all(engine, run_ids, key, lo, hi, x)
    out: dict[str, Series | Envelope] = {}
    for run_id in run_ids:
        if run_id not in raw:
            continue
        xs, values = _sorted(*raw[run_id])
        if windows:
            xs, values = _window(xs, values, *windows.get(run_id, (start_ms, end_ms)))
        if len(xs) == 0:
            continue
        if missing:
            values = np.where(np.isin(values, missing), np.nan, values)
        if len(xs) > budget and method == ENVELOPE:
            out[run_id] = envelope(xs, values, budget)
            continue
        if len(xs) > budget:
            idx = downsample_indices(xs, values, budget, method)
            xs, values = xs[idx], values[idx]
        out[run_id] = (xs, values)
    return out


def load_devices(
    engine: sa.Engine,
    run_ids: list[str],
    metric_name: str,
    start_ms: int | None = None,
    end_ms: int | None = None,
    budget: int = DEFAULT_BUDGET,
    *,
    keys: Mapping[str, set[str]] | None = None,
    gpus: Iterable[int] | None = None,
    **options,
) -> dict[str, dict[catalogue.Device, Series]]:
    """run_id -> {device: (x, values)} for a catalogue metric: every GPU, MIG slice and node the run stored it for.

    Each device's own key (``device_keys``), values in the catalogue's unit: legacy keys are scaled
    (radT's 0-1 "SMI - GPU Util" becomes percent), radT's "no reading" sentinels become NaN, and
    radT's energy counter (since driver load) is made relative to the run's first reading, like
    radt's own. ``gpus`` keeps only those GPU indices (host metrics are kept). ``options`` go to
    load_series (method, windows, x); ``budget`` is per device.
    """
    if metric_name not in catalogue.METRICS:
        raise KeyError(f"unknown catalogue metric {metric_name!r}")
    keys = keys_by_run(engine, run_ids) if keys is None else keys
    wanted = None if gpus is None else set(gpus)
    by_key: dict[str, list[tuple[str, catalogue.Device, float]]] = defaultdict(list)
    for run_id in unique(run_ids):
        for device, (key, resolved) in device_keys(keys.get(run_id, ()), metric_name).items():
            if wanted is None or device.gpu is None or device.gpu in wanted:
                by_key[key].append((run_id, device, resolved.scale))
    out: dict[str, dict[catalogue.Device, Series]] = {}
    for key, members in by_key.items():
        runs = [run_id for run_id, _device, _scale in members]
        series = load_series(engine, runs, key, start_ms, end_ms, budget, missing=catalogue.missing_values(key), **options)
        offsets = _first_values(engine, runs, key) if cumulative_legacy(key) else {}
        for run_id, device, scale in members:
            if run_id not in series:
                continue
            found = series[run_id]
            if scale != 1.0 or offsets:
                found = _rescaled(found, offsets.get(run_id, 0.0), scale)
            out.setdefault(run_id, {})[device] = found
    return {run_id: dict(sorted(out[run_id].items(), key=lambda item: item[0].sort_key())) for run_id in unique(run_ids) if run_id in out}


def _rescaled(found: Series | Envelope, offset: float, scale: float) -> Series | Envelope:
    """A series (or an envelope's mean and band) in the catalogue's unit: (value - offset) * scale."""
    if isinstance(found, Envelope):
        return Envelope(found.x, *((v - offset) * scale for v in (found.mean, found.low, found.high)))
    xs, values = found
    return xs, (values - offset) * scale


def load_metric(
    engine: sa.Engine,
    run_ids: list[str],
    metric_name: str,
    gpu: int | None = None,
    start_ms: int | None = None,
    end_ms: int | None = None,
    budget: int = DEFAULT_BUDGET,
    *,
    keys: Mapping[str, set[str]] | None = None,
    **options,
) -> dict[str, Series]:
    """One device's series per run (GPU ``gpu`` of the run's host; None: the run's first device); see load_devices."""
    devices = load_devices(engine, run_ids, metric_name, start_ms, end_ms, budget, keys=keys, gpus=None if gpu is None else [gpu], **options)
    out: dict[str, Series] = {}
    for run_id, found in devices.items():
        for device, series in found.items():
            if gpu is None or (device.node is None and device.mig is None):
                out[run_id] = series
                break
    return out


def _first_values(engine: sa.Engine, run_ids: Sequence[str], key: str) -> dict[str, float]:
    """run_id -> the earliest real value of a key (earliest timestamp, then step; NaN and radT's sentinels skipped)."""
    real = [not_nan()] + [METRICS.c.value != v for v in catalogue.missing_values(key)]
    first = (
        sa.select(METRICS.c.run_uuid.label("run_uuid"), sa.func.min(METRICS.c.timestamp).label("ts"))
        .where(METRICS.c.key == key, *real)
        .group_by(METRICS.c.run_uuid)
    )
    out: dict[str, float] = {}
    with engine.connect() as conn:
        for chunk in chunks(list(run_ids)):
            sub = first.where(METRICS.c.run_uuid.in_(chunk)).subquery()
            stmt = (
                sa.select(METRICS.c.run_uuid, METRICS.c.value)
                .select_from(METRICS.join(sub, sa.and_(sub.c.run_uuid == METRICS.c.run_uuid, sub.c.ts == METRICS.c.timestamp)))
                .where(METRICS.c.key == key, *real)
                .order_by(METRICS.c.run_uuid, METRICS.c.step, METRICS.c.value)
            )
            for run_id, value in plain_rows(conn, stmt):
                out.setdefault(run_id, float(value))
    return out


# --- the training-step axis -----------------------------------------------------------------------


def own_keys(keys: Iterable[str]) -> list[str]:
    """The keys a run logged itself (loss, accuracy): neither radt's system/ keys nor radT's legacy ones."""
    return sorted(k for k in keys if not k.startswith(catalogue.PREFIX) and catalogue.resolve(k) is None)


def step_history(engine: sa.Engine, run_ids: list[str], *, keys: Mapping[str, set[str]] | None = None) -> dict[str, Series]:
    """run_id -> (timestamps ms, steps) of the run's own most-logged metric: where its script was when.

    Hardware samples count their own steps; placed on this history by time they share the training-step axis.
    Runs that logged no metric of their own are absent."""
    keys = keys_by_run(engine, run_ids) if keys is None else keys
    wanted = {run_id: own_keys(keys.get(run_id, ())) for run_id in unique(run_ids)}
    wanted = {run_id: found for run_id, found in wanted.items() if found}
    if not wanted:
        return {}
    count = sa.func.count().label("n")
    chosen: dict[str, list[str]] = defaultdict(list)
    with engine.connect() as conn:
        for chunk in chunks(list(wanted)):
            stmt = sa.select(METRICS.c.run_uuid, METRICS.c.key, count).where(
                METRICS.c.run_uuid.in_(chunk), METRICS.c.key.in_(sorted({k for r in chunk for k in wanted[r]}))
            )
            best: dict[str, tuple[int, str]] = {}
            for run_id, key, n in plain_rows(conn, stmt.group_by(METRICS.c.run_uuid, METRICS.c.key)):
                if key in wanted[run_id] and (n, key) > best.get(run_id, (0, "")):
                    best[run_id] = (n, key)
            for run_id, (_n, key) in best.items():
                chosen[key].append(run_id)
        out: dict[str, Series] = {}
        for key, runs in chosen.items():
            for chunk in chunks(runs):
                stmt = sa.select(METRICS.c.run_uuid, METRICS.c.timestamp, METRICS.c.step).where(METRICS.c.key == key, METRICS.c.run_uuid.in_(chunk))
                parts: dict[str, list] = defaultdict(list)
                for run_id, ts, step in plain_rows(conn, stmt):
                    parts[run_id].append((ts, step))
                for run_id, rows in parts.items():
                    ts, steps = np.asarray(sorted(rows), dtype=np.int64).T
                    out[run_id] = (ts, np.maximum.accumulate(steps))  # a script's step never goes back in time
    return out


def place_by_time(timestamps: np.ndarray, history: Series) -> np.ndarray:
    """The step (fractional) the script was at when each sample was taken; NaN before its first or after its last logged step."""
    ts, steps = history
    return np.interp(np.asarray(timestamps, dtype=np.float64), ts.astype(np.float64), steps.astype(np.float64), left=np.nan, right=np.nan)


def time_of_step(step: float, history: Series) -> float:
    """The timestamp (ms) at which the script reached ``step``: a step window as a time window."""
    ts, steps = history
    return float(np.interp(float(step), steps.astype(np.float64), ts.astype(np.float64)))
