"""Ingest speed into MLflow's tables: radt's bulk path (`SqlMetricStore.write`) vs MLflow's own client.

Every contender writes the same kind of data, 20 metric keys per sample, one sample per second
of run time, into its own fresh run of a scratch store (a scratch PostgreSQL database, created
and dropped by this script, and a temporary SQLite file):

  radt bulk N        `SqlMetricStore(uri).write(run_id, points)` with N points per call, the way
                     radt's writer flushes (20 points a second live; up to 20,000 when it catches up),
                     each batch folded into radt's rollups in the same transaction
  no rollups N       `SqlMetricStore(uri, fold_rollups=False)`: the same call writing MLflow's rows only,
                     so "radt bulk N / no rollups N" is what the rollups cost
  log_batch 1000     `MlflowClient.log_batch` with 1,000 metrics per call (MLflow's limit)
  log_batch 20       `MlflowClient.log_batch` with one sample (20 metrics) per call
  log_metrics 20     fluent `mlflow.log_metrics({20 keys}, run_id=..., synchronous=True)` per sample

Rounds alternate the contenders (A B C ... A B C ...) against noise; the table gives the median
points/s over the rounds (and the best), the ratio lines divide radt's bulk figure by each
baseline. The baselines are slow (a few thousand points/s), so they get fewer points.

Beside points/s, each bulk round records the CPU it cost per point: this process's, and on PostgreSQL the
server's (its processes on this machine, from /proc). On a shared machine the wall-clock ratio of two
rounds moves by ±15 %; CPU time moves far less, and it is what throughput costs on a machine of its own,
so the ROLLUPS-CPU lines give the rollups' share of it next to the points/s ratios.

With --profile, one more pass of each bulk size times the phases of `write` (the metrics insert, the
latest_metrics SELECT, the rollup upsert, the series-state reads and writes) by wrapping radt's functions.

After the timing, a sanity check writes the same 2,000 points once through the bulk path and
once through `log_batch` and compares `get_metric_history` and the run's latest metric values.

Run:  .venv/bin/python bench/ingest.py             (about 10 minutes at load 4)
      .venv/bin/python bench/ingest.py --quick     (a smoke run, ~1 min)
      .venv/bin/python bench/ingest.py --stores postgresql --profile
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import mlflow  # noqa: E402
import sqlalchemy as sa  # noqa: E402
from mlflow.entities import Metric  # noqa: E402

from radt import rollups  # noqa: E402
from radt.collectors.store.stores import SqlMetricStore  # noqa: E402
from radt.points import Point  # noqa: E402

KEYS = [f"system/bench_metric_{i:02d}" for i in range(20)]
T0 = 1_763_000_000_000  # ms; a fixed start so every run's timestamps are alike


def samples(n: int, offset: int = 0) -> list[list[Point]]:
    """n samples of 20 points each, one second apart, steps counting samples."""
    rnd = random.Random(offset)
    return [[Point(k, rnd.random() * 100, T0 + (offset + i) * 1000, offset + i) for k in KEYS] for i in range(n)]


def chunks(points: list[Point], size: int) -> list[list[Point]]:
    return [points[i : i + size] for i in range(0, len(points), size)]


# --------------------------------------------------------------------------- contenders


def bench_bulk(uri: str, client: mlflow.MlflowClient, stores: dict[str, SqlMetricStore], total: int, batch: int) -> tuple[int, float]:
    return _bulk(client, stores["rollups"], total, batch)


def bench_plain(uri: str, client: mlflow.MlflowClient, stores: dict[str, SqlMetricStore], total: int, batch: int) -> tuple[int, float]:
    return _bulk(client, stores["plain"], total, batch)


CPU: dict[str, list[tuple[float, float]]] = {}  # contender -> per round (this process's, the database server's) CPU µs per point


def server_cpu() -> float | None:
    """CPU seconds used so far by this machine's PostgreSQL processes (None: none visible, e.g. a remote server or SQLite)."""
    total, seen = 0, False
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            head, tail = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)
        except (OSError, ValueError):
            continue
        if head.split("(", 1)[1].startswith("postgres"):
            fields = tail.split()
            total, seen = total + int(fields[11]) + int(fields[12]), True  # utime + stime, in clock ticks
    return total / os.sysconf("SC_CLK_TCK") if seen else None


def _bulk(client: mlflow.MlflowClient, store: SqlMetricStore, total: int, batch: int) -> tuple[int, float]:
    run_id = client.create_run("0").info.run_id
    flat = [p for s in samples(total // len(KEYS)) for p in s]
    batches = chunks(flat, batch)
    server = server_cpu() if store.engine.dialect.name == "postgresql" else None
    c0, t0 = time.process_time(), time.perf_counter()
    for b in batches:
        store.write(run_id, b)
    secs = time.perf_counter() - t0
    after = server_cpu() if server is not None else None
    name = f"{'radt bulk' if store.fold_rollups else 'no rollups'} {batch}"
    CPU.setdefault(name, []).append(((time.process_time() - c0) / len(flat) * 1e6, (after - server) / len(flat) * 1e6 if after is not None else math.nan))
    return len(flat), secs


def bench_log_batch(uri: str, client: mlflow.MlflowClient, stores, total: int, batch: int) -> tuple[int, float]:
    run_id = client.create_run("0").info.run_id
    flat = [Metric(p.key, p.value, p.timestamp, p.step) for s in samples(total // len(KEYS)) for p in s]
    batches = chunks(flat, batch)
    t0 = time.perf_counter()
    for b in batches:
        client.log_batch(run_id, metrics=b, synchronous=True)
    return len(flat), time.perf_counter() - t0


def bench_log_metrics(uri: str, client: mlflow.MlflowClient, stores, total: int, batch: int) -> tuple[int, float]:
    run_id = client.create_run("0").info.run_id
    mlflow.set_tracking_uri(uri)
    rows = samples(total // len(KEYS))
    t0 = time.perf_counter()
    for sample in rows:
        mlflow.log_metrics({p.key: p.value for p in sample}, step=sample[0].step, timestamp=sample[0].timestamp, run_id=run_id, synchronous=True)
    return len(rows) * len(KEYS), time.perf_counter() - t0


# --------------------------------------------------------------------------- stores


def init_schema(uri: str, artifacts: Path) -> None:
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    SqlAlchemyStore(uri, artifacts.as_uri()).engine.dispose()


class PgScratch:
    """A scratch PostgreSQL database, dropped on exit."""

    def __init__(self, admin_url: str) -> None:
        self.admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 5})
        self.name = f"radt_bench_ingest_{os.getpid()}"
        self.url = admin_url.rsplit("/", 1)[0] + "/" + self.name

    def __enter__(self) -> str:
        with self.admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{self.name}"'))
            conn.execute(sa.text(f'CREATE DATABASE "{self.name}"'))
        return self.url

    def __exit__(self, *exc) -> None:
        with self.admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)'))
        self.admin.dispose()


def sanity_check(uri: str, client: mlflow.MlflowClient, store: SqlMetricStore) -> str:
    """The bulk path's rows read back through MLflow exactly like log_batch's."""
    points = [p for s in samples(100, offset=7) for p in s]
    points[5] = points[5]._replace(value=float("nan"))  # MLflow's NaN rule is part of the contract
    bulk_run = client.create_run("0").info.run_id
    ref_run = client.create_run("0").info.run_id
    for b in chunks(points, 1000):
        store.write(bulk_run, b)
        client.log_batch(ref_run, metrics=[Metric(p.key, p.value, p.timestamp, p.step) for p in b], synchronous=True)
    key = points[5].key

    def history(run_id):
        return sorted((m.timestamp, m.step, m.value if m.value == m.value else "nan") for m in client.get_metric_history(run_id, key))

    mine, theirs = history(bulk_run), history(ref_run)
    latest_mine = {k: v for k, v in client.get_run(bulk_run).data.metrics.items()}
    latest_theirs = {k: v for k, v in client.get_run(ref_run).data.metrics.items()}
    same_latest = latest_mine.keys() == latest_theirs.keys() and all(
        (latest_mine[k] == latest_theirs[k]) or (latest_mine[k] != latest_mine[k] and latest_theirs[k] != latest_theirs[k]) for k in latest_mine
    )
    expected = sorted((p.timestamp, p.step, p.value if p.value == p.value else "nan") for p in points if p.key == key)
    ok = mine == theirs == expected and same_latest
    return (
        f"sanity: get_metric_history('{key}') -> {len(mine)} points via bulk, {len(theirs)} via log_batch, "
        f"identical={mine == theirs}, equal to what was written={mine == expected}; latest_metrics identical={same_latest} "
        f"({len(latest_mine)} keys) -> {'OK' if ok else 'MISMATCH'}"
    )


# --------------------------------------------------------------------------- PostgreSQL write strategies


def pg_alternatives(uri: str, points: int, rounds: int) -> list[tuple[str, float, float]]:
    """Other ways to put the same rows into `metrics` (no latest_metrics upsert): how far the driver,
    and how far the server, limit the bulk path. Returns (strategy, median points/s, client CPU s per 100k)."""
    client = mlflow.MlflowClient(uri)
    engine = sa.create_engine(uri)
    columns = "key, value, timestamp, step, is_nan, run_uuid"

    def raw_cursor(conn):
        return conn.connection.driver_connection.cursor()

    def executemany(conn, run_id, b):
        with raw_cursor(conn) as cur:
            cur.executemany(
                f"INSERT INTO metrics ({columns}) VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                [(p.key, p.value, p.timestamp, p.step, False, run_id) for p in b],
            )

    def unnest(conn, run_id, b):
        with raw_cursor(conn) as cur:
            cur.execute(
                f"INSERT INTO metrics ({columns}) SELECT k, v, t, s, n, %s "
                "FROM unnest(%s::text[], %s::float8[], %s::bigint[], %s::bigint[], %s::bool[]) AS u(k, v, t, s, n) ON CONFLICT DO NOTHING",
                (run_id, [p.key for p in b], [p.value for p in b], [p.timestamp for p in b], [p.step for p in b], [False] * len(b)),
            )

    def copy(conn, run_id, b):
        with raw_cursor(conn) as cur:
            cur.execute("CREATE TEMP TABLE IF NOT EXISTS bench_in (key text, value float8, timestamp bigint, step bigint, is_nan bool) ON COMMIT DELETE ROWS")
            with cur.copy("COPY bench_in FROM STDIN") as cp:
                for p in b:
                    cp.write_row((p.key, p.value, p.timestamp, p.step, False))
            cur.execute(f"INSERT INTO metrics ({columns}) SELECT key, value, timestamp, step, is_nan, %s FROM bench_in ON CONFLICT DO NOTHING", (run_id,))

    flat = [p for s in samples(points // len(KEYS)) for p in s]
    out = []
    for name, fn in (
        ("psycopg executemany, one INSERT per row", executemany),
        ("one INSERT ... SELECT unnest(arrays)", unnest),
        ("COPY to temp table + INSERT ... SELECT", copy),
    ):
        rates, cpus = [], []
        for _ in range(rounds):
            run_id = client.create_run("0").info.run_id
            c0, t0 = time.process_time(), time.perf_counter()
            for b in chunks(flat, 20000):
                with engine.begin() as conn:
                    fn(conn, run_id, b)
            rates.append(len(flat) / (time.perf_counter() - t0))
            cpus.append((time.process_time() - c0) / len(flat) * 100_000)
        out.append((name, statistics.median(rates), statistics.median(cpus)))
        print(f"  [postgresql alternatives] {name:<42} {statistics.median(rates):>10,.0f} points/s", flush=True)
    engine.dispose()
    return out


# --------------------------------------------------------------------------- where the rollups' cost goes

PHASES = (  # (owner, attribute, label): radt's functions that SqlMetricStore.write calls, timed inclusively
    (SqlMetricStore, "write", "write, whole call"),
    (SqlMetricStore, "_insert_metrics", "  metrics insert (one INSERT, or COPY + INSERT ... SELECT)"),
    (SqlMetricStore, "_copy_metrics", "    COPY into the staging table"),
    (rollups, "lock_run", "  advisory lock of the run"),
    (rollups, "latest_and_covered", "  latest_metrics + radt_rollup_series SELECT (before)"),
    (rollups, "fold_batch", "  fold_batch"),
    (rollups, "rows_of_points", "    bucketing (numpy, rows_of_points)"),
    (rollups, "upsert", "    radt_rollups upsert"),
    (rollups, "_set_covered", "    radt_rollup_series upsert"),
)


@contextlib.contextmanager
def phase_timers():
    """Wrap PHASES in timers for the duration; yields label -> [seconds, calls]."""
    spent: dict[str, list] = {}
    saved = []
    for owner, name, label in PHASES:
        original = getattr(owner, name, None)
        if original is None:  # an older or newer write path without this step
            continue
        spent[label] = [0.0, 0]

        def timed_call(*args, _original=original, _slot=spent[label], **kwargs):
            began = time.perf_counter()
            try:
                return _original(*args, **kwargs)
            finally:
                _slot[0] += time.perf_counter() - began
                _slot[1] += 1

        saved.append((owner, name, original))
        setattr(owner, name, timed_call)
    try:
        yield spent
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)


def profile(client: mlflow.MlflowClient, stores: dict[str, SqlMetricStore], sizes: dict[int, int]) -> list[str]:
    """One timed pass per batch size (size -> points) and store kind; lines of ms per 100,000 points by phase."""
    lines = []
    for size, total in sizes.items():
        for kind in ("plain", "rollups"):
            with phase_timers() as spent:
                n, secs = _bulk(client, stores[kind], total, size)
            lines.append(f"{'radt bulk' if kind == 'rollups' else 'no rollups'} {size}: {n / secs:,.0f} points/s; ms per 100,000 points by phase:")
            for label, (seconds, calls) in spent.items():
                if calls:
                    lines.append(f"    {label:<46} {seconds / n * 1e8:8.0f} ms  ({calls} calls)")
    return lines


# --------------------------------------------------------------------------- main


def run_store(label: str, uri: str, plan: list[tuple[str, object, int, int]], rounds: int, profile_sizes: dict[int, int]) -> tuple[dict, str, list]:
    client = mlflow.MlflowClient(uri)
    stores = {"rollups": SqlMetricStore(uri), "plain": SqlMetricStore(uri, fold_rollups=False)}
    results: dict[str, list[float]] = {name: [] for name, *_ in plan}
    sizes: dict[str, int] = {}
    try:
        for r in range(rounds):
            for name, fn, total, batch in plan:
                n, secs = fn(uri, client, stores, total, batch)
                if name in CPU:  # a bulk contender: its CPU, by store
                    CPU.setdefault(f"{label} {name}", []).append(CPU.pop(name)[-1])
                results[name].append(n / secs)
                sizes[name] = n
                print(f"  [{label} round {r + 1}/{rounds}] {name:<18} {n:>7} points in {secs:7.3f} s = {n / secs:>10,.0f} points/s", flush=True)
        check = sanity_check(uri, client, stores["rollups"])
        phases = profile(client, stores, profile_sizes) if profile_sizes else []
    finally:
        for store in stores.values():
            store.close()
    return {name: (sizes[name], vals) for name, vals in results.items()}, check, phases


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument(
        "--pg", default=os.environ.get("RADT_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres"), help="admin URL of a PostgreSQL server"
    )
    parser.add_argument("--bulk-points", type=int, default=200_000, help="points per bulk round per batch size (default 200,000)")
    parser.add_argument("--bulk-batches", default="20,1000,5000,20000", help="bulk batch sizes in points (default 20,1000,5000,20000)")
    parser.add_argument("--batch-points", type=int, default=20_000, help="points per log_batch-1000 round (default 20,000)")
    parser.add_argument("--small-points", type=int, default=4_000, help="points per 20-metric-call round, bulk 20 included (default 4,000)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    parser.add_argument("--stores", default="postgresql,sqlite", help="which stores (default postgresql,sqlite)")
    parser.add_argument("--quick", action="store_true", help="smoke run: fewer points, one round")
    parser.add_argument("--profile", action="store_true", help="after the rounds, time the phases of write() per bulk size, with and without rollups")
    parser.add_argument(
        "--pg-alternatives",
        action="store_true",
        help="also time other ways to insert the same rows into PostgreSQL (raw executemany, unnest arrays, COPY); metrics table only",
    )
    args = parser.parse_args()
    if args.quick:
        args.bulk_points, args.batch_points, args.small_points, args.rounds = 40_000, 4_000, 1_000, 1
    logging.getLogger("mlflow").setLevel(logging.ERROR)
    logging.getLogger("alembic").setLevel(logging.ERROR)

    plan = []
    for size in [int(s) for s in args.bulk_batches.split(",")]:
        total = args.small_points if size <= 100 else args.bulk_points
        plan.append((f"radt bulk {size}", bench_bulk, total, size))
        plan.append((f"no rollups {size}", bench_plain, total, size))
    plan += [
        ("log_batch 1000", bench_log_batch, args.batch_points, 1000),
        ("log_batch 20", bench_log_batch, args.small_points, 20),
        ("log_metrics 20", bench_log_metrics, args.small_points, 20),
    ]

    profile_sizes = {batch: total for name, _fn, total, batch in plan if name.startswith("radt bulk")} if args.profile else {}
    tmp = Path(tempfile.mkdtemp(prefix="radt-bench-ingest-"))
    tables = {}
    alternatives = []
    try:
        for label in [s.strip() for s in args.stores.split(",")]:
            print(f"{label}:", flush=True)
            if label == "postgresql":
                with PgScratch(args.pg) as uri:
                    init_schema(uri, tmp / "pg-artifacts")
                    tables[label] = run_store(label, uri, plan, args.rounds, profile_sizes)
                    if args.pg_alternatives:
                        alternatives = pg_alternatives(uri, min(args.bulk_points, 80_000), args.rounds)
            elif label == "sqlite":
                uri = f"sqlite:///{tmp / 'bench.db'}"
                init_schema(uri, tmp / "sqlite-artifacts")
                tables[label] = run_store(label, uri, plan, args.rounds, profile_sizes)
            else:
                raise SystemExit(f"unknown store {label}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    print()
    print(f"ingest, 20 keys per sample, {args.rounds} alternating round(s); {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
    for label, (results, check, phases) in tables.items():
        print()
        print(f"{label:<12} {'contender':<18} {'points':>8} {'median pts/s':>13} {'best pts/s':>11}")
        print("-" * 68)
        medians = {}
        for name, (n, vals) in results.items():
            medians[name] = statistics.median(vals)
            print(f"{'':<12} {name:<18} {n:>8} {medians[name]:>13,.0f} {max(vals):>11,.0f}")
        print(check)
        for name in [n for n in medians if n.startswith("radt bulk")]:
            baseline = name.replace("radt bulk", "no rollups")
            plain = medians[baseline]
            # each round's pair ran back to back: the median of the pairs' ratios is steadier than the ratio of medians
            paired = statistics.median(1 - a / b for a, b in zip(results[name][1], results[baseline][1], strict=True))
            print(
                f"ROLLUPS {label} {name} / no rollups = {medians[name] / plain:.3f} (rollups cost {1 - medians[name] / plain:.1%} of throughput, "
                f"{paired:.1%} as the median of the rounds' pairs; target < 10 %)"
            )
            cpu = {n: CPU.get(f"{label} {n}") for n in (name, baseline)}
            if all(cpu.values()):
                mine, server = (statistics.median(c[i] for c in cpu[name]) for i in (0, 1))
                plain_mine, plain_server = (statistics.median(c[i] for c in cpu[baseline]) for i in (0, 1))
                if math.isnan(server):
                    print(
                        f"ROLLUPS-CPU {label} {name}: {mine:.2f} µs per point in radt's process, {plain_mine:.2f} without rollups ({1 - plain_mine / mine:.1%} of it is theirs)"
                    )
                else:
                    both, plain_both = mine + server, plain_mine + plain_server
                    print(
                        f"ROLLUPS-CPU {label} {name}: {both:.2f} µs CPU per point (radt {mine:.2f} + PostgreSQL {server:.2f}), "
                        f"{plain_both:.2f} without rollups (radt {plain_mine:.2f} + PostgreSQL {plain_server:.2f}): rollups cost {1 - plain_both / both:.1%} of the CPU"
                    )
        if phases:
            print(f"profile, {label}:")
            print("\n".join(phases))
        bulk_names = [n for n in medians if n.startswith("radt bulk") and int(n.split()[-1]) >= 1000]
        best_bulk = max(bulk_names, key=medians.get)
        for name in bulk_names:
            print(f"RATIO {label} {name} / log_batch 1000 = {medians[name] / medians['log_batch 1000']:.1f}x")
        print(f"RATIO {label} {best_bulk} / log_batch 20 = {medians[best_bulk] / medians['log_batch 20']:.1f}x")
        print(f"RATIO {label} {best_bulk} / log_metrics 20 = {medians[best_bulk] / medians['log_metrics 20']:.1f}x")
        if "radt bulk 20" in medians:
            print(f"RATIO {label} radt bulk 20 / log_batch 20 = {medians['radt bulk 20'] / medians['log_batch 20']:.1f}x (one sample per call both)")
        if label == "postgresql":
            worst = min(medians[n] for n in bulk_names)
            verdict = "MET" if worst >= 50_000 else ("floor of 35,000 met" if worst >= 35_000 else "NOT MET")
            print(
                f"target: >= 50,000 points/s (35,000 at least) into PostgreSQL from one process, rollups folded -> {worst:,.0f} "
                f"(slowest batch size >= 1000) .. {medians[best_bulk]:,.0f} ({verdict})"
            )
    if alternatives:
        print()
        print("postgresql, other insert strategies for the same rows (20,000 per transaction, metrics table only, no latest_metrics upsert):")
        for name, rate, cpu in alternatives:
            print(f"  {name:<42} {rate:>10,.0f} points/s   client CPU {cpu:.2f} s per 100k points")
        radt_best = max(v for k, v in ((k, statistics.median(vals)) for k, (n, vals) in tables["postgresql"][0].items()) if k.startswith("radt bulk"))
        for name, rate, _ in alternatives:
            print(f"RATIO postgresql {name} / best radt bulk = {rate / radt_best:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
