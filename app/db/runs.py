"""Which experiments, runs and workloads the store holds, and which metric keys each run stored.

A run's workload: a radt parent run (tag ``radt.role`` = ``workload``, children linked by
``mlflow.parentRunId``), the original radT's ``workload`` param, or an ``ungrouped`` bucket per
experiment for plain MLflow runs. Keys come from ``latest_metrics`` (one row per key and run: cheap).
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

import pandas as pd
import sqlalchemy as sa

from radt import catalogue
from radt.app.db.store import ACTIVE, EXPERIMENTS, LATEST, LIVE_STATUSES, METRICS, PARAMS, RUNS, TAGS, chunks, plain_rows, unique
from radt.runmodel import LETTER_TAG, PARENT_TAG, ROLE_TAG, RUN_NAME_TAG, WORKLOAD_ROLE, WORKLOAD_TAG, workload_of

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


# --- experiments and runs -------------------------------------------------------------------------


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
    """The ids that are numbers (MLflow's experiment_id column is an integer), once each; anything else matches no experiment."""
    out = []
    for value in experiment_ids:
        text = str(value).strip()
        if text.lstrip("-").isdigit():
            out.append(int(text))
    return list(dict.fromkeys(out))


def key_values(
    conn: sa.Connection, table: sa.Table, run_ids: Sequence[str], keys: Sequence[str] | None = None, prefix: str | None = None
) -> dict[str, dict[str, str]]:
    """run_id -> {key: value} of a key-value table (tags or params) for these runs, only ``keys`` (and keys starting with ``prefix``) where given."""
    out: dict[str, dict[str, str]] = defaultdict(dict)
    for chunk in chunks(run_ids):
        stmt = sa.select(table.c.run_uuid, table.c.key, table.c.value).where(table.c.run_uuid.in_(chunk))
        if keys is not None:
            wanted = table.c.key.in_(list(keys))
            stmt = stmt.where(sa.or_(wanted, table.c.key.startswith(prefix, autoescape=True)) if prefix else wanted)
        for run_id, key, value in plain_rows(conn, stmt):
            out[run_id][key] = value
    return out


def _last_timestamps(conn: sa.Connection, run_ids: Sequence[str]) -> dict[str, int]:
    """run_id -> its newest metric timestamp (ms): where an ended run without end_time stopped."""
    out = {}
    for chunk in chunks(run_ids):
        stmt = sa.select(LATEST.c.run_uuid, sa.func.max(LATEST.c.timestamp)).where(LATEST.c.run_uuid.in_(chunk)).group_by(LATEST.c.run_uuid)
        out.update({run_id: int(ts) for run_id, ts in plain_rows(conn, stmt) if ts is not None})
    return out


def durations(conn: sa.Connection, runs: list[dict], now_ms: int | None = None) -> None:
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


def run_rows(
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
        statements = [base.where(column.in_(chunk)) for chunk in chunks(list(ids or []))]
    out = []
    for stmt in statements:
        for run_id, exp_id, name, status, start, end in plain_rows(conn, stmt):
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
        return describe_runs(conn, run_rows(conn, experiment_ids=keys), now_ms)


def describe_runs(conn: sa.Connection, runs: list[dict], now_ms: int | None = None) -> pd.DataFrame:
    """list_runs' frame for run rows (``run_rows``): workloads, letters, params, tags, durations."""
    run_ids = [r["run_id"] for r in runs]
    tags = key_values(conn, TAGS, run_ids)
    params = key_values(conn, PARAMS, run_ids)
    known = set(run_ids)
    parents = {tags[r].get(PARENT_TAG) for r in run_ids} - known - {None, ""}
    parent_tags = dict(tags)
    if parents:  # parents outside the selection (deleted, another experiment): their role and workload only
        parent_tags.update(key_values(conn, TAGS, sorted(parents), keys=[ROLE_TAG, WORKLOAD_TAG, RUN_NAME_TAG]))
    names = {r["run_id"]: r["run_name"] for r in runs}
    runs = [r for r in runs if tags[r["run_id"]].get(ROLE_TAG) != WORKLOAD_ROLE]
    durations(conn, runs, now_ms)
    for r in runs:
        run_tags, run_params = tags[r["run_id"]], params[r["run_id"]]
        r["run_name"] = r["run_name"] or run_tags.get(RUN_NAME_TAG) or r["run_id"][:8]
        parent = run_tags.get(PARENT_TAG)
        r["workload_id"], r["workload_label"] = workload_of(r["run_id"], r["experiment_id"], run_tags, run_params, parent_tags.get(parent), names.get(parent))
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


def _empty_runs() -> pd.DataFrame:
    """list_runs' frame without rows, with its columns' types (so callers never special-case it)."""
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


# --- metric keys ----------------------------------------------------------------------------------


def keys_by_run(engine: sa.Engine, run_ids: Sequence[str]) -> dict[str, set[str]]:
    """run_id -> the metric keys it stored (latest_metrics; the metrics table for runs missing there)."""
    run_ids = unique(run_ids)
    out: dict[str, set[str]] = {}
    with engine.connect() as conn:
        for chunk in chunks(run_ids):
            for run_id, key in plain_rows(conn, sa.select(LATEST.c.run_uuid, LATEST.c.key).where(LATEST.c.run_uuid.in_(chunk))):
                out.setdefault(run_id, set()).add(key)
        missing = [r for r in run_ids if r not in out]
        for chunk in chunks(missing):  # written around latest_metrics (old or foreign writers): the slow way
            stmt = sa.select(METRICS.c.run_uuid, METRICS.c.key).where(METRICS.c.run_uuid.in_(chunk)).distinct()
            for run_id, key in plain_rows(conn, stmt):
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
