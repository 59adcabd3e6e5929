"""Overlay query at any run length: the data of dashboard charts through radt's rollups, the raw scan and MLflow, side by side.

    .venv/bin/python bench/overlay_query.py                          # 32 x 3 h, 64 x 12 h, 256 x 24 h at 1 Hz
    .venv/bin/python bench/overlay_query.py --sizes 32x3 --rounds 5  # one size (RUNSxHOURS, or RUNSxHOURSxMETRICS)
    .venv/bin/python bench/overlay_query.py --huge                   # 1,000 x 24 h, one metric (86 M points), once

For each size, a fresh PostgreSQL database with MLflow's schema gets RUNS radt runs (tracking.create_run, as
`radt train.py` makes them) of up to 4 GPM metrics (SMACT, SMOCC, GRACT, DRAMA) at 1 Hz with 20 stall dips
per series. The fill is fast and says so: the raw points go into MLflow's `metrics` with one binary COPY
(FREEZE) with the table's indexes and constraints dropped and rebuilt after it, `latest_metrics` gets each
series' last point, and the rollups are radt's own (rollups.bucket_rows over the same arrays, COPYed into the
empty radt_rollups, series marked covered as the writer leaves them); a check rebuilds one run from its raw
points with rollups.rebuild_run and compares.
Then, in this one process, through the dashboard's own entry point (app.view.data.series, which reads through
app.db.series and its rollup path), called as app.view.views.render calls it: shape="envelope" and the page's point
budget per series, app.view.views.series_budget(SCREEN_BUDGET, runs) (2,000 up to 75 runs, then a share, >= 200):
- rollups cold: one chart, flask-caching emptied first; PostgreSQL's buffers and the OS page cache as the fill
  and the previous calls left them (warm for the smaller sizes; the first draw after the fill printed apart);
- rollups cached: the same chart again;
- the page's four charts cold (sizes with 4 metrics);
- the raw path: the same calls with app.db.series.USE_ROLLUPS = False (the scan of every raw point);
- MLflow: MlflowClient.get_metric_history for the first --mlflow-runs runs, extrapolated to all of them.
Figures go to docs/PERFORMANCE.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import NamedTuple

import numpy as np
import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from flask import Flask  # noqa: E402
from mlflow import MlflowClient  # noqa: E402
from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore  # noqa: E402

from radt import mlflowdb, rollups  # noqa: E402
from radt.app.db import series as app_series  # noqa: E402
from radt.app.db.downsample import ENVELOPE_POINTS, Envelope  # noqa: E402
from radt.app.db.state import STATE, connect_store  # noqa: E402
from radt.app.view import data  # noqa: E402
from radt.app.view.cache import CACHE, cache_config  # noqa: E402
from radt.app.view.views import SCREEN_BUDGET, series_budget  # noqa: E402
from radt.collectors.store import tracking  # noqa: E402
from tests.support.runs import radt_run  # noqa: E402

METRICS = {"sm_active": 0.45, "sm_occupancy": 0.2, "gr_engine_active": 0.55, "dram_active": 0.25}
START = 1_760_000_000_000
SIZES = "32x3,64x12,256x24"
HUGE = "1000x24x1"
TEMPLATES = 8  # runs made by tracking.create_run; the others are copies of them (clone_runs)
BYTES_PER_POINT = 230  # heap + MLflow's three indexes on metrics, measured on this schema (PostgreSQL 15)
COPY_SIGNATURE = b"PGCOPY\n\xff\r\n\x00" + b"\x00" * 8
COPY_TRAILER = b"\xff\xff"


def timed(fn, rounds: int) -> tuple[float, object]:
    samples, result = [], None
    for _ in range(rounds):
        began = time.perf_counter()
        result = fn()
        samples.append(time.perf_counter() - began)
    return statistics.median(samples), result


class Size(NamedTuple):
    runs: int
    hours: float
    metrics: int

    @property
    def points(self) -> int:
        return int(self.hours * 3600)

    @property
    def label(self) -> str:
        return f"{self.runs} x {self.hours:g} h"


def parse_size(text: str) -> Size:
    parts = text.lower().split("x")
    return Size(int(parts[0]), float(parts[1]), int(parts[2]) if len(parts) > 2 else len(METRICS))


# --------------------------------------------------------------------------- filling


def series_values(rng: np.random.Generator, level: float, points: int) -> np.ndarray:
    values = np.clip(level + 0.1 * np.sin(np.arange(points) / 60.0) + rng.normal(0, 0.03, points), 0, 1)
    values[rng.integers(0, points, 20)] = 0.0  # data-loader stalls: dips the chart must keep
    return values


def copy_block(run_id: str, key: str, ts: np.ndarray, values: np.ndarray) -> bytes:
    """One series as tuples of PostgreSQL's binary COPY format, columns (key, value, timestamp, step, is_nan, run_uuid)."""
    k, r = key.encode(), run_id.encode()
    layout = np.dtype(
        [
            ("fields", ">i2"),
            ("lk", ">i4"),
            ("key", f"S{len(k)}"),
            ("lv", ">i4"),
            ("value", ">f8"),
            ("lt", ">i4"),
            ("timestamp", ">i8"),
            ("ls", ">i4"),
            ("step", ">i8"),
            ("ln", ">i4"),
            ("is_nan", "u1"),
            ("lr", ">i4"),
            ("run", f"S{len(r)}"),
        ]
    )
    block = np.empty(len(ts), dtype=layout)
    block["fields"] = 6
    block["lk"], block["key"] = len(k), k
    block["lv"], block["value"] = 8, values
    block["lt"], block["timestamp"] = 8, ts
    block["ls"], block["step"] = 8, np.arange(len(ts))
    block["ln"], block["is_nan"] = 1, 0
    block["lr"], block["run"] = len(r), r
    return block.tobytes()


def copy_rollups(conn: sa.Connection, rows: list[dict]) -> int:
    """COPY a run's rollup rows straight into the fresh radt_rollups (rollups.upsert merges into stored rows; none are stored yet)."""
    columns = ", ".join(f'"{c}"' for c in rollups.COLUMNS)
    with conn.connection.driver_connection.cursor() as cur, cur.copy(f"COPY radt_rollups ({columns}) FROM STDIN") as copy:
        for row in rows:
            copy.write_row(tuple(row[c] for c in rollups.COLUMNS))
    return len(rows)


def _metrics_ddl(conn: sa.Connection) -> tuple[list[str], list[str]]:
    """(constraints as ALTER TABLE ... ADD, CREATE INDEX statements) of MLflow's metrics table, as the store has them."""
    constraints = conn.execute(
        sa.text("SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = 'metrics'::regclass AND contype IN ('p', 'f')")
    ).all()
    indexes = conn.execute(
        sa.text(
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'metrics' AND indexname NOT IN "
            "(SELECT conname FROM pg_constraint WHERE conrelid = 'metrics'::regclass)"
        )
    ).all()
    return [f'ALTER TABLE metrics ADD CONSTRAINT "{name}" {ddl}' for name, ddl in constraints], [ddl for _name, ddl in indexes]


def clone_runs(engine: sa.Engine, templates: list[str], starts: list[int]) -> list[str]:
    """More runs like the templates (every row of every table keyed by run_uuid copied, new id and start time):
    tracking.create_run takes ~1.5 s a run here, and 1,000 runs would take 25 minutes."""
    if not starts:
        return []
    clones = [(uuid.uuid4().hex, templates[i % len(templates)], start) for i, start in enumerate(starts)]
    pairs = [{"new": new, "old": old, "start": start} for new, old, start in clones]
    with engine.begin() as conn:
        tables = conn.execute(
            sa.text(
                "SELECT table_name FROM information_schema.columns WHERE column_name = 'run_uuid' AND table_schema = current_schema() "
                "AND table_name NOT IN ('runs', 'metrics', 'latest_metrics', 'radt_rollups', 'radt_rollup_series')"
            )
        ).scalars()
        columns = ", ".join(f'"{c.name}"' for c in mlflowdb.runs.columns if c.name not in ("run_uuid", "start_time"))
        conn.execute(sa.text(f"INSERT INTO runs (run_uuid, start_time, {columns}) SELECT :new, :start, {columns} FROM runs WHERE run_uuid = :old"), pairs)
        for table in list(tables):
            names = ", ".join(f'"{c["name"]}"' for c in sa.inspect(conn).get_columns(table) if c["name"] != "run_uuid")
            conn.execute(sa.text(f'INSERT INTO "{table}" (run_uuid, {names}) SELECT :new, {names} FROM "{table}" WHERE run_uuid = :old'), pairs)
    return [new for new, _old, _start in clones]


def fill(uri: str, size: Size) -> tuple[str, list[str], dict[str, float]]:
    """RUNS radt runs of size.metrics metrics; (experiment id, run ids, seconds per fill step)."""
    spent: dict[str, float] = {}
    keys = [f"system/gpu_0_{name}" for name in list(METRICS)[: size.metrics]]
    began = time.perf_counter()
    client = MlflowClient(uri)
    experiment = tracking.resolve_experiment(client, uri, "overlay bench")
    starts = [START + i * 60_000 for i in range(size.runs)]
    templates = [
        radt_run(
            client, experiment, f"run {i:03d}", start_time=start, workload=f"w{i // 2}", letter="AB"[i % 2], script_args=["--batch-size", str(64 * (1 + i % 4))]
        )
        for i, start in enumerate(starts[:TEMPLATES])
    ]
    engine = sa.create_engine(uri)
    run_ids = templates + clone_runs(engine, templates, starts[TEMPLATES:])
    with engine.begin() as conn:
        conn.execute(
            sa.update(mlflowdb.runs)
            .where(mlflowdb.runs.c.run_uuid.in_(run_ids))
            .values(status="FINISHED", end_time=mlflowdb.runs.c.start_time + size.points * 1000)
        )
    spent["runs (tracking.create_run)"] = time.perf_counter() - began

    began = time.perf_counter()
    rng = np.random.default_rng(0)
    latest, rollup_rows, covered = [], 0, []
    rollups.ensure_table(engine)
    with engine.begin() as conn, engine.begin() as side:  # side: the rollups, while conn is busy with the COPY
        constraints, indexes = _metrics_ddl(conn)
        for statement in constraints:
            conn.execute(sa.text(f'ALTER TABLE metrics DROP CONSTRAINT "{statement.split(chr(34))[1]}"'))
        for statement in indexes:
            conn.execute(sa.text(f'DROP INDEX "{statement.split()[2]}"'))
        conn.execute(sa.text("TRUNCATE metrics"))
        raw = conn.connection.driver_connection
        bucketing = 0.0
        with raw.cursor() as cur, cur.copy("COPY metrics (key, value, timestamp, step, is_nan, run_uuid) FROM STDIN (FORMAT BINARY, FREEZE)") as copy:
            copy.write(COPY_SIGNATURE)
            for run_id, start in zip(run_ids, starts, strict=True):
                ts = start + np.arange(size.points, dtype=np.int64) * 1000
                rows = []
                for key, level in zip(keys, METRICS.values(), strict=False):
                    values = series_values(rng, level, size.points)
                    copy.write(copy_block(run_id, key, ts, values))
                    b0 = time.perf_counter()
                    rows.extend(rollups.bucket_rows(run_id, key, ts, np.arange(size.points), values))
                    bucketing += time.perf_counter() - b0
                    last = (size.points - 1, int(ts[-1]), float(values[-1]), False)
                    latest.append({"run_uuid": run_id, "key": key, "step": last[0], "timestamp": last[1], "value": last[2], "is_nan": False})
                    covered.append(
                        {"run_uuid": run_id, "key": key, "latest_step": last[0], "latest_ms": last[1], "latest_value": last[2], "latest_is_nan": False}
                    )
                b0 = time.perf_counter()
                rollup_rows += copy_rollups(side, rows)
                bucketing += time.perf_counter() - b0
            copy.write(COPY_TRAILER)
        spent["raw points (binary COPY FREEZE, no indexes)"] = time.perf_counter() - began - bucketing
        spent["rollups (bucket_rows + COPY)"] = bucketing
        began = time.perf_counter()
        conn.execute(sa.text("SET LOCAL maintenance_work_mem = '1GB'"))
        for statement in constraints + indexes:
            conn.execute(sa.text(statement))
        spent["MLflow's metrics indexes and keys rebuilt"] = time.perf_counter() - began
        began = time.perf_counter()
        conn.execute(sa.insert(mlflowdb.latest_metrics), latest)
        side.execute(sa.insert(rollups.series_state), covered)
        spent["latest_metrics and radt_rollup_series"] = time.perf_counter() - began
    began = time.perf_counter()
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text("VACUUM ANALYZE"))
    spent["VACUUM ANALYZE"] = time.perf_counter() - began
    with engine.connect() as conn:
        for key in keys:
            assert not rollups.stale(conn, run_ids, key), "the fill left stale series: the first draw would rebuild them"
    check_rollups(engine, run_ids[0])
    engine.dispose()
    total = size.runs * len(keys) * size.points
    print(f"  filled {size.runs} runs x {len(keys)} metrics x {size.points:,} points = {total:,} points, {rollup_rows:,} rollup rows:")
    for step, seconds in spent.items():
        print(f"    {step:<48} {seconds:8.1f} s")
    print(f"    {'all':<48} {sum(spent.values()):8.1f} s  ({total / sum(spent.values()):,.0f} points/s)")
    return experiment, run_ids, spent


def check_rollups(engine: sa.Engine, run_id: str) -> None:
    """The fill's rollups of one run equal what rollups.rebuild_run makes of its raw points (then rolled back)."""
    r = rollups.rollups
    query = sa.select(r).where(r.c.run_uuid == run_id).order_by(r.c.key, r.c.resolution_s, r.c.bucket_ms)
    with engine.connect() as conn:
        filled = conn.execute(query).all()
        rollups.rebuild_run(conn, run_id)
        rebuilt = conn.execute(query).all()
        conn.rollback()
    same = len(filled) == len(rebuilt) and all(
        a[:4] == b[:4] and all(x == y or (isinstance(x, float) and abs(x - y) <= 1e-9 * max(1.0, abs(y))) for x, y in zip(a[4:], b[4:], strict=True))
        for a, b in zip(filled, rebuilt, strict=True)
    )
    assert same, f"the fill's rollups differ from rollups.rebuild_run's for run {run_id}"


# --------------------------------------------------------------------------- measuring


def ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f}"


def set_rollups(on: bool) -> bool:
    """Switch the dashboard's read path (app.db.series.USE_ROLLUPS); False where this radt has no such switch."""
    if not hasattr(app_series, "USE_ROLLUPS"):
        return False
    app_series.USE_ROLLUPS = on
    return True


class Result(NamedTuple):
    size: Size
    fill_s: float
    first: float
    cold: float
    cached: float
    page: float | None
    raw: float | None
    raw_page: float | None
    mlflow: float
    mlflow_runs: int
    budget: int
    sent: int
    dips: bool
    raw_sent: int | None
    figure_mb: float


def drawn(series) -> int:
    """Points a series puts on the page: an Envelope's mean line and band edges, or its points."""
    return len(series.x) * ENVELOPE_POINTS if isinstance(series, Envelope) else len(series[0])


def lowest(series) -> float:
    """The lowest value drawn (an Envelope's band floor): 0.0 where the stall dips survived."""
    return float(np.nanmin(series.low if isinstance(series, Envelope) else series[1]))


def measure(uri: str, size: Size, experiment: str, run_ids: list[str], fill_s: float, args) -> Result:
    connect_store(uri)
    runs = data.runs([experiment])
    assert len(runs) == size.runs, len(runs)
    specs = [f"cat:{name}" for name in list(METRICS)[: size.metrics]]
    switch = set_rollups(True)
    budget = series_budget(SCREEN_BUDGET, len(runs))  # what app.view.views.render gives each series of this chart

    def draw(spec):
        return data.series(spec, runs, budget=budget, shape="envelope")

    def cold(wanted):
        def go():
            CACHE.clear()
            return [draw(spec) for spec in wanted]

        return go

    first, _ = timed(cold(specs[:1]), 1)  # the first draw after the fill: connections, buffers
    t_cold, result = timed(cold(specs[:1]), args.rounds)
    t_cached, _ = timed(lambda: draw(specs[0]), args.rounds * 4)
    t_page = timed(cold(specs), args.rounds)[0] if len(specs) == len(METRICS) else None
    sent = max(drawn(s) for devices in result[0].values() for s in devices.values())
    dips = all(lowest(s) == 0.0 for devices in result[0].values() for s in devices.values())
    from radt.app.figures.figures import Panel, overlay_figure
    from radt.app.view.data import spec_metric

    figure_mb = len(overlay_figure([Panel(spec_metric(specs[0]), result[0])], runs).to_json()) / 1e6
    print(
        f"  rollups: first {ms(first)} ms, cold {ms(t_cold)} ms, cached {t_cached * 1000:.1f} ms, page {ms(t_page)} ms",
        flush=True,
    )

    t_raw = t_raw_page = raw_sent = None
    if switch:
        set_rollups(False)
        raw_rounds = args.raw_rounds or (3 if size.runs * size.points <= 3_000_000 else 1)
        t_raw, raw_result = timed(cold(specs[:1]), raw_rounds)
        raw_sent = max(drawn(s) for devices in raw_result[0].values() for s in devices.values())
        if len(specs) == len(METRICS) and not args.no_raw_page:
            t_raw_page = timed(cold(specs), 1)[0]
        set_rollups(True)
        print(f"  raw: one chart {ms(t_raw)} ms, page {ms(t_raw_page)} ms", flush=True)
    else:
        print("  raw path: app.db.series.USE_ROLLUPS is not there yet; not measured", flush=True)
    STATE.engine.dispose()

    client = MlflowClient(uri)
    some = run_ids[: args.mlflow_runs]
    t_some, history = timed(lambda: [client.get_metric_history(r, "system/gpu_0_sm_active") for r in some], 1)
    assert all(len(h) == size.points for h in history)
    t_mlflow = t_some * size.runs / len(some)
    print(f"  MLflow get_metric_history: {len(some)} runs in {t_some * 1000:.0f} ms -> {t_mlflow:.1f} s for {size.runs}", flush=True)
    return Result(size, fill_s, first, t_cold, t_cached, t_page, t_raw, t_raw_page, t_mlflow, len(some), budget, sent, dips, raw_sent, figure_mb)


def run_size(args, size: Size) -> Result:
    admin = sa.create_engine(args.pg, isolation_level="AUTOCOMMIT")
    database = f"radt_bench_overlay_{size.runs}x{size.hours:g}_{os.getpid()}".replace(".", "_")
    uri = args.pg.rsplit("/", 1)[0] + "/" + database
    need = size.runs * size.metrics * size.points * BYTES_PER_POINT
    free = shutil.disk_usage("/").free
    if need * 1.5 > free:
        raise SystemExit(f"{size.label}: needs ~{need / 1e9:.0f} GB on /, {free / 1e9:.0f} GB free; free some space or pick a smaller size")
    print(f"{size.label}, {size.metrics} metric(s) at 1 Hz (~{need / 1e9:.1f} GB of {free / 1e9:.0f} GB free on /), load {os.getloadavg()[0]:.2f}:", flush=True)
    with admin.connect() as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'))
        conn.execute(sa.text(f'CREATE DATABASE "{database}"'))
    try:
        with tempfile.TemporaryDirectory() as tmp:
            SqlAlchemyStore(uri, Path(tmp).as_uri()).engine.dispose()
            experiment, run_ids, spent = fill(uri, size)
            return measure(uri, size, experiment, run_ids, sum(spent.values()), args)
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'))
        admin.dispose()


def report(results: list[Result], rounds: int) -> None:
    print(f"\noverlay query, one metric per chart, PostgreSQL; medians of {rounds} (raw: of 1-3); load {os.getloadavg()[0]:.2f}")
    print(
        f"{'size':<14} {'points/metric':>13} {'fill':>7} {'first':>7} {'cold':>7} {'cached':>7} {'4 charts':>9} {'raw':>8} {'raw 4':>8} {'MLflow':>9} {'budget':>6} {'sent':>6} dips"
    )
    for r in results:
        print(
            f"{r.size.label:<14} {r.size.runs * r.size.points:>13,} {r.fill_s:>6.0f}s {ms(r.first):>7} {ms(r.cold):>7} {r.cached * 1000:>7.1f} {ms(r.page):>9} "
            f"{ms(r.raw):>8} {ms(r.raw_page):>8} {r.mlflow:>8.1f}s {r.budget:>6} {r.sent:>6} {r.dips}"
        )
    for r in results:
        verdict = "MET" if r.cold < 0.3 and (r.page is None or r.page < 1.0) else "NOT MET"
        line = f"{r.size.label}: one chart cold {ms(r.cold)} ms (< 300), 4 charts {ms(r.page)} ms (< 1000): {verdict}"
        if r.raw:
            line += f"; raw / rollups {r.raw / r.cold:.1f}x"
        line += f"; MLflow / rollups {r.mlflow / r.cold:.0f}x (MLflow from {r.mlflow_runs} runs); figure {r.figure_mb:.2f} MB"
        print(line)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--sizes", default=SIZES, help=f"RUNSxHOURS[xMETRICS], comma-separated (default {SIZES}; METRICS 1-4, default 4)")
    parser.add_argument("--huge", action="store_true", help=f"only {HUGE}: 1,000 runs x 24 h, one metric (86 M points, ~20 GB on / while it runs)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--raw-rounds", type=int, default=0, help="rounds of the raw path (default 3 up to 3 M points per metric, else 1)")
    parser.add_argument("--no-raw-page", action="store_true", help="skip the raw path's four charts")
    parser.add_argument("--mlflow-runs", type=int, default=4, help="runs MLflow's get_metric_history reads; extrapolated to all")
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/postgres")
    args = parser.parse_args()
    sizes = [parse_size(HUGE)] if args.huge else [parse_size(s) for s in args.sizes.split(",")]
    CACHE.init_app(Flask(__name__), config=cache_config("simple"))
    results = [run_size(args, size) for size in sizes]
    report(results, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
