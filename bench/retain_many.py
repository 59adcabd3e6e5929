"""`radt retain` over many small ended runs, against the bare DELETE of the same raw points.

    .venv/bin/python bench/retain_many.py [--runs 5548] [--keys 4] [--seconds 120] [--pg postgresql://postgres@127.0.0.1:5432/postgres | --no-pg]

Fills a fresh SQLite store (and a fresh PostgreSQL database) with RUNS ended runs of KEYS metrics x SECONDS at
1 Hz, 40 days old, written through radt's writer (SqlMetricStore.write: raw points, latest_metrics and rollups),
then copies it, and times side by side in this one process:
- bare DELETE (the baseline): one `DELETE FROM metrics WHERE timestamp < cutoff` on the copy: the least any
  retention pays, keeping nothing (no rollups checked, no summary, no record of the cut);
- radt retain: app/retain.retain(), what `radt retain --raw 30d --store URI` runs (rollups checked to hold every
  raw point, each run's summary stored, the DELETE, raw_from_ms), on the original.
Prints both, the points per second and the ratio. Figures go to docs/PERFORMANCE.md.
"""

from __future__ import annotations

import argparse
import io
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mlflow import MlflowClient  # noqa: E402
from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore  # noqa: E402

from radt import mlflowdb  # noqa: E402
from radt.app import retain  # noqa: E402
from radt.collectors.store.stores import SqlMetricStore  # noqa: E402
from radt.points import Point  # noqa: E402

DAY_MS = 86_400_000
KEEP_MS = 30 * DAY_MS


def fill(uri: str, runs: int, keys: int, seconds: int) -> int:
    """RUNS ended runs (rows inserted in bulk), each one write of KEYS x SECONDS points through radt's writer; the points."""
    experiment = int(MlflowClient(uri).create_experiment("retain bench"))
    start = int(time.time() * 1000) - 40 * DAY_MS
    rng = np.random.default_rng(0)
    ids = [uuid.uuid4().hex for _ in range(runs)]
    rows = [
        {
            "run_uuid": run_id,
            "name": f"run {i}",
            "source_type": "LOCAL",
            "source_name": "",
            "entry_point_name": "",
            "user_id": "radt",
            "status": "FINISHED",
            "start_time": start + i * 1000,
            "end_time": start + i * 1000 + seconds * 1000,
            "source_version": "",
            "lifecycle_stage": "active",
            "artifact_uri": f"/tmp/artifacts/{run_id}",
            "experiment_id": experiment,
        }
        for i, run_id in enumerate(ids)
    ]
    engine = sa.create_engine(uri)
    with engine.begin() as conn:
        for part in range(0, len(rows), 5_000):
            conn.execute(mlflowdb.runs.insert(), rows[part : part + 5_000])
    engine.dispose()
    writer = SqlMetricStore(uri)
    began = time.perf_counter()
    for i, run_id in enumerate(ids):
        t0 = start + i * 1000
        values = rng.random((keys, seconds))
        writer.write(run_id, [Point(f"system/gpu_0_m{k}", float(values[k, s]), t0 + s * 1000, s) for k in range(keys) for s in range(seconds)])
    writer.close()
    total = runs * keys * seconds
    print(f"  filled {runs:,} runs x {keys} keys x {seconds} s = {total:,} points in {time.perf_counter() - began:.1f} s")
    return total


def bare_delete(uri: str) -> tuple[int, float]:
    """The baseline: every raw point older than the cutoff deleted in one statement; (rows, seconds)."""
    engine = sa.create_engine(uri)
    m = mlflowdb.metrics
    began = time.perf_counter()
    with engine.begin() as conn:
        gone = conn.execute(sa.delete(m).where(m.c.timestamp < retain.cutoff_ms(KEEP_MS))).rowcount
    took = time.perf_counter() - began
    engine.dispose()
    return gone, took


def measure(label: str, uri: str, copy: str, args: argparse.Namespace) -> None:
    print(f"{label}:")
    total = fill(uri, args.runs, args.keys, args.seconds)
    duplicate(uri, copy)
    gone, t_bare = bare_delete(copy)
    totals = retain.retain(uri, KEEP_MS, out=io.StringIO())
    assert gone == total and totals.points == total, (gone, totals, total)
    print(f"  bare DELETE      {t_bare:8.2f} s  ({gone:,} points, {gone / t_bare:,.0f} points/s)")
    print(
        f"  radt retain      {totals.seconds:8.2f} s  ({totals.runs:,} runs, {totals.points:,} points, {totals.points / totals.seconds:,.0f} points/s, "
        f"{totals.seconds / totals.runs * 1000:.2f} ms a run)"
    )
    print(f"  retain / DELETE  {totals.seconds / t_bare:8.1f} x")


def duplicate(uri: str, copy: str) -> None:
    """The filled store copied for the baseline: the file (SQLite) or a database made from it as a template (PostgreSQL)."""
    if uri.startswith("sqlite"):
        shutil.copy(sa.make_url(uri).database, sa.make_url(copy).database)
        return
    admin = sa.create_engine(uri.rsplit("/", 1)[0] + "/postgres", isolation_level="AUTOCOMMIT")
    source = uri.rsplit("/", 1)[1]
    with admin.connect() as conn:  # a template takes no sessions: MLflow's client keeps its pool open
        conn.execute(sa.text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :n"), {"n": source})
        conn.execute(sa.text(f'CREATE DATABASE "{copy.rsplit("/", 1)[1]}" TEMPLATE "{source}"'))
    admin.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5548)
    parser.add_argument("--keys", type=int, default=4)
    parser.add_argument("--seconds", type=int, default=120)
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--no-pg", action="store_true", help="SQLite only")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        uri = f"sqlite:///{tmp}/bench.db"
        SqlAlchemyStore(uri, Path(tmp).as_uri()).engine.dispose()
        measure("SQLite", uri, f"sqlite:///{tmp}/copy.db", args)
        if args.no_pg:
            return
        admin = sa.create_engine(args.pg, isolation_level="AUTOCOMMIT")
        database = f"radt_bench_retain_{int(time.time())}"
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{database}"'))
        pg = args.pg.rsplit("/", 1)[0] + "/" + database
        try:
            SqlAlchemyStore(pg, Path(tmp).as_uri()).engine.dispose()
            measure("PostgreSQL", pg, f"{pg}_copy", args)
        finally:
            with admin.connect() as conn:
                for name in (database, f"{database}_copy"):
                    conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            admin.dispose()


if __name__ == "__main__":
    main()
