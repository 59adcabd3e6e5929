"""The dashboard's read side: SQLAlchemy Core queries on MLflow's own tables (PostgreSQL and SQLite).

Read-only by construction: the engine refuses writes (PostgreSQL sessions are read-only
transactions, SQLite connections are ``query_only``), every statement is a Core ``select()`` on
MLflow's table objects with bound parameters, and no SQL is ever built from user input.

What a caller gets:
- ``list_experiments``: active experiments with their number of runs.
- ``list_runs``: one row per run with its workload: a radt parent run (tag ``radt.role`` =
  ``workload``, children linked by ``mlflow.parentRunId``), the original radT's ``workload``
  param, or an ``ungrouped`` bucket per experiment for plain MLflow runs.
- ``list_metric_keys`` / ``keys_by_run``: stored keys (from ``latest_metrics``, one row per key
  and run, so it is cheap).
- ``load_series``: one stored key of many runs, downsampled right after the database to at most
  ``budget`` points per run with minima and maxima kept (``app.downsample``); a window that holds
  fewer points comes back raw, so zooming in shows full detail.
- ``resolve_keys`` / ``load_metric``: a catalogue metric (``sm_active`` on GPU 0) mapped onto
  whatever each run stored (``system/gpu_0_sm_active``, radT's ``DCGMI - SN Active``, ...), with
  legacy units scaled to the catalogue's.
- ``run_summary``: the script's duration, mean and p95 SMACT/SMOCC over all GPUs, peak memory per GPU, energy per GPU and summed, mean CPU per run.

Speed: a series is read through MLflow's primary key (key, timestamp, step, run_uuid, value,
is_nan), which covers the query (PostgreSQL answers with an index-only scan; a time window is a
range of it). On PostgreSQL each run comes back as one row, its points packed into two bytea
(``int8send``/``float8send``) that numpy reads directly, with psycopg 3 in the binary protocol;
SQLite rows come straight off the DBAPI cursor. Downsampling (tsdownsample) follows in Python.
"""

from __future__ import annotations

import json
import math
import os
import time
import urllib.parse
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pandas as pd
import sqlalchemy as sa
from mlflow.store.tracking.dbmodels.models import SqlExperiment, SqlLatestMetric, SqlMetric, SqlParam, SqlRun, SqlTag
from sqlalchemy.dialects import postgresql

from app import catalogue
from app.downsample import DEFAULT_BUDGET, downsample_indices

EXPERIMENTS = SqlExperiment.__table__
RUNS = SqlRun.__table__
TAGS = SqlTag.__table__
PARAMS = SqlParam.__table__
METRICS = SqlMetric.__table__
LATEST = SqlLatestMetric.__table__

ACTIVE = "active"  # MLflow's lifecycle_stage of experiments and runs that are not deleted
ROLE_TAG = "radt.role"
WORKLOAD_ROLE = "workload"
WORKLOAD_TAG = "radt.workload"
LETTER_TAG = "radt.letter"
PARENT_TAG = "mlflow.parentRunId"
RUN_NAME_TAG = "mlflow.runName"
LIVE_STATUSES = ("RUNNING", "SCHEDULED")
LEGACY_GPU = 0  # radT's keys carry no GPU index: they count as GPU 0
CHUNK = 500  # ids per IN list (SQLite's old limit is 999 variables per statement)
KEY_SCAN_WHOLE = False  # PostgreSQL reads whole series run by run, not by scanning the key (measured faster; see _fetch_postgresql)
READ_THREADS = max(1, int(os.environ.get("RADT_READ_THREADS", "2")))  # PostgreSQL connections one chart reads on at once
PARALLEL_MIN_RUNS = 8  # fewer runs are read on one connection

RUN_COLUMNS = [
    "run_id",
    "experiment_id",
    "run_name",
    "status",
    "start_time",
    "end_time",
    "duration_s",
    "workload_id",
    "workload_label",
    "letter",
    "params",
    "tags",
]
SUMMARY_COLUMNS = [
    "run_id",
    "duration_s",
    "smact_mean",
    "smact_p95",
    "smocc_mean",
    "smocc_p95",
    "gpu_memory_peak_mb",
    "energy_j",
    "cpu_mean",
    "process_cpu_mean",
    "own_steps",  # the highest step of the run's own metrics (its loss per epoch...) + 1: the work it did
    "gpu_energy_j",  # {physical GPU (gpu_identity): joules}: the energy of each GPU the run recorded
]

Series = tuple[np.ndarray, np.ndarray]


class StoreUnavailable(RuntimeError):
    """The store cannot be read; the message is one line for the page."""


# --- engine -------------------------------------------------------------------------------------


def make_read_engine(uri: str, *, pool_size: int = 5, statement_timeout_ms: int = 60_000) -> sa.Engine:
    """An engine for reading MLflow's tables that cannot write.

    PostgreSQL (``postgresql://`` uses psycopg 3 under SQLAlchemy 2.1): read-only transactions,
    a statement timeout, work_mem for the per-run aggregation, no JIT (it costs more than it saves
    on these short queries), pre-ping to survive a database restart. SQLite: the file must exist
    (``mode=rw`` never creates an empty store), connections are ``PRAGMA query_only`` and the
    journal mode is left to the writer (radt's writer puts it in WAL, so readers never block it).
    """
    if uri.startswith("postgres://"):
        uri = "postgresql://" + uri[len("postgres://") :]
    url = sa.engine.make_url(uri)
    backend = url.get_backend_name()
    if backend == "sqlite":
        connect_args: dict = {"timeout": 30}
        database = url.database
        if database and database != ":memory:" and not database.startswith("file:"):
            path = urllib.parse.quote(os.path.abspath(os.path.expanduser(database)))
            url = url.set(database=f"file:{path}", query={**url.query, "mode": "rw", "uri": "true"})
        engine = sa.create_engine(url, connect_args=connect_args)

        @sa.event.listens_for(engine, "connect")
        def _query_only(dbapi_connection, _record):
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA query_only = ON")
            cursor.close()

        return engine
    if backend == "postgresql":
        options = f"-c default_transaction_read_only=on -c statement_timeout={int(statement_timeout_ms)} -c work_mem=32MB -c jit=off"
        return sa.create_engine(
            url,
            pool_pre_ping=True,
            pool_size=pool_size,
            max_overflow=pool_size,
            connect_args={"connect_timeout": 5, "options": options, "application_name": "radt-dashboard"},
        )
    return sa.create_engine(url, pool_pre_ping=True)


def check_store(engine: sa.Engine) -> None:
    """Raise StoreUnavailable (one line: which store, why) unless MLflow's tables can be read."""
    where = _describe(engine.url)
    try:
        with engine.connect() as conn:
            conn.execute(sa.select(EXPERIMENTS.c.experiment_id).limit(1)).all()
            conn.execute(sa.select(METRICS.c.key).limit(1)).all()
    except sa.exc.SQLAlchemyError as exc:
        text = str(getattr(exc, "orig", None) or exc).strip()
        reason = text.splitlines()[0][:300] if text else type(exc).__name__
        if "no such table" in reason or ("does not exist" in reason and "relation" in reason):
            reason = f"not an MLflow tracking store ({reason})"
        raise StoreUnavailable(f"cannot read the tracking store {where}: {reason}") from exc


def _describe(url: sa.URL) -> str:
    """The store as the user wrote it, without its password."""
    if url.get_backend_name() == "sqlite" and (url.database or "").startswith("file:"):
        return "sqlite:///" + urllib.parse.unquote(url.database[len("file:") :])
    return url.render_as_string(hide_password=True)


# --- helpers ------------------------------------------------------------------------------------


def _chunks(items: Sequence, size: int = CHUNK) -> Iterable[Sequence]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _unique(ids: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(str(i) for i in ids if i is not None))


def _rows(conn: sa.Connection, stmt) -> list[tuple]:
    """Plain DBAPI tuples: no SQLAlchemy Row object per row for results of many thousands of rows."""
    result = conn.execute(stmt)
    try:
        if result.returns_rows and result.cursor is not None:
            return result.cursor.fetchall()
        return []
    finally:
        result.close()


def _binary_rows(conn: sa.Connection, stmt) -> list[tuple]:
    """Rows of a PostgreSQL select; with psycopg 3 in the binary protocol (bytea arrives as bytes, not hex)."""
    if conn.dialect.driver != "psycopg":
        return [tuple(row) for row in conn.execute(stmt)]
    compiled = stmt.compile(dialect=conn.dialect, compile_kwargs={"render_postcompile": True})
    cursor = conn.connection.driver_connection.cursor(binary=True)
    try:
        cursor.execute(compiled.string, compiled.params)
        return cursor.fetchall()
    finally:
        cursor.close()


def _not_nan():
    return METRICS.c.is_nan == sa.false()


def _value_or_null(table=METRICS):
    """The value, NULL where MLflow stored a NaN (as 0 with is_nan); NULL reads back as NaN."""
    return sa.case((table.c.is_nan == sa.true(), sa.null()), else_=table.c.value)


# --- experiments and runs -----------------------------------------------------------------------


def list_experiments(engine: sa.Engine) -> list[dict]:
    """Active experiments by name: [{"experiment_id": "1", "name": ..., "runs": n}] (workload parents not counted)."""
    e, r = EXPERIMENTS, RUNS
    role = TAGS.alias("role")
    stmt = (
        sa.select(e.c.experiment_id, e.c.name, (sa.func.count(r.c.run_uuid) - sa.func.count(role.c.run_uuid)).label("runs"))
        .select_from(
            e.outerjoin(r, sa.and_(r.c.experiment_id == e.c.experiment_id, r.c.lifecycle_stage == ACTIVE)).outerjoin(
                role, sa.and_(role.c.run_uuid == r.c.run_uuid, role.c.key == ROLE_TAG, role.c.value == WORKLOAD_ROLE)
            )
        )
        .where(e.c.lifecycle_stage == ACTIVE)
        .group_by(e.c.experiment_id, e.c.name)
    )
    with engine.connect() as conn:
        rows = conn.execute(stmt).all()
    out = [{"experiment_id": str(exp_id), "name": name, "runs": int(runs)} for exp_id, name, runs in rows]
    out.sort(key=lambda x: (x["name"].casefold(), x["name"], x["experiment_id"]))
    return out


def _experiment_keys(experiment_ids: Iterable[str]) -> list[int]:
    out = []
    for value in experiment_ids:
        text = str(value).strip()
        if text.lstrip("-").isdigit():
            out.append(int(text))
    return list(dict.fromkeys(out))


def _key_values(conn: sa.Connection, table: sa.Table, run_ids: Sequence[str], keys: Sequence[str] | None = None) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = defaultdict(dict)
    for chunk in _chunks(run_ids):
        stmt = sa.select(table.c.run_uuid, table.c.key, table.c.value).where(table.c.run_uuid.in_(chunk))
        if keys is not None:
            stmt = stmt.where(table.c.key.in_(list(keys)))
        for run_id, key, value in _rows(conn, stmt):
            out[run_id][key] = value
    return out


def _last_timestamps(conn: sa.Connection, run_ids: Sequence[str]) -> dict[str, int]:
    out = {}
    for chunk in _chunks(run_ids):
        stmt = sa.select(LATEST.c.run_uuid, sa.func.max(LATEST.c.timestamp)).where(LATEST.c.run_uuid.in_(chunk)).group_by(LATEST.c.run_uuid)
        out.update({run_id: int(ts) for run_id, ts in _rows(conn, stmt) if ts is not None})
    return out


def _durations(conn: sa.Connection, runs: list[dict], now_ms: int | None = None) -> None:
    """duration_s from start to end; running runs up to now, ended runs without end_time up to their last metric."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    missing = [r["run_id"] for r in runs if r["end_time"] is None and r["status"] not in LIVE_STATUSES and r["start_time"] is not None]
    last = _last_timestamps(conn, missing) if missing else {}
    for r in runs:
        start, end = r["start_time"], r["end_time"]
        if start is None:
            r["duration_s"] = math.nan
        elif end is not None:
            r["duration_s"] = max(0.0, (end - start) / 1000.0)
        elif r["status"] in LIVE_STATUSES:
            r["duration_s"] = max(0.0, (now_ms - start) / 1000.0)
        elif r["run_id"] in last:
            r["duration_s"] = max(0.0, (last[r["run_id"]] - start) / 1000.0)
        else:
            r["duration_s"] = math.nan


def _run_rows(
    conn: sa.Connection, *, experiment_ids: Sequence[int] | None = None, run_ids: Sequence[str] | None = None, live_since_ms: int | None = None
) -> list[dict]:
    """Rows of active runs by experiment, by id, or (``live_since_ms``) running or ended since then."""
    r, e = RUNS, EXPERIMENTS
    base = (
        sa.select(r.c.run_uuid, r.c.experiment_id, r.c.name, r.c.status, r.c.start_time, r.c.end_time)
        .select_from(r.join(e, e.c.experiment_id == r.c.experiment_id))
        .where(r.c.lifecycle_stage == ACTIVE, e.c.lifecycle_stage == ACTIVE)
    )
    if live_since_ms is not None:
        statements = [base.where(sa.or_(r.c.status.in_(LIVE_STATUSES), r.c.end_time >= int(live_since_ms)))]
    else:
        column, ids = (r.c.experiment_id, experiment_ids) if experiment_ids is not None else (r.c.run_uuid, run_ids)
        statements = [base.where(column.in_(chunk)) for chunk in _chunks(list(ids or []))]
    out = []
    for stmt in statements:
        for run_id, exp_id, name, status, start, end in _rows(conn, stmt):
            out.append(
                {
                    "run_id": run_id,
                    "experiment_id": str(exp_id),
                    "run_name": name or "",
                    "status": status or "",
                    "start_time": int(start) if start is not None else None,
                    "end_time": int(end) if end is not None else None,
                }
            )
    return out


def list_runs(engine: sa.Engine, experiment_ids: list[str], *, now_ms: int | None = None) -> pd.DataFrame:
    """One row per run that is not deleted, with its workload; radt's workload parent runs are not rows.

    Workloads: a radt run belongs to its parent (``mlflow.parentRunId`` pointing at a run tagged
    ``radt.role=workload``), labelled "workload <radt.workload>"; a run of the original radT to its
    ``workload`` param (id "param:<experiment>:<value>"); anything else to "ungrouped:<experiment>".
    """
    keys = _experiment_keys(experiment_ids)
    if not keys:
        return _empty_runs()
    with engine.connect() as conn:
        return describe_runs(conn, _run_rows(conn, experiment_ids=keys), now_ms)


def describe_runs(conn: sa.Connection, runs: list[dict], now_ms: int | None = None) -> pd.DataFrame:
    """list_runs' frame for run rows (``_run_rows``): workloads, letters, params, tags, durations."""
    run_ids = [r["run_id"] for r in runs]
    tags = _key_values(conn, TAGS, run_ids)
    params = _key_values(conn, PARAMS, run_ids)
    known = set(run_ids)
    parents = {tags[r].get(PARENT_TAG) for r in run_ids} - known - {None, ""}
    parent_tags = dict(tags)
    if parents:  # parents outside the selection (deleted, another experiment): their role and workload only
        parent_tags.update(_key_values(conn, TAGS, sorted(parents), keys=[ROLE_TAG, WORKLOAD_TAG, RUN_NAME_TAG]))
    names = {r["run_id"]: r["run_name"] for r in runs}
    runs = [r for r in runs if tags[r["run_id"]].get(ROLE_TAG) != WORKLOAD_ROLE]
    _durations(conn, runs, now_ms)
    for r in runs:
        run_tags, run_params = tags[r["run_id"]], params[r["run_id"]]
        r["run_name"] = r["run_name"] or run_tags.get(RUN_NAME_TAG) or r["run_id"][:8]
        r["workload_id"], r["workload_label"] = _workload(r, run_tags, run_params, parent_tags, names)
        r["letter"] = run_tags.get(LETTER_TAG) or run_params.get("letter") or ""
        r["params"] = dict(run_params)
        r["tags"] = dict(run_tags)
    if not runs:
        return _empty_runs()
    frame = pd.DataFrame(runs, columns=RUN_COLUMNS)
    frame["end_time"] = pd.to_numeric(frame["end_time"], errors="coerce").astype("float64")
    frame["start_time"] = pd.to_numeric(frame["start_time"], errors="coerce")
    frame["duration_s"] = frame["duration_s"].astype("float64")
    frame["_experiment"] = frame["experiment_id"].astype("int64")
    frame = frame.sort_values(["_experiment", "workload_label", "start_time", "letter", "run_name", "run_id"], kind="stable", na_position="last")
    return frame.drop(columns="_experiment").reset_index(drop=True)


def _workload(run: dict, run_tags: dict, run_params: dict, parent_tags: dict, names: dict) -> tuple[str, str]:
    parent = run_tags.get(PARENT_TAG)
    if parent and parent_tags.get(parent, {}).get(ROLE_TAG) == WORKLOAD_ROLE:
        name = parent_tags[parent].get(WORKLOAD_TAG) or run_tags.get(WORKLOAD_TAG) or parent_tags[parent].get(RUN_NAME_TAG) or names.get(parent) or parent[:8]
        return parent, f"workload {name}"
    if run_params.get("workload") not in (None, ""):
        value = run_params["workload"]
        return f"param:{run['experiment_id']}:{value}", f"workload {value}"
    return f"ungrouped:{run['experiment_id']}", "ungrouped"


def _empty_runs() -> pd.DataFrame:
    frame = pd.DataFrame({c: pd.Series(dtype="object") for c in RUN_COLUMNS})
    for c in ("start_time", "end_time", "duration_s"):
        frame[c] = frame[c].astype("float64")
    return frame


def list_workloads(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per workload of a list_runs() frame: experiment_id, workload_id, workload_label, runs, start_time, running."""
    columns = ["experiment_id", "workload_id", "workload_label", "runs", "start_time", "running"]
    if runs.empty:
        return pd.DataFrame(columns=columns)
    grouped = runs.groupby(["experiment_id", "workload_id", "workload_label"], sort=False)
    out = grouped.agg(runs=("run_id", "size"), start_time=("start_time", "min"), running=("status", lambda s: int(s.isin(LIVE_STATUSES).sum())))
    out = out.reset_index()
    ungrouped = out["workload_id"].str.startswith("ungrouped:")
    out = out.assign(_u=ungrouped).sort_values(["experiment_id", "_u", "start_time", "workload_label"], kind="stable").drop(columns="_u")
    return out.reset_index(drop=True)[columns]


# --- metric keys --------------------------------------------------------------------------------


def keys_by_run(engine: sa.Engine, run_ids: Sequence[str]) -> dict[str, set[str]]:
    """run_id -> the metric keys it stored (latest_metrics; the metrics table for runs missing there)."""
    run_ids = _unique(run_ids)
    out: dict[str, set[str]] = {}
    with engine.connect() as conn:
        for chunk in _chunks(run_ids):
            for run_id, key in _rows(conn, sa.select(LATEST.c.run_uuid, LATEST.c.key).where(LATEST.c.run_uuid.in_(chunk))):
                out.setdefault(run_id, set()).add(key)
        missing = [r for r in run_ids if r not in out]
        for chunk in _chunks(missing):  # written around latest_metrics (old or foreign writers): the slow way
            stmt = sa.select(METRICS.c.run_uuid, METRICS.c.key).where(METRICS.c.run_uuid.in_(chunk)).distinct()
            for run_id, key in _rows(conn, stmt):
                out.setdefault(run_id, set()).add(key)
    return out


def list_metric_keys(engine: sa.Engine, run_ids: list[str]) -> list[str]:
    """Distinct metric keys stored by these runs, sorted."""
    keys: set[str] = set()
    for run_keys in keys_by_run(engine, run_ids).values():
        keys |= run_keys
    return sorted(keys)


def present_metrics(engine: sa.Engine, run_ids: list[str], *, keys: Mapping[str, set[str]] | None = None) -> list[tuple[str, int | None]]:
    """The catalogue metrics these runs have, as (metric name, GPU index or None), in catalogue order.

    Legacy radT keys count as GPU 0 for per-GPU metrics; MIG slices and nodes count as their GPU.
    """
    keys = keys_by_run(engine, run_ids) if keys is None else keys
    found: set[tuple[str, int | None]] = set()
    for run_keys in keys.values():
        for key in run_keys:
            resolved = catalogue.resolve(key)
            if resolved is None:
                continue
            found.add((resolved.metric.name, resolved.device.gpu if resolved.metric.per_gpu else None))
    order = {name: i for i, name in enumerate(catalogue.METRICS)}
    return sorted(found, key=lambda item: (order[item[0]], -1 if item[1] is None else item[1]))


def device_keys(run_keys: Iterable[str], metric_name: str) -> dict[catalogue.Device, tuple[str, catalogue.Resolved]]:
    """Every series of one catalogue metric a run stored, one key per device (node, GPU, MIG slice), devices sorted.

    Where two keys measure the same device (radt's ``system/gpu_0_sm_active`` and radT's
    ``DCGMI - SM Active``, which counts as GPU 0), radt's and MLflow's ``system/`` keys win over
    radT's, then radT's keys in catalogue order.
    """
    legacy_rank = {k: i for i, k in enumerate(catalogue.LEGACY_KEYS)}
    best: dict[catalogue.Device, tuple[tuple, str, catalogue.Resolved]] = {}
    for key in run_keys:
        resolved = catalogue.resolve(key)
        if resolved is None or resolved.metric.name != metric_name:
            continue
        rank = (resolved.legacy, legacy_rank.get(catalogue.legacy_name(key) or "", 0), key)
        device = resolved.device
        if device not in best or rank < best[device][0]:
            best[device] = (rank, key, resolved)
    return {device: (best[device][1], best[device][2]) for device in sorted(best, key=catalogue.Device.sort_key)}


def resolve_scaled(
    engine: sa.Engine, run_ids: Sequence[str], metric_name: str, gpu: int | None = None, *, keys: Mapping[str, set[str]] | None = None
) -> dict[str, tuple[str, float]]:
    """run_id -> (stored key, scale to the catalogue unit) for a catalogue metric on one device; see resolve_keys."""
    if metric_name not in catalogue.METRICS:
        raise KeyError(f"unknown catalogue metric {metric_name!r}")
    keys = keys_by_run(engine, run_ids) if keys is None else keys
    out = {}
    for run_id in _unique(run_ids):
        for device, (key, resolved) in device_keys(keys.get(run_id, ()), metric_name).items():
            if gpu is None or (device.gpu == gpu and device.mig is None and device.node is None):
                out[run_id] = (key, resolved.scale)
                break
    return out


def resolve_keys(
    engine: sa.Engine, run_ids: list[str], metric_name: str, gpu: int | None = None, *, keys: Mapping[str, set[str]] | None = None
) -> dict[str, str]:
    """run_id -> the key that holds catalogue metric ``metric_name`` on GPU ``gpu`` of the run's own host.

    ``system/...`` keys (radt's and MLflow's own) come before radT's legacy keys, which carry no
    GPU index and count as GPU 0. ``gpu=None`` takes the run's first device (see ``device_keys``);
    every device of a run is ``load_devices``'. Runs without the metric are absent. Legacy values
    need ``resolve_scaled``'s scale (``load_metric`` applies it).
    """
    return {run_id: key for run_id, (key, _scale) in resolve_scaled(engine, run_ids, metric_name, gpu, keys=keys).items()}


# --- series -------------------------------------------------------------------------------------


def _x_column(x: str):
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
    for chunk in _chunks(list(run_ids)):
        stmt = sa.select(METRICS.c.run_uuid, xcol, _value_or_null()).where(METRICS.c.run_uuid.in_(chunk), *conditions)
        for run_id, xv, value in _rows(conn, stmt):
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
    for run_id, xs, values in _binary_rows(conn, stmt):
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
    for found in _read_pool().map(part, [run_ids[i::READ_THREADS] for i in range(READ_THREADS)]):
        out.update(found)
    return out


_POOL: ThreadPoolExecutor | None = None


def _read_pool() -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(READ_THREADS, thread_name_prefix="radt-read")
    return _POOL


def _sorted(xs: np.ndarray, values: np.ndarray) -> Series:
    """By x, ties by value (NaN last), so both backends give the same order."""
    if len(xs) < 2 or bool(np.all(xs[1:] > xs[:-1])):
        return xs, values
    order = np.lexsort((values, xs))
    return xs[order], values[order]


def _window(xs: np.ndarray, values: np.ndarray, lo: int | None, hi: int | None) -> Series:
    if lo is None and hi is None:
        return xs, values
    left = 0 if lo is None else int(np.searchsorted(xs, lo, side="left"))
    right = len(xs) if hi is None else int(np.searchsorted(xs, hi, side="right"))
    return xs[left:right], values[left:right]


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
    ``method`` (app.downsample: MinMax by default, minima and maxima kept). NaN points are NaN.
    Runs without the key, or without points in their window, are absent. Stored values listed in
    ``missing`` (radT's "no reading" sentinels, catalogue.missing_values) become NaN before downsampling.
    """
    run_ids = _unique(run_ids)
    if not run_ids:
        return {}
    windows = dict(windows or {})
    bounds = [windows.get(r, (start_ms, end_ms)) for r in run_ids]
    lows = [b[0] for b in bounds]
    highs = [b[1] for b in bounds]
    lo = None if any(v is None for v in lows) else min(lows)
    hi = None if any(v is None for v in highs) else max(highs)
    raw = _fetch_all(engine, run_ids, key, lo, hi, x)
    out: dict[str, Series] = {}
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
    for run_id in _unique(run_ids):
        for device, (key, resolved) in device_keys(keys.get(run_id, ()), metric_name).items():
            if wanted is None or device.gpu is None or device.gpu in wanted:
                by_key[key].append((run_id, device, resolved.scale))
    out: dict[str, dict[catalogue.Device, Series]] = {}
    for key, members in by_key.items():
        runs = [run_id for run_id, _device, _scale in members]
        series = load_series(engine, runs, key, start_ms, end_ms, budget, missing=catalogue.missing_values(key), **options)
        offsets = _first_values(engine, runs, key) if _cumulative_legacy(key) else {}
        for run_id, device, scale in members:
            if run_id not in series:
                continue
            xs, values = series[run_id]
            if scale != 1.0 or offsets:
                values = (values - offsets.get(run_id, 0.0)) * scale
            out.setdefault(run_id, {})[device] = (xs, values)
    return {run_id: dict(sorted(out[run_id].items(), key=lambda item: item[0].sort_key())) for run_id in _unique(run_ids) if run_id in out}


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


def _cumulative_legacy(key: str) -> bool:
    """radT keys whose values are counters since the driver loaded (DCGM's TOTEC)."""
    name = catalogue.legacy_name(key)
    return name is not None and catalogue.LEGACY_KEYS[name][0] == "energy_joules"


def _first_values(engine: sa.Engine, run_ids: Sequence[str], key: str) -> dict[str, float]:
    """run_id -> the earliest real value of a key (earliest timestamp, then step; NaN and radT's sentinels skipped)."""
    real = [_not_nan()] + [METRICS.c.value != v for v in catalogue.missing_values(key)]
    first = (
        sa.select(METRICS.c.run_uuid.label("run_uuid"), sa.func.min(METRICS.c.timestamp).label("ts"))
        .where(METRICS.c.key == key, *real)
        .group_by(METRICS.c.run_uuid)
    )
    out: dict[str, float] = {}
    with engine.connect() as conn:
        for chunk in _chunks(list(run_ids)):
            sub = first.where(METRICS.c.run_uuid.in_(chunk)).subquery()
            stmt = (
                sa.select(METRICS.c.run_uuid, METRICS.c.value)
                .select_from(METRICS.join(sub, sa.and_(sub.c.run_uuid == METRICS.c.run_uuid, sub.c.ts == METRICS.c.timestamp)))
                .where(METRICS.c.key == key, *real)
                .order_by(METRICS.c.run_uuid, METRICS.c.step, METRICS.c.value)
            )
            for run_id, value in _rows(conn, stmt):
                out.setdefault(run_id, float(value))
    return out


# --- summary ------------------------------------------------------------------------------------

# The run tags read here (the script's own start and exit, the GPUs' identities, the host) are spelled in app/catalogue.py.
SCRIPT_START_TAG, SCRIPT_END_TAG, GPUS_TAG, HOST_TAG = catalogue.SCRIPT_START_TAG, catalogue.SCRIPT_END_TAG, catalogue.GPUS_TAG, catalogue.HOST_TAG


def _aggregates(conn: sa.Connection, pairs: Mapping[str, Iterable[str]]) -> dict[tuple[str, str], tuple[float, float, int]]:
    """(run_id, key) -> (mean, max, count) over non-NaN points."""
    by_key: dict[str, list[str]] = defaultdict(list)
    for run_id, keys in pairs.items():
        for key in keys:
            by_key[key].append(run_id)
    out = {}
    m = METRICS
    for key, runs in by_key.items():
        for chunk in _chunks(runs):
            stmt = (
                sa.select(m.c.run_uuid, sa.func.avg(m.c.value), sa.func.max(m.c.value), sa.func.count())
                .where(m.c.key == key, m.c.run_uuid.in_(chunk), _not_nan())
                .group_by(m.c.run_uuid)
            )
            for run_id, mean, peak, count in _rows(conn, stmt):
                if count:
                    out[(run_id, key)] = (float(mean), float(peak), int(count))
    return out


def _latest(conn: sa.Connection, pairs: Mapping[str, Iterable[str]]) -> dict[tuple[str, str], float]:
    """(run_id, key) -> latest_metrics value (NaN where it is a NaN)."""
    keys = sorted({k for ks in pairs.values() for k in ks})
    out = {}
    if not keys:
        return out
    for chunk in _chunks(list(pairs)):
        stmt = sa.select(LATEST.c.run_uuid, LATEST.c.key, LATEST.c.value, LATEST.c.is_nan).where(LATEST.c.run_uuid.in_(chunk), LATEST.c.key.in_(keys))
        for run_id, key, value, is_nan in _rows(conn, stmt):
            if key in pairs.get(run_id, ()):
                out[(run_id, key)] = math.nan if is_nan else float(value)
    return out


def _matching(keys: Iterable[str], metric_name: str) -> list[tuple[str, catalogue.Resolved]]:
    """Every key meaning this metric, one per device (see device_keys)."""
    return list(device_keys(keys, metric_name).values())


def _trapezoid(xs_ms: np.ndarray, values: np.ndarray) -> float:
    keep = ~np.isnan(values)
    xs, values = xs_ms[keep] / 1000.0, values[keep]
    if len(xs) < 2:
        return math.nan
    return float(np.sum((xs[1:] - xs[:-1]) * (values[1:] + values[:-1]) / 2.0))


def run_summary(engine: sa.Engine, run_ids: list[str], *, now_ms: int | None = None) -> pd.DataFrame:
    """Per run, NaN where absent:

    - duration_s: the script's own time (``script_span``: radt's script start/exit tags, else the run's start and end);
    - smact_mean / smact_p95, smocc_mean / smocc_p95 (0-1): mean and 95th percentile of every point of every GPU
      the run recorded, pooled (a GPU's MIG slices stand for it where the run recorded them);
    - gpu_memory_peak_mb: the highest peak of a single GPU (one GPU's, never a sum);
    - energy_j: the sum over the run's GPUs of each GPU's energy (``gpu_energy_j``);
    - gpu_energy_j: {physical GPU (``gpu_identity``): joules} per whole GPU: energy_joules' last value, else radT's
      counter (last minus first), else power integrated over time;
    - cpu_mean (system CPU %), process_cpu_mean (the run's processes, 100 = one core; radT's TOP key);
    - own_steps: the highest step of the script's own metrics + 1.
    """
    run_ids = _unique(run_ids)
    if not run_ids:
        return pd.DataFrame({c: pd.Series(dtype="object" if c in ("run_id", "gpu_energy_j") else "float64") for c in SUMMARY_COLUMNS})
    keys = keys_by_run(engine, run_ids)
    rows = {r: dict.fromkeys(SUMMARY_COLUMNS, math.nan) | {"run_id": r, "gpu_energy_j": {}} for r in run_ids}
    with engine.connect() as conn:
        runs = _run_rows(conn, run_ids=run_ids)
        _durations(conn, runs, now_ms)
        tags = _key_values(conn, TAGS, run_ids, keys=[SCRIPT_START_TAG, SCRIPT_END_TAG, GPUS_TAG, HOST_TAG])
        for r in runs:
            start, end = script_span(r["start_time"], r["duration_s"], tags.get(r["run_id"], {}))
            rows[r["run_id"]]["duration_s"] = max(0.0, (end - start) / 1000.0) if math.isfinite(start) and math.isfinite(end) else math.nan

        memory = {r: _matching(keys.get(r, ()), "memory_usage_megabytes") for r in run_ids}
        cpu = {r: _matching(keys.get(r, ()), "cpu_utilization_percentage") for r in run_ids}
        process_cpu = {r: _matching(keys.get(r, ()), "process_cpu_utilization_percentage") for r in run_ids}
        energy = {r: _whole_gpus(keys.get(r, ()), "energy_joules") for r in run_ids}
        aggregate_pairs = {r: [k for k, _ in memory[r] + cpu[r] + process_cpu[r]] for r in run_ids}
        aggregates = _aggregates(conn, aggregate_pairs)
        latest = _latest(conn, {r: [k for k, _ in energy[r].values() if not _cumulative_legacy(k)] for r in run_ids})

        for run_id in run_ids:
            row = rows[run_id]
            peaks = [aggregates[(run_id, k)][1] * res.scale for k, res in memory[run_id] if (run_id, k) in aggregates]
            row["gpu_memory_peak_mb"] = max(peaks) if peaks else math.nan
            for column, found in (("cpu_mean", cpu), ("process_cpu_mean", process_cpu)):
                means = [aggregates[(run_id, k)][0] * res.scale for k, res in found[run_id] if (run_id, k) in aggregates]
                row[column] = means[0] if means else math.nan

    joules: dict[str, dict[catalogue.Device, float]] = {r: {} for r in run_ids}
    for run_id in run_ids:
        for device, (key, res) in energy[run_id].items():
            value = latest.get((run_id, key), math.nan)
            if not math.isnan(value):
                joules[run_id][device] = value * res.scale
    _legacy_energy(engine, {(r, d): kr for r in run_ids for d, kr in energy[r].items() if d not in joules[r] and _cumulative_legacy(kr[0])}, joules)
    power = {(r, d): kr for r in run_ids for d, kr in _whole_gpus(keys.get(r, ()), "power_usage_watts").items() if d not in joules[r]}
    _power_energy(engine, power, joules)
    for run_id, per_device in joules.items():
        if per_device:
            rows[run_id]["energy_j"] = float(sum(per_device.values()))
            rows[run_id]["gpu_energy_j"] = {gpu_identity(d, tags.get(run_id, {})): j for d, j in per_device.items()}

    for name, prefix in (("sm_active", "smact"), ("sm_occupancy", "smocc")):
        _series_stats(engine, {r: _own_devices(keys.get(r, ()), name) for r in run_ids}, rows, prefix)
    _own_steps(engine, run_ids, rows)
    frame = pd.DataFrame([rows[r] for r in run_ids], columns=SUMMARY_COLUMNS)
    for column in SUMMARY_COLUMNS[1:]:
        if column != "gpu_energy_j":
            frame[column] = frame[column].astype("float64")
    return frame


def script_span(start_time: float | None, duration_s: float, tags: Mapping[str, str]) -> tuple[float, float]:
    """[start, end] of the training script itself, epoch ms (NaN where unknown).

    radt's tags ``radt.script_start_ms`` (right after the script was spawned, so after radt's set-up and
    a CSV workload's start gate) and ``radt.script_end_ms`` (its exit, before radt's own pip freeze and
    uploads) where the run has them; else the run's start, and its end (``duration_s`` after its start:
    now for a running run, its last metric for one ended without an end time; list_runs' rule).
    """
    run_start = float(start_time) if start_time is not None and start_time == start_time else math.nan
    run_end = run_start + float(duration_s) * 1000.0 if duration_s is not None else math.nan
    return _tag_ms(tags.get(SCRIPT_START_TAG), run_start), _tag_ms(tags.get(SCRIPT_END_TAG), run_end)


def _tag_ms(value: str | None, default: float) -> float:
    try:
        ms = float(value) if value not in (None, "") else math.nan
    except ValueError:
        ms = math.nan
    return ms if math.isfinite(ms) else default


def gpu_identity(device: catalogue.Device, tags: Mapping[str, str]) -> str:
    """The physical GPU a series of a run measured, the same text for every run that used that GPU.

    ``uuid:<UUID>`` where the run's ``radt.gpus`` tag (a JSON list of ``{"series": "gpu_0", "uuid": ...}``)
    names the series' GPU; else ``host:<host>:gpu:<index>``, the host being the key's node (MLflow's
    multi-node keys), else the run's ``radt.host`` tag, else empty (radT's and plain MLflow runs: one
    workload ran on one machine), and the index the NVML one of the key (radT's keys count as GPU 0).
    """
    series = f"gpu_{device.gpu}" if device.node is None else f"{device.node}/gpu_{device.gpu}"
    try:
        listed = json.loads(tags.get(GPUS_TAG) or "[]")
    except ValueError:
        listed = []
    for entry in listed if isinstance(listed, list) else []:
        if isinstance(entry, dict) and entry.get("series") == series and entry.get("uuid"):
            return f"uuid:{entry['uuid']}"
    return f"host:{device.node or tags.get(HOST_TAG) or ''}:gpu:{device.gpu}"


def _whole_gpus(run_keys: Iterable[str], metric_name: str) -> dict[catalogue.Device, tuple[str, catalogue.Resolved]]:
    """device_keys of whole GPUs only (energy and power are a GPU's, not a MIG slice's)."""
    return {d: kr for d, kr in device_keys(run_keys, metric_name).items() if d.gpu is not None and d.mig is None}


def _own_devices(run_keys: Iterable[str], metric_name: str) -> list[tuple[str, float]]:
    """(key, scale) of every device of the run: its GPUs, a GPU's MIG slices instead of the whole GPU where it has them."""
    found = device_keys(run_keys, metric_name)
    sliced = {(d.node, d.gpu) for d in found if d.mig is not None}
    return [(key, res.scale) for d, (key, res) in found.items() if d.mig is not None or (d.node, d.gpu) not in sliced]


def _raw_by_pair(engine: sa.Engine, pairs: Iterable[tuple[str, str]]) -> dict[tuple[str, str], Series]:
    """(run_id, key) -> raw series (sorted), for each asked pair that has points."""
    by_key: dict[str, list[str]] = defaultdict(list)
    for run_id, key in pairs:
        by_key[key].append(run_id)
    out: dict[tuple[str, str], Series] = {}
    for key, runs in by_key.items():
        for run_id, series in _fetch_all(engine, runs, key, None, None).items():
            out[(run_id, key)] = _sorted(*series)
    return out


def _series_stats(engine: sa.Engine, found: Mapping[str, list[tuple[str, float]]], rows: dict[str, dict], prefix: str) -> None:
    """Mean and p95 of every point of every listed series of a run, pooled (NaN left out)."""
    series = _raw_by_pair(engine, [(r, key) for r, keys in found.items() for key, _scale in keys])
    for run_id, keys in found.items():
        parts = [series[(run_id, key)][1] * scale for key, scale in keys if (run_id, key) in series]
        values = np.concatenate(parts) if parts else np.empty(0)
        values = values[~np.isnan(values)]
        if len(values):
            rows[run_id][f"{prefix}_mean"] = float(np.mean(values))
            rows[run_id][f"{prefix}_p95"] = float(np.percentile(values, 95))


def _own_steps(engine: sa.Engine, run_ids: list[str], rows: dict[str, dict]) -> None:
    """The run's progress in its own units: the highest step of a metric the script logged (not system/...)."""
    with engine.connect() as conn:
        for chunk in _chunks(run_ids):
            stmt = sa.select(LATEST.c.run_uuid, LATEST.c.key, LATEST.c.step).where(
                LATEST.c.run_uuid.in_(chunk), sa.not_(LATEST.c.key.startswith("system/", autoescape=True))
            )
            for run_id, key, step in _rows(conn, stmt):
                if catalogue.resolve(key) is None and step is not None:  # radT's hardware keys are not progress
                    rows[run_id]["own_steps"] = max(float(step) + 1, 0.0 if math.isnan(rows[run_id]["own_steps"]) else rows[run_id]["own_steps"])


DeviceKeys = Mapping[tuple[str, catalogue.Device], tuple[str, catalogue.Resolved]]


def _legacy_energy(engine: sa.Engine, found: DeviceKeys, joules: dict[str, dict[catalogue.Device, float]]) -> None:
    """radT's energy counter (since the driver loaded): last minus first reading of the run."""
    series = _raw_by_pair(engine, [(r, key) for (r, _d), (key, _res) in found.items()])
    for (run_id, device), (key, res) in found.items():
        if (run_id, key) in series:
            values = series[(run_id, key)][1]
            values = values[~np.isnan(values)]
            if len(values):
                joules[run_id][device] = float((values[-1] - values[0]) * res.scale)


def _power_energy(engine: sa.Engine, found: DeviceKeys, joules: dict[str, dict[catalogue.Device, float]]) -> None:
    """A GPU's energy as the integral of its power over time."""
    series = _raw_by_pair(engine, [(r, key) for (r, _d), (key, _res) in found.items()])
    for (run_id, device), (key, res) in found.items():
        if (run_id, key) in series:
            xs, values = series[(run_id, key)]
            value = _trapezoid(xs, values * res.scale)
            if not math.isnan(value):
                joules[run_id][device] = value
