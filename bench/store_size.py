"""Store size on PostgreSQL: bytes per raw point in MLflow's `metrics` (with its indexes) and in radt's rollups,
bytes per GPU per day at 1 Hz with and without `radt retain --raw 30d`, and how fast retain drops points.

A scratch database (created and dropped here) gets one ended run of KEYS keys × HOURS h at 1 Hz, written by radt's
bulk path (raw points and rollups) 40 days in the past; sizes are pg_total_relation_size (table, TOAST and indexes)
after VACUUM ANALYZE. Then `radt retain --raw 30d` cuts the run (its first cut: a rebuild of its rollups, the summary,
the DELETE); the DELETE alone is timed by wrapping app/retain.py's _drop. Before that, the same rows in a copy of `metrics`
partitioned by day: what dropping a day's partition would cost instead (radt never changes MLflow's table).

Run:  .venv/bin/python bench/store_size.py                  (about a minute on 2 cores)
      .venv/bin/python bench/store_size.py --keys 20 --hours 1   (a smoke run)
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import sqlalchemy as sa  # noqa: E402
from mlflow import MlflowClient  # noqa: E402

from radt import catalogue  # noqa: E402
from radt.app import retain  # noqa: E402
from radt.collectors.store.stores import SqlMetricStore  # noqa: E402
from radt.points import Point  # noqa: E402

DAY_MS = 86_400_000
BATCH = 20_000  # points per write: radt's writer catching up


def init_schema(uri: str) -> None:
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    with tempfile.TemporaryDirectory() as artifacts:
        SqlAlchemyStore(uri, Path(artifacts).as_uri()).engine.dispose()


def fill(uri: str, keys: int, hours: float, start_ms: int) -> tuple[str, int, float]:
    """One ended run of `keys` 1 Hz series; (run id, points, seconds to write)."""
    client = MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("store-size")).info.run_id
    names = [f"system/gpu_{i // 10}_bench_{i % 10:02d}" for i in range(keys)]
    seconds = int(hours * 3600)
    store = SqlMetricStore(uri)
    started = time.perf_counter()
    batch: list[Point] = []
    for s in range(seconds):
        batch.extend(Point(k, (s * 7 + i * 13) % 1000 / 10.0, start_ms + s * 1000, s) for i, k in enumerate(names))
        if len(batch) >= BATCH:
            store.write(run_id, batch)
            batch = []
    store.write(run_id, batch)
    took = time.perf_counter() - started
    store.close()
    client.set_terminated(run_id)
    return run_id, keys * seconds, took


def sizes(admin: sa.Engine, uri: str) -> dict[str, int]:
    """table -> bytes (table, TOAST, indexes) after VACUUM ANALYZE."""
    engine = sa.create_engine(uri, isolation_level="AUTOCOMMIT")
    out = {}
    with engine.connect() as conn:
        for table in ("metrics", "latest_metrics", "radt_rollups", "radt_rollup_series"):
            conn.execute(sa.text(f"VACUUM ANALYZE {table}"))
            out[table] = conn.execute(sa.text("SELECT pg_total_relation_size(CAST(:t AS regclass))"), {"t": table}).scalar_one()
        out["metrics_heap"] = conn.execute(sa.text("SELECT pg_table_size('metrics')")).scalar_one()
        out["metrics_rows"] = conn.execute(sa.text("SELECT count(*) FROM metrics")).scalar_one()
        out["rollup_rows"] = conn.execute(sa.text("SELECT count(*) FROM radt_rollups")).scalar_one()
    engine.dispose()
    return out


def timed_retain(uri: str) -> tuple[retain.Totals, float]:
    """retain --raw 30d; its totals and the seconds spent in the DELETE statements."""
    spent = [0.0]
    drop = retain._drop

    def timed_drop(*args, **kwargs):
        started = time.perf_counter()
        try:
            return drop(*args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - started

    retain._drop = timed_drop
    try:
        return retain.retain(uri, 30 * DAY_MS), spent[0]
    finally:
        retain._drop = drop


def partitioned(uri: str, start_ms: int, hours: float) -> tuple[float, float, int]:
    """The run's rows in a copy of `metrics` partitioned by day: (seconds to DELETE a day's rows from it, to DROP its
    partition instead, the rows of that day)."""
    engine = sa.create_engine(uri, isolation_level="AUTOCOMMIT")
    day0 = start_ms // DAY_MS * DAY_MS
    days = int((start_ms + hours * 3_600_000 - day0) // DAY_MS) + 1
    with engine.connect() as conn:
        conn.execute(sa.text("CREATE TABLE parted (LIKE metrics INCLUDING DEFAULTS) PARTITION BY RANGE (timestamp)"))
        for d in range(days):
            lo, hi = day0 + d * DAY_MS, day0 + (d + 1) * DAY_MS
            conn.execute(sa.text(f"CREATE TABLE parted_{d} PARTITION OF parted FOR VALUES FROM ({lo}) TO ({hi})"))
        conn.execute(sa.text("ALTER TABLE parted ADD PRIMARY KEY (key, timestamp, step, run_uuid, value, is_nan)"))
        conn.execute(sa.text("CREATE INDEX ON parted (run_uuid)"))
        conn.execute(sa.text("INSERT INTO parted SELECT * FROM metrics"))
        conn.execute(sa.text("VACUUM ANALYZE parted"))
        rows = conn.execute(sa.text("SELECT count(*) FROM parted_0")).scalar_one()
        conn.execute(sa.text("CREATE TABLE parted_copy (LIKE parted INCLUDING ALL)"))
        conn.execute(sa.text("INSERT INTO parted_copy SELECT * FROM parted_0"))
        started = time.perf_counter()
        conn.execute(sa.text("DELETE FROM parted_copy WHERE timestamp < :hi"), {"hi": day0 + DAY_MS})
        delete_s = time.perf_counter() - started
        started = time.perf_counter()
        conn.execute(sa.text("ALTER TABLE parted DETACH PARTITION parted_0"))
        conn.execute(sa.text("DROP TABLE parted_0"))
        drop_s = time.perf_counter() - started
    engine.dispose()
    return delete_s, drop_s, rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--pg", default=os.environ.get("RADT_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres"), help="admin URL of a PostgreSQL server"
    )
    parser.add_argument("--keys", type=int, default=20)
    parser.add_argument("--hours", type=float, default=6.0)
    args = parser.parse_args()

    admin = sa.create_engine(args.pg, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 5})
    name = f"radt_bench_store_{os.getpid()}"
    uri = args.pg.rsplit("/", 1)[0] + "/" + name
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    try:
        init_schema(uri)
        start = (int(time.time() * 1000) - 40 * DAY_MS) // DAY_MS * DAY_MS  # a day's start: one partition per day below
        run_id, points, write_s = fill(uri, args.keys, args.hours, start)
        full = sizes(admin, uri)
        raw_bpp = full["metrics"] / full["metrics_rows"]
        rollup_bpp = full["radt_rollups"] / points
        per_gpu = sum(m.per_gpu for m in catalogue.METRICS.values())
        day = 86_400
        print(f"run: {args.keys} keys x {args.hours:g} h at 1 Hz = {points:,} points (written in {write_s:.1f} s, {points / write_s:,.0f} points/s)")
        print(f"metrics (MLflow, with indexes):   {full['metrics']:>12,} B  {raw_bpp:6.1f} B/point")
        heap = full["metrics_heap"] / full["metrics_rows"]
        print(f"  of which the table {heap:.1f} B/point, its three indexes {raw_bpp - heap:.1f} B/point")
        print(f"radt_rollups (10 s, 1 min, 10 min): {full['radt_rollups']:>10,} B  {rollup_bpp:6.1f} B/raw point  ({full['rollup_rows']:,} rows)")
        print(f"latest_metrics + radt_rollup_series: {full['latest_metrics'] + full['radt_rollup_series']:,} B (per series, not per point)")
        print(f"catalogue: {per_gpu} per-GPU metrics at most")
        raw_day, roll_day = per_gpu * day * raw_bpp, per_gpu * day * rollup_bpp
        print(f"per GPU per day at 1 Hz ({per_gpu} keys): raw {raw_day / 1e6:,.1f} MB + rollups {roll_day / 1e6:,.1f} MB")
        print(f"  without retain: grows {(raw_day + roll_day) / 1e6:,.1f} MB per GPU-day, forever")
        print(f"  with retain --raw 30d: at most 30 days of raw ({30 * raw_day / 1e9:,.2f} GB per GPU) + {roll_day / 1e6:,.1f} MB per GPU-day of rollups")

        delete_day, drop_day, day_rows = partitioned(uri, start, args.hours)
        print(
            f"partitioned copy by day ({day_rows:,} rows in the first day): DELETE {delete_day:.2f} s "
            f"({day_rows / max(delete_day, 1e-9):,.0f} points/s), DETACH + DROP partition {drop_day:.3f} s"
        )
        totals, delete_s = timed_retain(uri)
        cut = sizes(admin, uri)
        print(
            f"retain --raw 30d: {totals.points:,} points dropped in {totals.seconds:.1f} s ({totals.points / totals.seconds:,.0f} points/s end to end, "
            f"the DELETE alone {delete_s:.1f} s, {totals.points / max(delete_s, 1e-9):,.0f} points/s); {totals.rollup_rows:,} rollup rows kept"
        )
        print(f"after retain and VACUUM: metrics {cut['metrics']:,} B ({cut['metrics_rows']:,} rows; the freed pages are reused by new points)")
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
