"""Rollup build: `radt rollup` over a whole store against one raw full scan of the same points.

    .venv/bin/python bench/rollup_build.py [--runs 8] [--hours 1] [--rounds 3] [--pg postgresql://postgres@127.0.0.1:5432/postgres | --no-pg]

Fills a fresh SQLite store (and a fresh PostgreSQL database) with RUNS runs x 4 GPM metrics x HOURS h at
1 Hz through radt's writer (SqlMetricStore.write), then times, side by side in this one process:
- raw scan (the baseline): every run's non-NaN points read from MLflow's `metrics` into Python, chunk by
  chunk as the rollup reads them: what any reader of the raw points pays once;
- radt rollup: collectors.store.rollup.build(), what `radt rollup --store URI` runs (read, bucket at 10 s /
  1 min / 10 min, delete and upsert every run's rows).
Prints the medians, the ratio and the rows written. Figures go to docs/PERFORMANCE.md.
"""

from __future__ import annotations

import argparse
import io
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mlflow import MlflowClient  # noqa: E402
from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore  # noqa: E402
from overlay_query import timed  # noqa: E402  (bench/ is on sys.path: this file runs as a script)

from radt import mlflowdb, rollups  # noqa: E402
from radt.collectors.store.rollup import build  # noqa: E402
from radt.collectors.store.sqltracking import make_engine  # noqa: E402
from radt.collectors.store.stores import SqlMetricStore  # noqa: E402
from radt.points import Point  # noqa: E402

METRICS = {"sm_active": 0.45, "sm_occupancy": 0.2, "gr_engine_active": 0.55, "dram_active": 0.25}
START = 1_760_000_000_000


def fill(uri: str, runs: int, points: int) -> list[str]:
    """RUNS runs of 4 metrics at 1 Hz written through radt's writer, 20,000 points a batch."""
    client = MlflowClient(uri)
    experiment = client.create_experiment("rollup bench")
    writer = SqlMetricStore(uri)
    rng = np.random.default_rng(0)
    run_ids = []
    began = time.perf_counter()
    for i in range(runs):
        run_id = client.create_run(experiment).info.run_id
        ts = START + i * 60_000 + np.arange(points) * 1000
        for name, level in METRICS.items():
            values = np.clip(level + 0.1 * np.sin(np.arange(points) / 60.0) + rng.normal(0, 0.03, points), 0, 1)
            batch = [Point(f"system/gpu_0_{name}", float(v), int(t), s) for s, (t, v) in enumerate(zip(ts, values, strict=True))]
            for part in range(0, len(batch), 20_000):
                writer.write(run_id, batch[part : part + 20_000])
        run_ids.append(run_id)
    writer.close()
    total = runs * len(METRICS) * points
    print(f"  filled {runs} runs x {len(METRICS)} metrics x {points:,} points = {total:,} points in {time.perf_counter() - began:.1f} s")
    return run_ids


def raw_scan(uri: str, run_ids: list[str]) -> int:
    """The baseline: every raw point of every run read once, in the rollup's chunks; the number read."""
    engine = make_engine(uri)
    m = mlflowdb.metrics
    seen = 0
    with engine.connect() as conn:
        for run_id in run_ids:
            query = sa.select(m.c.key, m.c.timestamp, m.c.step, m.c.value).where(m.c.run_uuid == run_id, m.c.is_nan == sa.false())
            result = conn.execute(query.order_by(m.c.key, m.c.timestamp).execution_options(yield_per=rollups.READ_CHUNK))
            while part := result.fetchmany(rollups.READ_CHUNK):
                seen += len(part)
    engine.dispose()
    return seen


def measure(label: str, uri: str, runs: int, points: int, rounds: int) -> None:
    print(f"{label}:")
    run_ids = fill(uri, runs, points)
    raw_scan(uri, run_ids)  # the file / buffers warm for both
    t_scan, seen = timed(lambda: raw_scan(uri, run_ids), rounds)
    t_rollup, (n_runs, series, rows) = timed(lambda: build(uri, out=io.StringIO()), rounds)
    print(f"  raw full scan    {t_scan * 1000:8.0f} ms  ({seen:,} points, {seen / t_scan:,.0f} points/s)")
    print(f"  radt rollup      {t_rollup * 1000:8.0f} ms  ({n_runs} runs, {series} series, {rows:,} rows, {seen / t_rollup:,.0f} points/s)")
    print(f"  rollup / scan    {t_rollup / t_scan:8.1f} x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--hours", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--no-pg", action="store_true", help="SQLite only")
    args = parser.parse_args()
    points = int(args.hours * 3600)
    with tempfile.TemporaryDirectory() as tmp:
        uri = f"sqlite:///{tmp}/bench.db"
        SqlAlchemyStore(uri, Path(tmp).as_uri()).engine.dispose()
        measure("SQLite", uri, args.runs, points, args.rounds)
        if args.no_pg:
            return
        admin = sa.create_engine(args.pg, isolation_level="AUTOCOMMIT")
        database = f"radt_bench_rollup_{int(time.time())}"
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{database}"'))
        pg = args.pg.rsplit("/", 1)[0] + "/" + database
        try:
            SqlAlchemyStore(pg, Path(tmp).as_uri()).engine.dispose()
            measure("PostgreSQL", pg, args.runs, points, args.rounds)
        finally:
            with admin.connect() as conn:
                conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'))
            admin.dispose()


if __name__ == "__main__":
    main()
