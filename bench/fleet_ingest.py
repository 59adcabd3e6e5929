"""Fleet ingest (#15): 256 radt runs writing at once into one PostgreSQL, against MLflow's `log_batch`.

Each writer is one run on an 8-GPU node: every second it samples 8 GPUs x 12 catalogue keys (96
points), so 256 writers offer about 24,600 points/s. The writers' phases are spread over the second,
as runs that started at different times are. Both sides get their own fresh database (created and
dropped here) with MLflow's schema from radt's `tracking.connect`, and the same runs from radt's
`tracking.create_run`:

  radt      one `MetricWriter(open_metric_store(uri), run_id, spool)` per run, fed one sample a
            second, exactly as collectors/run/runner.py wires it (its own engine per run), closed with
            the runner's default 60 s flush timeout
  log_batch `MlflowClient(uri).log_batch(run_id, 96 metrics, synchronous=True)` once per writer per
            second from the writer's own thread (MLflow's SqlAlchemyStore, one engine per process, its
            pool raised to two connections per writer, what one process per run would have)

The writers run as threads in a few processes (--procs, default 4). What is measured, per side:
  missing         points offered minus rows in `metrics` at the end; the end is the writers' exit
                  (radt) or 60 s after the last sample was due (MLflow: what its threads had not sent
                  by then is never sent). For radt, the spools are then replayed as `radt sync` would
                  and counted again: lost for good (target 0)
  sample->commit  seconds from a sample's timestamp to the commit of the transaction holding it,
                  p50/p99 over points (radt's writer gathers up to one flush interval, 1 s, first)
  store call      seconds one write call takes (radt: SqlMetricStore.write; MLflow: log_batch)
  PostgreSQL CPU  user+system CPU of the database's backends (psutil), as % of one core per
                  10,000 points/s; the server's WAL writer/checkpointer/bgwriter separately
  bytes/point     growth of pg_total_relation_size(metrics) + (latest_metrics) over points stored

256 runs need about 256 connections for radt (one writer engine each; a real radt also keeps its
tracking client's) and 512 for MLflow (two per log_batch). A server without that many free (the
default max_connections is 100) is refused rather than starving everyone else's connections:
--private-pg starts a throwaway cluster of this machine's PostgreSQL binaries with max_connections
to fit (other settings default), and removes it afterwards.

Run:  .venv/bin/python bench/fleet_ingest.py --private-pg              (2 min per side, 6-14 min)
      .venv/bin/python bench/fleet_ingest.py --private-pg --quick      (20 s per side)
      .venv/bin/python bench/fleet_ingest.py --private-pg --writers 64 (what two cores sustain)
      .venv/bin/python bench/fleet_ingest.py --writers 16              (the shared server on :5432)
"""

from __future__ import annotations

import argparse
import heapq
import logging
import multiprocessing as mp
import os
import queue
import random
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import psutil  # noqa: E402
import sqlalchemy as sa  # noqa: E402

from radt import catalogue  # noqa: E402
from radt.points import Point  # noqa: E402

GPU_NAMES = [name for name, m in catalogue.METRICS.items() if m.per_gpu]
FLUSH_TIMEOUT = 60.0  # the runner's default --flush-timeout
BACKGROUND = ("checkpointer", "background writer", "walwriter")


def fleet_keys(gpus: int, keys: int) -> list[str]:
    if keys > len(GPU_NAMES):
        raise SystemExit(f"radt: --keys {keys} is more than the catalogue's {len(GPU_NAMES)} per-GPU metrics; give at most that")
    return [catalogue.key(name, g) for g in range(gpus) for name in GPU_NAMES[:keys]]


# --------------------------------------------------------------------------- the writers (worker processes)


class TimedStore:
    """radt's store with the commit time of every call noted: sample->commit per sample, call duration per call."""

    def __init__(self, store, stats: dict) -> None:
        self.store, self.stats = store, stats

    def write(self, run_id: str, points) -> None:
        started = time.time()
        try:
            self.store.write(run_id, points)
        except BaseException:
            self.stats["errors"] += 1
            raise
        done = time.time()
        self.stats["calls"].append(done - started)
        for ts, n in Counter(p.timestamp for p in points).items():
            self.stats["latency"].append((done - ts / 1000, n))

    def close(self) -> None:
        self.store.close()

    def reset(self) -> None:
        self.store.reset()


def schedule(runs: list[tuple[str, float]], start: float, end: float, interval: float):
    """(sample time, run index, step) in time order: each run samples at start + phase + k * interval."""
    heap = [(start + phase, i, 0) for i, (_, phase) in enumerate(runs)]
    heapq.heapify(heap)
    while heap:
        t, i, step = heapq.heappop(heap)
        if t >= end:
            continue
        yield t, i, step
        heapq.heappush(heap, (t + interval, i, step + 1))


def sample(keys: list[str], t: float, step: int, rnd: random.Random) -> list[Point]:
    ts = int(t * 1000)
    return [Point(k, rnd.random() * 100, ts, step) for k in keys]


def radt_side(uri: str, runs, keys, interval: float, spool_dir: Path, stats: dict):
    """One MetricWriter per run on its own store, as runner.py wires them; returns the load loop."""
    from radt.collectors.store.stores import open_metric_store
    from radt.collectors.store.writer import MetricWriter

    writers = [
        MetricWriter(TimedStore(open_metric_store(uri), stats), run_id, spool_dir / run_id / "spool.jsonl", report=stats["reports"].append).start()
        for run_id, _ in runs
    ]

    def load(start: float, end: float) -> None:
        rnd = random.Random(os.getpid())
        for t, i, step in schedule(runs, start, end, interval):  # the runs' samplers: one put per run per tick
            now = time.time()
            if t > now:
                time.sleep(t - now)
            else:
                stats["lag"].append(now - t)
            points = sample(keys, t, step, rnd)
            writers[i].put(points)
            stats["sent"] += len(points)
        closing = time.time()
        closers = [threading.Thread(target=w.close, args=(FLUSH_TIMEOUT,)) for w in writers]  # each run's radt exits on its own
        for th in closers:
            th.start()
        for th in closers:
            th.join()
        stats["drain_s"] = time.time() - closing
        stats["written"] = sum(w.written for w in writers)
        stats["writer_lost"] = sum(w.lost for w in writers)
        stats["spooled_left"] = sum(w.spool.points() for w in writers if w.spool)
        for w in writers:
            w.store.close()

    return load


def mlflow_side(uri: str, runs, keys, interval: float, spool_dir: Path, stats: dict):
    """MLflow's client, one log_batch per run per second from the run's own thread; returns the load loop."""
    # one engine per process: log_batch holds two sessions at once (the run's, then _log_metrics'), so the
    # pool gets two connections per writer; SQLAlchemy's default 5 + 10 starves 64 threads into 30 s pool timeouts
    os.environ["MLFLOW_SQLALCHEMYSTORE_POOL_SIZE"] = str(2 * len(runs))
    from mlflow import MlflowClient
    from mlflow.entities import Metric

    client = MlflowClient(uri)
    client.get_run(runs[0][0])  # the store and its engine open before the clock starts
    lock = threading.Lock()

    def one_run(index: int, start: float, end: float) -> None:
        run_id, phase = runs[index]
        rnd = random.Random(index)
        step, t = 0, start + phase
        while t < end:
            if time.time() > end + FLUSH_TIMEOUT:  # the grace radt's writers get at exit: what is still due counts as not written
                with lock:
                    stats["sent"] += len(keys) * int((end - t) // interval + (1 if (end - t) % interval else 0))
                return
            now = time.time()
            if t > now:
                time.sleep(t - now)
            else:
                with lock:
                    stats["lag"].append(now - t)
            metrics = [Metric(p.key, p.value, p.timestamp, p.step) for p in sample(keys, t, step, rnd)]
            called = time.time()
            try:
                client.log_batch(run_id, metrics=metrics, synchronous=True)
            except Exception as exc:  # MLflow's monitor logs a warning and carries on: the sample is gone
                with lock:
                    stats["errors"] += 1
                    stats["reports"].append(f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}")
            else:
                done = time.time()
                with lock:
                    stats["calls"].append(done - called)
                    stats["latency"].append((done - t, len(metrics)))
            with lock:
                stats["sent"] += len(metrics)
            step, t = step + 1, t + interval

    def load(start: float, end: float) -> None:
        threads = [threading.Thread(target=one_run, args=(i, start, end), daemon=True) for i in range(len(runs))]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        stats["drain_s"] = max(0.0, time.time() - end)

    return load


def worker(side: str, uri: str, runs, keys, duration: float, interval: float, spool_dir: str, ready, go, start_at, out) -> None:
    """One process of the fleet: its share of the runs; its figures go back on `out`."""
    logging.getLogger("mlflow").setLevel(logging.ERROR)
    logging.getLogger("alembic").setLevel(logging.ERROR)
    stats = {"sent": 0, "errors": 0, "calls": [], "latency": [], "lag": [], "reports": [], "failed": False}
    try:
        setup = radt_side if side == "radt" else mlflow_side
        load = setup(uri, runs, keys, interval, Path(spool_dir), stats)
        ready.wait()
        go.wait()
        cpu0 = cpu_self()
        load(start_at.value, start_at.value + duration)
        stats["client_cpu_s"] = cpu_self() - cpu0
    except BaseException as exc:
        stats["reports"].append(f"worker failed: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:300]}")
        stats["failed"] = True
        try:
            ready.abort()
        except Exception:
            pass
    out.put(stats)


def cpu_self() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# --------------------------------------------------------------------------- the server side (this process)


class ServerWatch:
    """CPU of one database's backends (and the server's background writers), and its peak connections, polled twice a second."""

    def __init__(self, admin: sa.Engine, database: str) -> None:
        self.admin, self.database = admin, database
        self.seen: dict[int, list] = {}  # pid -> [process, cpu at first sight, cpu last seen, background?]
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _poll(self) -> None:
        with self.admin.connect() as conn:
            rows = conn.execute(sa.text("SELECT pid, datname, backend_type FROM pg_stat_activity")).all()
        ours = 0
        for pid, datname, kind in rows:
            mine = datname == self.database
            ours += mine and kind == "client backend"
            if not (mine or kind in BACKGROUND):
                continue
            entry = self.seen.get(pid)
            try:
                if entry is None:
                    proc = psutil.Process(pid)
                    cpu = sum(proc.cpu_times()[:2])
                    self.seen[pid] = [proc, cpu, cpu, kind in BACKGROUND]
                else:
                    entry[2] = sum(entry[0].cpu_times()[:2])
            except psutil.Error:
                continue
        self.peak = max(self.peak, ours)

    def _loop(self) -> None:
        while not self._stop.wait(0.5):
            try:
                self._poll()
            except Exception:  # a slow poll under load: the next one counts
                pass

    def start(self) -> ServerWatch:
        self._poll()
        self._thread.start()
        return self

    def stop(self) -> tuple[float, float]:
        """(CPU s of the database's backends, CPU s of the server's background writers) since start."""
        self._stop.set()
        self._thread.join()
        self._poll()
        backends = sum(last - first for _, first, last, bg in self.seen.values() if not bg)
        background = sum(last - first for _, first, last, bg in self.seen.values() if bg)
        return backends, background


def table_bytes(engine: sa.Engine) -> tuple[int, int]:
    with engine.connect() as conn:
        metrics = conn.execute(sa.text("SELECT pg_total_relation_size('metrics')")).scalar()
        latest = conn.execute(sa.text("SELECT pg_total_relation_size('latest_metrics')")).scalar()
    return metrics, latest


def free_connections(admin: sa.Engine) -> tuple[int, int]:
    """(connections the server still accepts for ordinary users, max_connections)."""
    with admin.connect() as conn:
        most = int(conn.execute(sa.text("SHOW max_connections")).scalar())
        reserved = int(conn.execute(sa.text("SHOW superuser_reserved_connections")).scalar())
        used = conn.execute(sa.text("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'")).scalar()
    return most - reserved - used, most


class Scratch:
    """A fresh database on the server, dropped on exit."""

    def __init__(self, admin: sa.Engine, admin_url: str, side: str) -> None:
        self.admin = admin
        self.name = f"radt_fleet_{os.getpid()}_{side}"
        self.url = admin_url.rsplit("/", 1)[0] + "/" + self.name

    def __enter__(self) -> Scratch:
        with self.admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)'))
            conn.execute(sa.text(f'CREATE DATABASE "{self.name}"'))
        return self

    def __exit__(self, *exc) -> None:
        with self.admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)'))


class PrivatePostgres:
    """A throwaway cluster of this machine's PostgreSQL (as the postgres user when run as root), with room for the fleet."""

    def __init__(self, max_connections: int) -> None:
        self.max_connections = max_connections
        found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
        if not found and not shutil.which("initdb"):
            raise SystemExit("radt: --private-pg needs PostgreSQL's initdb and pg_ctl; install the server package or give --pg")
        self.bindir = found[-1].parent if found else Path(shutil.which("initdb")).parent
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        self.dir = Path(tempfile.mkdtemp(prefix="radt-fleet-pg-"))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]

    def _run(self, *cmd: str) -> None:
        subprocess.run([*self.as_user, *cmd], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def __enter__(self) -> str:
        if self.as_user:
            shutil.chown(self.dir, "postgres")
        data = self.dir / "data"
        self._run(str(self.bindir / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust", "--no-sync")
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={self.dir} -c max_connections={self.max_connections}"
        self._run(str(self.bindir / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(self.dir / "log"), "-w", "start")
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def __exit__(self, *exc) -> None:
        try:
            self._run(str(self.bindir / "pg_ctl"), "-D", str(self.dir / "data"), "-m", "fast", "-w", "stop")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


# --------------------------------------------------------------------------- one side


def create_runs(uri: str, writers: int, interval: float, side: str) -> list[tuple[str, float]]:
    """MLflow's schema via radt's connect, then `writers` runs via radt's create_run; (run id, sampling phase) each."""
    from radt.collectors.store.tracking import NewRun, connect, create_run, resolve_experiment
    from radt.runmodel import INTERVAL_TAG

    client = connect(uri)
    experiment_id = resolve_experiment(client, uri, f"fleet-{side}")
    runs = []
    for i in range(writers):
        run_id, _ = create_run(
            client,
            experiment_id,
            NewRun(
                command=["python", "train.py"],
                script="train.py",
                script_args=[],
                run_name=f"fleet-{i:03d}",
                workload=None,
                letter="A",
                devices="0+1+2+3+4+5+6+7",
                collocation="-",
                listeners=["nvml", "host"],
                settings={INTERVAL_TAG: str(interval)},
            ),
        )
        runs.append((run_id, interval * i / writers))
    close = getattr(client, "close", None)
    if close is not None:
        close()
    return runs


def replay_spools(uri: str, spool_dir: Path) -> int:
    """What the writers left in their spools, sent the way `radt sync` does; returns points sent (duplicates included)."""
    from radt.collectors.store.stores import open_metric_store
    from radt.collectors.store.writer import Spool

    sent = 0
    store = open_metric_store(uri)
    try:
        for path in sorted(spool_dir.glob("*/spool.jsonl")):
            run_id = path.parent.name
            sent += Spool(path).replay(lambda batch, run_id=run_id: store.write(run_id, batch))
    finally:
        store.close()
    return sent


def weighted_quantile(pairs: list[tuple[float, int]], q: float) -> float:
    if not pairs:
        return float("nan")
    pairs = sorted(pairs)
    total = sum(n for _, n in pairs)
    goal, seen = q * total, 0
    for value, n in pairs:
        seen += n
        if seen >= goal:
            return value
    return pairs[-1][0]


def quantile(values: list[float], q: float) -> float:
    return weighted_quantile([(v, 1) for v in values], q)


def collect(out, timeout: float) -> dict:
    """One worker's figures; a worker that died without sending any counts as failed."""
    try:
        return out.get(timeout=timeout)
    except queue.Empty:
        return {"sent": 0, "errors": 0, "calls": [], "latency": [], "lag": [], "reports": ["worker sent no figures"], "failed": True}


def run_side(side: str, admin: sa.Engine, admin_url: str, args, keys: list[str], tmp: Path) -> dict:
    with Scratch(admin, admin_url, side) as db:
        t0 = time.time()
        runs = create_runs(db.url, args.writers, args.interval, side)
        engine = sa.create_engine(db.url)
        before = table_bytes(engine)
        print(f"  [{side}] {len(runs)} runs created in {time.time() - t0:.1f} s; starting {args.procs} processes", flush=True)
        ctx = mp.get_context("spawn")
        ready, go, start_at, out = ctx.Barrier(args.procs + 1), ctx.Event(), ctx.Value("d", 0.0), ctx.Queue()
        share = [runs[i :: args.procs] for i in range(args.procs)]
        procs = [
            ctx.Process(target=worker, args=(side, db.url, part, keys, args.duration, args.interval, str(tmp / side), ready, go, start_at, out))
            for part in share
        ]
        for p in procs:
            p.start()
        try:
            ready.wait(timeout=300)
        except Exception:
            pass  # a worker failed to set up: its report says why
        watch = ServerWatch(admin, db.name).start()
        start_at.value = time.time() + 1.0
        go.set()
        print(f"  [{side}] load for {args.duration:.0f} s ...", flush=True)
        results = [collect(out, args.duration + 1800) for _ in procs]
        wall = time.time() - start_at.value
        backend_cpu, background_cpu = watch.stop()
        for p in procs:
            p.join()
        after = table_bytes(engine)
        with engine.connect() as conn:
            stored = conn.execute(sa.text("SELECT count(*) FROM metrics")).scalar()
            latest = conn.execute(sa.text("SELECT count(*) FROM latest_metrics")).scalar()
            synced = replay_spools(db.url, tmp / side) if side == "radt" else 0
            after_sync = conn.execute(sa.text("SELECT count(*) FROM metrics")).scalar() if synced else stored
        engine.dispose()
    sent = sum(r["sent"] for r in results)
    reports = [line for r in results for line in r["reports"]]
    return {
        "side": side,
        "sent": sent,
        "stored": stored,
        "lost": sent - stored,
        "synced": synced,
        "lost_after_sync": sent - after_sync,
        "latest_rows": latest,
        "latest_expected": len(runs) * len(keys),
        "errors": sum(r["errors"] for r in results),
        "failed": any(r["failed"] for r in results),
        "reports": reports,
        "latency": [pair for r in results for pair in r["latency"]],
        "calls": [c for r in results for c in r["calls"]],
        "lag": [x for r in results for x in r["lag"]],
        "drain_s": max(r.get("drain_s", 0.0) for r in results),
        "spooled_left": sum(r.get("spooled_left", 0) for r in results),
        "writer_lost": sum(r.get("writer_lost", 0) for r in results),
        "client_cpu_s": sum(r.get("client_cpu_s", 0.0) for r in results),
        "wall_s": wall,
        "backend_cpu_s": backend_cpu,
        "background_cpu_s": background_cpu,
        "peak_connections": watch.peak,
        "bytes_metrics": after[0] - before[0],
        "bytes_latest": after[1] - before[1],
    }


# --------------------------------------------------------------------------- main


def summary(r: dict, rate: float) -> dict:
    """The figures of one side, in the units the report uses."""
    per_10k = 10_000 / rate if rate else float("nan")  # how many of this load's units make 10,000 points/s
    return {
        "p50": weighted_quantile(r["latency"], 0.50),
        "p99": weighted_quantile(r["latency"], 0.99),
        "max": max((v for v, _ in r["latency"]), default=float("nan")),
        "call_p50": quantile(r["calls"], 0.50),
        "call_p99": quantile(r["calls"], 0.99),
        "pg_core": r["backend_cpu_s"] / r["wall_s"] * per_10k * 100,  # % of one core per 10,000 points/s
        "bg_core": r["background_cpu_s"] / r["wall_s"] * per_10k * 100,
        "client_core": r["client_cpu_s"] / r["wall_s"] * per_10k * 100,
        "bytes": (r["bytes_metrics"] + r["bytes_latest"]) / r["stored"] if r["stored"] else float("nan"),
        "bytes_metrics": r["bytes_metrics"] / r["stored"] if r["stored"] else float("nan"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument(
        "--pg", default=os.environ.get("RADT_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres"), help="admin URL of a PostgreSQL server"
    )
    parser.add_argument("--private-pg", action="store_true", help="start a throwaway PostgreSQL cluster with room for the fleet instead of --pg")
    parser.add_argument("--writers", type=int, default=256, help="concurrent runs (default 256)")
    parser.add_argument("--gpus", type=int, default=8, help="GPUs per run (default 8)")
    parser.add_argument("--keys", type=int, default=12, help="metric keys per GPU (default 12)")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between a run's samples (default 1)")
    parser.add_argument("--minutes", type=float, default=2.0, help="load per side, minutes (default 2)")
    parser.add_argument("--procs", type=int, default=4, help="processes the writers are spread over (default 4)")
    parser.add_argument("--sides", default="radt,mlflow", help="which sides, in order (default radt,mlflow)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 20 s per side")
    args = parser.parse_args()
    args.duration = 20.0 if args.quick else args.minutes * 60
    sides = [s.strip() for s in args.sides.split(",")]
    if any(s not in ("radt", "mlflow") for s in sides) or args.writers < 1 or args.procs < 1:
        print("radt: --sides takes radt and/or mlflow, --writers and --procs at least 1; see --help", file=sys.stderr)
        return 2
    args.procs = min(args.procs, args.writers)
    keys = fleet_keys(args.gpus, args.keys)
    logging.getLogger("mlflow").setLevel(logging.ERROR)
    logging.getLogger("alembic").setLevel(logging.ERROR)
    rate = args.writers * len(keys) / args.interval
    # radt: one writer engine per run; MLflow: two connections per writer (see mlflow_side)
    need = max(args.writers if "radt" in sides else 0, 2 * args.writers if "mlflow" in sides else 0) + 5

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the cleanup below (scratch databases, a private cluster) runs
    tmp = Path(tempfile.mkdtemp(prefix="radt-bench-fleet-"))
    private = PrivatePostgres(need + 50) if args.private_pg else None
    results = []
    try:
        admin_url = private.__enter__() if private else args.pg
        admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT", pool_size=1, connect_args={"connect_timeout": 5})
        try:
            free, most = free_connections(admin)
        except sa.exc.OperationalError as exc:
            print(f"radt: cannot reach PostgreSQL at {admin_url} ({str(exc.orig).strip().splitlines()[0]}); start it or give --pg", file=sys.stderr)
            return 2
        if free - need < 20 and not private:  # leave others on a shared server their connections
            print(
                f"radt: {args.writers} writers need about {need} connections and the server at {admin_url} has {free} free "
                f"(max_connections {most}); give --private-pg, fewer --writers, or a server with max_connections >= {need + most - free + 20}",
                file=sys.stderr,
            )
            return 2
        print(
            f"fleet: {args.writers} writers x {args.gpus} GPUs x {args.keys} keys every {args.interval:g} s = {rate:,.0f} points/s offered, "
            f"{args.duration:.0f} s per side, {args.procs} processes; server {admin_url.rsplit('@', 1)[-1]} (max_connections {most})",
            flush=True,
        )
        for side in sides:
            results.append(run_side(side, admin, admin_url, args, keys, tmp))
        admin.dispose()
    finally:
        if private:
            private.__exit__(None, None, None)
        shutil.rmtree(tmp, ignore_errors=True)

    print()
    print(
        f"fleet ingest, {args.writers} runs x {len(keys)} points every {args.interval:g} s ({rate:,.0f} points/s offered), {args.duration:.0f} s per side; "
        f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}"
    )
    head = f"{'side':<7} {'sent':>9} {'stored':>9} {'missing':>8} {'stored/s':>8} {'p50 s':>6} {'p99 s':>6} {'max s':>6} {'call p50':>8} {'call p99':>8} {'PG %core/10k':>12} {'bytes/pt':>8}"
    print(head)
    print("-" * len(head))
    figures = {}
    for r in results:
        f = figures[r["side"]] = summary(r, r["stored"] / r["wall_s"] if r["wall_s"] else 0)
        print(
            f"{r['side']:<7} {r['sent']:>9,} {r['stored']:>9,} {r['lost']:>8,} {r['stored'] / r['wall_s']:>8,.0f} {f['p50']:>6.2f} {f['p99']:>6.2f} {f['max']:>6.2f} "
            f"{f['call_p50']:>8.3f} {f['call_p99']:>8.3f} {f['pg_core']:>12.1f} {f['bytes']:>8.1f}"
        )
    for r in results:
        f = figures[r["side"]]
        lag = quantile(r["lag"], 0.99) if r["lag"] else 0.0
        print(
            f"  {r['side']}: store errors {r['errors']}, peak connections {r['peak_connections']}, drain after the last sample {r['drain_s']:.1f} s, "
            f"latest_metrics {r['latest_rows']:,}/{r['latest_expected']:,} rows, server background {f['bg_core']:.1f} %core/10k, "
            f"client {f['client_core']:.1f} %core/10k, metrics table alone {f['bytes_metrics']:.1f} bytes/pt, "
            f"late samples {len(r['lag'])} (p99 {lag:.2f} s)"
            + (
                f", writer lost {r['writer_lost']:,}, left in spools {r['spooled_left']:,} (sent afterwards as `radt sync` would: "
                f"{r['synced']:,}; missing after that {r['lost_after_sync']:,})"
                if r["side"] == "radt"
                else ""
            )
        )
        for line in sorted(set(r["reports"]))[:5]:
            print(f"    {r['side']} said: {line}")
    if "radt" in figures:
        r = next(x for x in results if x["side"] == "radt")
        f = figures["radt"]
        ok = r["lost_after_sync"] == 0 and f["call_p99"] < 1.0 and not r["failed"]
        print(
            f"target: 0 lost, p99 write < 1 s -> missing at exit {r['lost']:,}, after replaying the spools {r['lost_after_sync']:,}; "
            f"store call p99 {f['call_p99']:.3f} s, sample->commit p99 {f['p99']:.2f} s ({'MET' if ok else 'NOT MET'} for the store call)"
        )
    if "radt" in figures and "mlflow" in figures:
        a, b = figures["radt"], figures["mlflow"]
        for name, label in (
            ("p99", "sample->commit p99"),
            ("call_p99", "store call p99"),
            ("pg_core", "PostgreSQL CPU per point"),
            ("bytes", "bytes per point"),
        ):
            print(f"RATIO radt / log_batch {label} = {a[name] / b[name]:.2f}x")
    return 0 if not any(r["failed"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
