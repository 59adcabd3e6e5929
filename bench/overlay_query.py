"""Overlay query: the data of one dashboard chart, 32 runs x 3 h at 1 Hz, radt against MLflow.

    .venv/bin/python bench/overlay_query.py [--runs 32] [--hours 3] [--rounds 5] [--pg postgresql://postgres@127.0.0.1:5432/postgres]

Writes 32 radt runs x 4 GPM metrics (SMACT, SMOCC, GRACT, DRAMA) x 10,800 points into a fresh
PostgreSQL database with MLflow's schema, then times, in this one process:
- radt cold: app.data.series() for one metric of the 32 runs, flask-caching emptied first
  (PostgreSQL's own buffers are warm, as on a dashboard server that has been up for a while);
- radt cached: the same call again (what a second browser tab or a redraw costs);
- the whole explore page's four charts, cold;
- MLflow: MlflowClient.get_metric_history() per run for the same metric, straight from the database.
Prints the points per series sent to the browser and the ratios. Figures go to docs/PERFORMANCE.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from flask import Flask  # noqa: E402
from mlflow import MlflowClient  # noqa: E402
from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore  # noqa: E402

from radt.app import data  # noqa: E402
from radt.app.cache import CACHE, cache_config  # noqa: E402
from radt.app.data import spec_metric  # noqa: E402
from radt.app.figures import Panel, overlay_figure  # noqa: E402
from radt.app.state import STATE, connect_store  # noqa: E402
from radt.collectors import tracking  # noqa: E402
from radt.collectors.stores import SqlMetricStore  # noqa: E402
from radt.points import Point  # noqa: E402
from tests.support.runs import radt_run  # noqa: E402

METRICS = {"sm_active": 0.45, "sm_occupancy": 0.2, "gr_engine_active": 0.55, "dram_active": 0.25}
START = 1_760_000_000_000


def fill(uri: str, runs: int, points: int) -> tuple[str, list[str]]:
    client = MlflowClient(uri)
    experiment = tracking.resolve_experiment(client, uri, "overlay bench")
    writer = SqlMetricStore(uri)
    rng = np.random.default_rng(0)
    run_ids = []
    began = time.perf_counter()
    for i in range(runs):
        start = START + i * 60_000
        batch_size = str(64 * (1 + i % 4))
        run_id = radt_run(
            client, experiment, f"run {i:02d}", start_time=start, workload=f"w{i // 2}", letter="AB"[i % 2], script_args=["--batch-size", batch_size]
        )
        ts = start + np.arange(points) * 1000
        for name, level in METRICS.items():
            values = np.clip(level + 0.1 * np.sin(np.arange(points) / 60.0) + rng.normal(0, 0.03, points), 0, 1)
            values[rng.integers(0, points, 20)] = 0.0  # data-loader stalls: dips the chart must keep
            batch = [Point(f"system/gpu_0_{name}", float(v), int(t), s) for s, (t, v) in enumerate(zip(ts, values))]
            for part in range(0, len(batch), 20_000):
                writer.write(run_id, batch[part : part + 20_000])
        client.set_terminated(run_id, "FINISHED", end_time=int(ts[-1]) + 1000)
        run_ids.append(run_id)
    print(f"wrote {runs} runs x {len(METRICS)} metrics x {points:,} points = {runs * len(METRICS) * points:,} points in {time.perf_counter() - began:.0f} s")
    return experiment, run_ids


def timed(fn, rounds: int) -> tuple[float, object]:
    samples, result = [], None
    for _ in range(rounds):
        began = time.perf_counter()
        result = fn()
        samples.append(time.perf_counter() - began)
    return statistics.median(samples), result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=32)
    parser.add_argument("--hours", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--baseline-rounds", type=int, default=1)
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--keep", metavar="DATABASE", help="keep the filled database under this name and reuse it on the next call")
    args = parser.parse_args()
    points = int(args.hours * 3600)

    admin = sa.create_engine(args.pg, isolation_level="AUTOCOMMIT")
    database = args.keep or f"radt_bench_overlay_{int(time.time())}"
    with admin.connect() as conn:
        exists = conn.execute(sa.text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": database}).first() is not None
        if not exists:
            conn.execute(sa.text(f'CREATE DATABASE "{database}"'))
    uri = args.pg.rsplit("/", 1)[0] + "/" + database
    try:
        with tempfile.TemporaryDirectory() as tmp:
            if exists:
                client = MlflowClient(uri)
                experiment = client.get_experiment_by_name("overlay bench").experiment_id
                run_ids = [r.info.run_id for r in client.search_runs([experiment], max_results=1000) if r.data.tags.get("radt.role") != "workload"]
                print(f"reusing {database}: {len(run_ids)} runs")
            else:
                SqlAlchemyStore(uri, Path(tmp).as_uri()).engine.dispose()
                experiment, run_ids = fill(uri, args.runs, points)
                with sa.create_engine(uri).connect() as conn:
                    conn.execute(sa.text("ANALYZE"))
                    conn.commit()

            CACHE.init_app(Flask(__name__), config=cache_config("simple"))
            connect_store(uri)
            runs = data.runs([experiment])
            assert len(runs) == args.runs, len(runs)

            def cold(specs):
                def go():
                    CACHE.clear()
                    return [data.series(spec, runs) for spec in specs]

                return go

            one = ["cat:sm_active"]
            every = [f"cat:{name}" for name in METRICS]
            cold(one)()  # first connection, PostgreSQL buffers
            t_cold, result = timed(cold(one), args.rounds)
            t_cached, _ = timed(lambda: data.series("cat:sm_active", runs), args.rounds * 4)
            t_page, _ = timed(cold(every), args.rounds)
            windows = data.zoom_windows((60.0, 70.0), "relative", runs)  # minutes 60-70 of every run

            def zoomed():
                CACHE.clear()
                return data.series("cat:sm_active", runs, windows)

            t_zoom, zoom_result = timed(zoomed, args.rounds)
            zoom_points = {len(xs) for devices in zoom_result.values() for xs, _v in devices.values()}
            figure = overlay_figure([Panel(spec_metric("cat:sm_active"), result[0])], runs)
            t_figure, payload = timed(lambda: figure.to_json(), args.rounds)
            CACHE.clear()
            t_list, _ = timed(lambda: (CACHE.clear(), data.runs([experiment])), args.rounds)
            sent = [len(xs) for devices in result[0].values() for xs, _values in devices.values()]
            peaks = all(float(np.min(v)) == 0.0 for devices in result[0].values() for _x, v in devices.values())

            client = MlflowClient(uri)
            t_mlflow, history = timed(lambda: [client.get_metric_history(r, "system/gpu_0_sm_active") for r in run_ids], args.baseline_rounds)
            assert all(len(h) == points for h in history)
            STATE.engine.dispose()
    finally:
        if not args.keep:
            with admin.connect() as conn:
                conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'))
        admin.dispose()

    print(f"\n{args.runs} runs x {points:,} points, one metric (PostgreSQL, median of {args.rounds}):")
    print(f"  radt cold   (series for one chart)        {t_cold * 1000:8.0f} ms   target < 300 ms")
    print(f"  radt cached (same chart again)            {t_cached * 1000:8.1f} ms   target < 30 ms")
    print(f"  radt cold, all four charts of the page    {t_page * 1000:8.0f} ms")
    print(f"  radt cold, zoomed to minutes 60-70        {t_zoom * 1000:8.0f} ms   ({sorted(zoom_points)} raw points per run)")
    print(f"  run list of the experiment (uncached)     {t_list * 1000:8.0f} ms")
    print(f"  figure JSON of the chart (32 traces)      {len(payload) / 1e6:8.2f} MB, serialised in {t_figure * 1000:.0f} ms")
    print(f"  MLflow get_metric_history x {args.runs}            {t_mlflow * 1000:8.0f} ms")
    print(f"  points per series sent: max {max(sent):,} (budget 2,000), stall dips kept: {peaks}")
    print(f"  ratio MLflow / radt cold:   {t_mlflow / t_cold:6.1f}x")
    print(f"  ratio MLflow / radt cached: {t_mlflow / t_cached:6.0f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
