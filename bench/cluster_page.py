"""The Cluster page at 100,000 imported jobs: radt's jobs table (SQL) against every job's tags read and ranked in Python.

    .venv/bin/python bench/cluster_page.py [--jobs 100000] [--stores sqlite,postgresql] [--pg URL] [--repeat 3]

Fills a fresh SQLite store and a fresh PostgreSQL database with JOBS runs as `radt import --slurm` and `radt diagnose`
leave them (tests/support/jobfill.py: slurmimport.job_tags, an array task's workload parent, no-series reasons, the
diagnosis and footprint tags; 300 users, 40 accounts, 8 partitions, a mix of findings), written in bulk: no jobs table,
as a store an older radt imported. Then, in this one process, side by side:
- old page (the baseline): the Cluster page's reads before the jobs table, kept here as they were (`old_job_rows`: every
  job's tags in one join, ranked by rank_key in Python; narrowed, counted per finding and totalled in Python);
- first load: pages.cluster.layout() through the dashboard's state on the fresh store, which backfills the table once;
- radt page: app.db.jobs.cluster() (SQL: ORDER BY rank LIMIT, GROUP BY, one sum per finding), and the whole layout
  (its findings' sentences and the Dash components too), unnarrowed and narrowed (by partition to one finding; one user).
Each radt timing is the best of --repeat, the old page's one call; the ratio is old / radt's whole layout. PostgreSQL's
tables are ANALYZEd after the fill and after the backfill, as autovacuum does on a default server (the figure before
the second is printed too). Figures go to docs/PERFORMANCE.md.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import sqlalchemy as sa  # noqa: E402
from mlflow import MlflowClient  # noqa: E402

from radt import settings  # noqa: E402
from radt.app.db import jobs  # noqa: E402
from radt.app.db.store import ACTIVE, EXPERIMENTS, RUNS, TAGS, make_read_engine  # noqa: E402
from radt.diagnosis import codes_of  # noqa: E402
from radt.footprint import figures_of, rank_key  # noqa: E402
from radt.runmodel import (  # noqa: E402
    DIAGNOSIS_TAG,
    FOOTPRINT_PREFIX,
    NO_SERIES_TAG,
    SLURM_EXPERIMENT_PREFIX,
    SLURM_JOB_TAG,
    SLURM_PARTITION_TAG,
    SLURM_PREFIX,
    gpus_in_tag,
)
from tests.support import jobfill  # noqa: E402

# --- the page's reads before the jobs table (app/db/jobs.py at 8079c71), the baseline --------------------------------

TAG_KEYS = {
    SLURM_JOB_TAG: "job",
    f"{SLURM_PREFIX}user": "user",
    f"{SLURM_PREFIX}account": "account",
    SLURM_PARTITION_TAG: "partition",
    f"{SLURM_PREFIX}state": "state",
    f"{SLURM_PREFIX}gpus_requested": "gpus_requested",
    f"{SLURM_PREFIX}gpus_used": "gpus_used",
    NO_SERIES_TAG: "no_series",
}
FIGURE_TAGS = (f"{FOOTPRINT_PREFIX}gpu_hours", f"{FOOTPRINT_PREFIX}idle_gpu_hours")
SUMMED = ("energy_kwh", "co2_kg", "cost")
BASIS_TAG = f"{FOOTPRINT_PREFIX}basis"
READ_TAGS = (*TAG_KEYS, DIAGNOSIS_TAG, *FIGURE_TAGS, *(f"{FOOTPRINT_PREFIX}{name}" for name in SUMMED), BASIS_TAG)


def _old_gpus(row: dict) -> int | None:
    count = gpus_in_tag(row.get("gpus_used") or "")
    requested = row.get("gpus_requested") or ""
    return count or (int(requested) if requested.isdigit() else None)


def _old_figures(row: dict, tags: Mapping[str, str]) -> dict[str, float]:
    figures = figures_of(tags)
    if "gpu_hours" not in figures and row["gpus"] is not None:
        figures["gpu_hours"] = row["gpus"] * row["hours"]
    return figures


def old_job_rows(engine: sa.Engine, now_ms: int | None = None) -> list[dict]:
    """The Cluster page's rows before the jobs table: every job's tags read, ranked in Python."""
    e, r, t = EXPERIMENTS, RUNS, TAGS
    stmt = (
        sa.select(r.c.run_uuid, r.c.experiment_id, r.c.start_time, r.c.end_time, t.c.key, t.c.value)
        .select_from(r.join(e, e.c.experiment_id == r.c.experiment_id).join(t, t.c.run_uuid == r.c.run_uuid))
        .where(
            e.c.name.startswith(SLURM_EXPERIMENT_PREFIX, autoescape=True),
            e.c.lifecycle_stage == ACTIVE,
            r.c.lifecycle_stage == ACTIVE,
            t.c.key.in_(list(READ_TAGS)),
        )
    )
    runs: dict[str, dict] = {}
    tags: dict[str, dict[str, str]] = {}
    with engine.connect() as conn:
        for run_id, experiment_id, start, end, key, value in conn.execute(stmt):
            runs.setdefault(run_id, {"run_id": run_id, "experiment_id": str(experiment_id), "start_ms": start, "end_ms": end})
            tags.setdefault(run_id, {})[key] = value or ""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    out = []
    for run_id, row in runs.items():
        held = tags[run_id]
        row.update((name, held[key]) for key, name in TAG_KEYS.items() if key in held)
        if "job" not in row:
            continue
        row["gpus"] = _old_gpus(row)
        row["hours"] = max(0.0, ((row["end_ms"] or now_ms) - (row["start_ms"] or now_ms)) / 3_600_000)
        row["diagnosed"] = DIAGNOSIS_TAG in held
        row["codes"] = codes_of(held)
        row["figures"] = _old_figures(row, held)
        row["gpu_hours"] = row["figures"].get("gpu_hours")
        row["idle_gpu_hours"] = row["figures"].get("idle_gpu_hours")
        row["basis"] = held.get(BASIS_TAG, "")
        out.append(row)
    out.sort(key=lambda x: (rank_key(x["figures"]), -(x["start_ms"] or 0), x["job"]))
    return out


def old_page(engine: sa.Engine, by: str, chosen: Mapping[str, str], limit: int) -> jobs.Cluster:
    """The old layout's figures: job_rows, then narrow, finding_counts and totals over every row in Python."""
    return jobs.from_rows(old_job_rows(engine), by, chosen, limit)  # narrow / finding_counts / totals: unchanged


# --- the bench ---------------------------------------------------------------------------------------------------------


def best(fn: Callable[[], object], repeat: int) -> tuple[float, object]:
    """(the fastest of `repeat` calls in s, its result)."""
    times, result = [], None
    for _ in range(repeat):
        began = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - began)
    return min(times), result


def fresh_store(kind: str, tmp: str, pg: str, admin: list) -> str:
    """An empty store with MLflow's schema: a SQLite file, or a new PostgreSQL database."""
    if kind == "sqlite":
        uri = f"sqlite:///{tmp}/cluster.db"
    else:
        if not admin:
            admin.append(sa.create_engine(pg, isolation_level="AUTOCOMMIT"))
        db = f"radt_bench_cluster_{os.getpid()}"
        with admin[0].connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)'))
            conn.execute(sa.text(f'CREATE DATABASE "{db}"'))
        uri = pg.rsplit("/", 1)[0] + "/" + db
    MlflowClient(uri).search_experiments()  # MLflow's schema, before the clock starts
    return uri


def analyze(uri: str) -> None:
    """PostgreSQL's statistics, as autovacuum makes them within a minute of a large write on a default server (this
    machine's runs with autovacuum off: without them PostgreSQL reads MLflow's tags table whole for each IN list)."""
    engine = sa.create_engine(uri, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(sa.text("ANALYZE"))
    engine.dispose()


def bench_store(kind: str, uri: str, count: int, repeat: int) -> None:
    from radt.app.web.dashboard import create_app

    began = time.perf_counter()
    imported = jobfill.cluster_jobs(count)
    ids = jobfill.fill(uri, imported)
    print(f"{kind:<10} filled {len(ids):,} job runs ({sum(1 for i in imported if i.job.array_job):,} array tasks) in {time.perf_counter() - began:.1f} s")
    if kind != "sqlite":
        analyze(uri)  # MLflow's tables
    limit = settings.CLUSTER_ROWS.get()
    busiest = max({i.job.user for i in imported}, key=lambda u: sum(i.job.user == u for i in imported))
    views = {
        "every job": ("user", {}),
        "partition, one finding": ("partition", {jobs.FINDING: "idle_gpus"}),
        f"one user ({busiest})": ("user", {"user": busiest}),
    }

    create_app(uri, "null")  # the dashboard's state on the store, its pages registered
    from radt.app.db.state import STATE
    from radt.pages import cluster

    began = time.perf_counter()
    cluster.layout()
    first = time.perf_counter() - began
    with STATE.engine.connect() as conn:
        kept = conn.execute(sa.text("SELECT count(*) FROM radt_jobs WHERE job IS NOT NULL")).scalar()
    print(f"{kind:<10} first load (the backfill of {kept:,} rows, once): {first:6.2f} s")
    if kind != "sqlite":
        sql_s, _ = best(lambda: jobs.cluster(STATE.engine, "user", {}, limit), repeat)
        page_s, _ = best(lambda: cluster.layout(), repeat)
        print(
            f"{kind:<10} {'every job, before ANALYZE':<28} radt SQL {sql_s * 1000:6.0f} ms, whole layout {page_s * 1000:6.0f} ms (radt_jobs without statistics)"
        )
        analyze(uri)  # radt_jobs

    engine = make_read_engine(uri)
    for name, (by, chosen) in views.items():
        old_s, old = best(lambda by=by, chosen=chosen: old_page(engine, by, chosen, limit), 1)  # seconds a call: once is enough
        new_s, new = best(lambda by=by, chosen=chosen: jobs.cluster(STATE.engine, by, chosen, limit), repeat)
        page_s, _ = best(lambda by=by, chosen=chosen: cluster.layout(by=by, **chosen), repeat)
        same = [r["run_id"] for r in old.rows] == [r["run_id"] for r in new.rows] and old.count == new.count and old.findings == new.findings
        same = same and [g["name"] for g in old.totals] == [g["name"] for g in new.totals]
        print(
            f"{kind:<10} {name:<28} old page {old_s * 1000:7.0f} ms | radt SQL {new_s * 1000:6.0f} ms, whole layout {page_s * 1000:6.0f} ms "
            f"({new.count:,} jobs, {len(new.rows)} listed) | RATIO old/radt layout {old_s / page_s:5.1f}x | same rows and totals: {'yes' if same else 'NO'}"
        )
    engine.dispose()
    STATE.engine.dispose()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--stores", default="sqlite,postgresql")
    parser.add_argument("--pg", default="postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    logging.getLogger("mlflow").setLevel(logging.ERROR)
    logging.getLogger("alembic").setLevel(logging.ERROR)
    print(f"{args.jobs:,} jobs; {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}; RADT_CLUSTER_ROWS {settings.CLUSTER_ROWS.get()}")
    admin: list = []
    for kind in args.stores.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            uri = fresh_store(kind, tmp, args.pg, admin)
            try:
                bench_store(kind, uri, args.jobs, args.repeat)
            finally:
                if kind != "sqlite":
                    with admin[0].connect() as conn:
                        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{uri.rsplit("/", 1)[1]}" WITH (FORCE)'))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
