"""Diagnosing many stored runs: radt's diagnosis (rollups) against the means of every raw point of the same series.

    .venv/bin/python bench/diagnose_many.py [--runs 1000] [--seconds 600] [--pg postgresql://postgres@127.0.0.1:5432/postgres | --no-pg]

Fills a fresh SQLite store (and a fresh PostgreSQL database) with RUNS ended runs as radt records them: 1 or 2 GPUs
(an H100 80GB each, in radt.gpus), each GPU's 9 series the diagnosis reads, the host's and the run's CPU, at 1 Hz for
SECONDS, written through radt's writer (SqlMetricStore.write: raw points, latest_metrics and rollups), in five loads so
the findings vary (busy pair, a pair with one idle GPU, input starved, small kernels, fp32). Then times side by side in
this one process:
- raw means (the baseline): every raw point of those series read from MLflow's `metrics` (250 runs a query) and each
  run's per-key mean computed with numpy: the least a diagnosis from raw points pays;
- radt diagnoses: collectors.diagnose.stored.diagnoses(engine, run_ids), read-only (radt/evidence.py: 10-second rollups);
- radt diagnose+store: diagnose_and_store(client, run_ids), what `radt diagnose` runs, the tags written through radt's client;
- `radt diagnose --store URI --experiment NAME` end to end (a subprocess: its wall time, imports and printing included).
Every statement any engine of this process sends is counted, and those naming MLflow's raw `metrics` table: radt's must
be 0 with the rollups fresh (#54: diagnosing 1,000 stored runs reads no raw point twice). Prints runs/s and each ratio
radt / raw means. Figures go to docs/PERFORMANCE.md.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import sqlalchemy as sa

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from mlflow import MlflowClient  # noqa: E402
from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore  # noqa: E402

from radt import catalogue, mlflowdb  # noqa: E402
from radt.catalogue import MetricName  # noqa: E402
from radt.collectors.diagnose.stored import diagnose_and_store, diagnoses  # noqa: E402
from radt.collectors.store.sqltracking import make_engine  # noqa: E402
from radt.collectors.store.stores import SqlMetricStore  # noqa: E402
from radt.collectors.store.tracking import connect  # noqa: E402
from radt.points import Point  # noqa: E402
from radt.runmodel import COLLOCATION_TAG, COMMAND_TAG, GPUS_TAG, ROLE_TAG, RUN_NAME_TAG, RUN_ROLE, USER_TAG  # noqa: E402

EXPERIMENT = "diagnose bench"
START = 1_760_000_000_000  # a multiple of 10 s: a run's seconds fall into the rollups' 10-second buckets as its loads do
MODEL, MEMORY_MB = "NVIDIA H100 80GB HBM3", 85_520  # what NVML says of an H100 SXM (MLflow's MB of 10^6 bytes)
GPU_SERIES = (
    MetricName.SM_ACTIVE,
    MetricName.SM_OCCUPANCY,
    MetricName.GR_ENGINE_ACTIVE,
    MetricName.DRAM_ACTIVE,
    MetricName.TENSOR_ACTIVE,
    MetricName.UTILIZATION_PERCENTAGE,
    MetricName.MEMORY_USAGE_MEGABYTES,
    MetricName.PROCESS_MEMORY_MEGABYTES,
    MetricName.POWER_USAGE_WATTS,
)
# load -> GPUs, the working GPU's (SMACT, GRACT, SMOCC, DRAM, tensor, memory MB), (host CPU %, the run's CPU % of one core)
LOADS = {
    "busy pair": (2, (0.75, 0.85, 0.35, 0.30, 0.25, 70_000), (35.0, 150.0)),
    "one idle of two": (2, (0.70, 0.80, 0.35, 0.30, 0.20, 60_000), (30.0, 120.0)),
    "starved": (1, (0.80, 0.85, 0.35, 0.25, 0.25, 40_000), (95.0, 110.0)),
    "small kernels": (1, (0.10, 0.70, 0.30, 0.08, 0.05, 9_000), (20.0, 60.0)),
    "fp32": (1, (0.60, 0.75, 0.30, 0.35, 0.0, 30_000), (25.0, 80.0)),
}
RAW_CHUNK = 250  # runs per baseline query, as radt/evidence.py reads its buckets
RAW_TABLE = re.compile(r'(?<![\w."])"?metrics"?(?![\w"])')  # MLflow's raw table; not latest_metrics, not a column


class Statements:
    """The statements every engine of this process sends while counting, and those naming MLflow's raw `metrics` table."""

    def __init__(self) -> None:
        self.on = False
        self.total = self.raw = 0
        sa.event.listen(sa.engine.Engine, "before_cursor_execute", self._seen)

    def _seen(self, _conn, _cursor, statement: str, _parameters, _context, _executemany) -> None:
        if self.on:
            self.total += 1
            self.raw += bool(RAW_TABLE.search(statement))

    @contextmanager
    def counting(self) -> Iterator[Statements]:
        self.total = self.raw = 0
        self.on = True
        try:
            yield self
        finally:
            self.on = False


def load_of(i: int) -> str:
    return list(LOADS)[i % len(LOADS)]


def gpu_series(load: str, idle: bool, seconds: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """One GPU's 9 series over the run: its load's levels with noise; an idle GPU shows nothing but its own 500 MB."""
    if idle:
        zeros = np.zeros(seconds)
        out = dict.fromkeys(GPU_SERIES, zeros)
        return out | {MetricName.MEMORY_USAGE_MEGABYTES: np.full(seconds, 500.0), MetricName.POWER_USAGE_WATTS: 70 + rng.normal(0, 1, seconds)}
    smact, gract, smocc, dram, tensor, memory = LOADS[load][1]
    scale = rng.uniform(0.9, 1.1)
    busy = np.ones(seconds)
    if load == "starved":  # every other 10-second window waits its first 5 s for the next batch
        t = np.arange(seconds)
        busy = np.where((t // 10) % 2 == 0, (t % 10 >= 5).astype(float), 1.0)

    def around(level: float) -> np.ndarray:
        return np.clip(level * scale * (1 + rng.normal(0, 0.05, seconds)), 0, 1) * busy

    sm = around(smact)
    used = memory * scale + rng.normal(0, 50, seconds)
    return {
        MetricName.SM_ACTIVE: sm,
        MetricName.SM_OCCUPANCY: around(smocc),
        MetricName.GR_ENGINE_ACTIVE: around(gract),
        MetricName.DRAM_ACTIVE: around(dram),
        MetricName.TENSOR_ACTIVE: around(tensor),
        MetricName.UTILIZATION_PERCENTAGE: np.clip(around(gract) * 115, 0, 100),
        MetricName.MEMORY_USAGE_MEGABYTES: used,
        MetricName.PROCESS_MEMORY_MEGABYTES: used - 400,
        MetricName.POWER_USAGE_WATTS: 90 + 500 * sm,
    }


def run_points(i: int, t0: int, seconds: int, rng: np.random.Generator) -> list[Point]:
    """Run i's points: each of its GPUs' 9 series and the 2 CPU series at 1 Hz."""
    load = load_of(i)
    gpus, _levels, (host, own) = LOADS[load]
    series = {}
    for gpu in range(gpus):
        idle = load == "one idle of two" and gpu == 1
        series |= {catalogue.key(name, gpu): values for name, values in gpu_series(load, idle, seconds, rng).items()}
    series[catalogue.key(MetricName.CPU_UTILIZATION_PERCENTAGE)] = np.clip(host + rng.normal(0, 2, seconds), 0, 100)
    series[catalogue.key(MetricName.PROCESS_CPU_UTILIZATION_PERCENTAGE)] = np.maximum(own + rng.normal(0, 5, seconds), 0)
    stamps = [t0 + s * 1000 for s in range(seconds)]
    return [Point(key, value, stamps[s], s) for key, values in series.items() for s, value in enumerate(values.tolist())]


def run_tags(i: int) -> dict[str, str]:
    """The tags the diagnosis reads of a tracked run: its GPUs (model, size), user, command, collocation."""
    load = load_of(i)
    gpus = [{"series": f"gpu_{g}", "index": g, "name": MODEL, "memory_total_mb": MEMORY_MB} for g in range(LOADS[load][0])]
    return {
        RUN_NAME_TAG: f"run {i}",
        ROLE_TAG: RUN_ROLE,
        USER_TAG: f"user{i % 7}",
        COMMAND_TAG: f"python train.py --load '{load}'",
        COLLOCATION_TAG: "-",
        GPUS_TAG: json.dumps(gpus),
    }


def insert_runs(uri: str, runs: int, seconds: int) -> tuple[list[str], list[int]]:
    """RUNS ended runs and their tags, inserted in bulk; (run ids, start ms)."""
    experiment = int(MlflowClient(uri).create_experiment(EXPERIMENT))
    ids = [uuid.uuid4().hex for _ in range(runs)]
    starts = [START + i * 10_000 for i in range(runs)]
    rows, tags = [], []
    for i, (run_id, start) in enumerate(zip(ids, starts, strict=True)):
        rows.append(
            {
                "run_uuid": run_id,
                "name": f"run {i}",
                "source_type": "LOCAL",
                "source_name": "",
                "entry_point_name": "",
                "user_id": f"user{i % 7}",
                "status": "FINISHED",
                "start_time": start,
                "end_time": start + seconds * 1000,
                "source_version": "",
                "lifecycle_stage": "active",
                "artifact_uri": f"/tmp/artifacts/{run_id}",
                "experiment_id": experiment,
            }
        )
        tags += [{"run_uuid": run_id, "key": k, "value": v} for k, v in run_tags(i).items()]
    engine = sa.create_engine(uri)
    with engine.begin() as conn:
        for part in range(0, len(rows), 5_000):
            conn.execute(mlflowdb.runs.insert(), rows[part : part + 5_000])
        for part in range(0, len(tags), 5_000):
            conn.execute(mlflowdb.tags.insert(), tags[part : part + 5_000])
    engine.dispose()
    return ids, starts


def fill(uri: str, runs: int, seconds: int) -> tuple[list[str], list[str]]:
    """The runs, each one write of all its points through radt's writer; (run ids, every series key)."""
    ids, starts = insert_runs(uri, runs, seconds)
    rng = np.random.default_rng(0)
    writer = SqlMetricStore(uri)
    began, total, keys = time.perf_counter(), 0, set()
    for i, (run_id, t0) in enumerate(zip(ids, starts, strict=True)):
        points = run_points(i, t0, seconds, rng)
        writer.write(run_id, points)
        total += len(points)
        keys |= {p.key for p in points[::seconds]}
    writer.close()
    pairs = sum(LOADS[load_of(i)][0] == 2 for i in range(runs))
    print(f"  filled {runs:,} runs ({pairs:,} with 2 GPUs) x {seconds} s at 1 Hz = {total:,} points in {time.perf_counter() - began:.1f} s", flush=True)
    return ids, sorted(keys)


def raw_means(uri: str, run_ids: Sequence[str], keys: Sequence[str]) -> tuple[int, int]:
    """The baseline: every raw point of the series read, each run's per-key mean with numpy; (points read, means)."""
    engine = sa.create_engine(uri)
    m = mlflowdb.metrics.c
    points = means = 0
    with engine.connect() as conn:
        for part in range(0, len(run_ids), RAW_CHUNK):
            query = sa.select(m.run_uuid, m.key, m.value).where(m.run_uuid.in_(run_ids[part : part + RAW_CHUNK]), m.key.in_(keys), m.is_nan == sa.false())
            rows = conn.execute(query).all()
            index: dict[tuple[str, str], int] = {}
            codes = np.fromiter((index.setdefault((r, k), len(index)) for r, k, _v in rows), np.int64, len(rows))
            values = np.fromiter((v for _r, _k, v in rows), np.float64, len(rows))
            found = np.bincount(codes, values) / np.bincount(codes)
            points, means = points + len(rows), means + len(found)
    engine.dispose()
    return points, means


def timed(statements: Statements, work: Callable[[], object]) -> tuple[float, object, int, int]:
    """(seconds, what `work` returned, statements sent, those naming `metrics`)."""
    with statements.counting() as seen:
        began = time.perf_counter()
        out = work()
        took = time.perf_counter() - began
    return took, out, seen.total, seen.raw


def command(uri: str) -> tuple[float, str]:
    """`radt diagnose --store URI --experiment NAME` as a user runs it; (wall seconds, its last stderr line)."""
    args = [sys.executable, "-m", "radt", "diagnose", "--store", uri, "--experiment", EXPERIMENT]
    began = time.perf_counter()
    done = subprocess.run(args, cwd=REPO, capture_output=True, text=True, check=False)
    took = time.perf_counter() - began
    if done.returncode:
        raise SystemExit(f"radt diagnose failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    return took, (done.stderr.strip().splitlines() or [""])[-1]


def findings_by_load(run_ids: Sequence[str], found: dict) -> list[str]:
    """'load: code n, ...' lines: the findings vary with the load, as they must for the diagnosis to be exercised."""
    by_load: dict[str, Counter] = {}
    for i, run_id in enumerate(run_ids):
        by_load.setdefault(load_of(i), Counter()).update(found[run_id].codes or ["nothing"])
    return [f"    {load:16} {', '.join(f'{code} {n}' for code, n in sorted(c.items()))}" for load, c in by_load.items()]


def measure(label: str, uri: str, args: argparse.Namespace, statements: Statements) -> bool:
    """Fill, then time every path; True when radt read no raw point."""
    print(f"{label}:", flush=True)
    run_ids, keys = fill(uri, args.runs, args.seconds)
    n = len(run_ids)
    t_raw, (points, means), s_raw, r_raw = timed(statements, lambda: raw_means(uri, run_ids, keys))
    print(f"  raw means            {t_raw:8.2f} s  ({points:,} points, {means:,} means, {n / t_raw:7.1f} runs/s; {s_raw:,} statements, {r_raw:,} on `metrics`)")
    engine = make_engine(uri)
    t_read, (found, _figures), s_read, r_read = timed(statements, lambda: diagnoses(engine, run_ids))
    engine.dispose()
    print(f"  radt diagnoses       {t_read:8.2f} s  ({len(found):,} runs, {n / t_read:7.1f} runs/s; {s_read:,} statements, {r_read:,} on `metrics`)")
    client = connect(uri)
    t_store, stored, s_store, r_store = timed(statements, lambda: diagnose_and_store(client, run_ids))
    client.close()
    print(f"  radt diagnose+store  {t_store:8.2f} s  ({len(stored):,} runs, {n / t_store:7.1f} runs/s; {s_store:,} statements, {r_store:,} on `metrics`)")
    t_cli, said = command(uri)
    print(f"  radt diagnose (CLI)  {t_cli:8.2f} s  wall ({n / t_cli:7.1f} runs/s; it said: {said})")
    print("  findings by load:")
    print("\n".join(findings_by_load(run_ids, found)))
    same = all(stored[r].codes == found[r].codes for r in run_ids)
    print(f"  diagnoses = diagnose+store's findings: {same}")
    for name, took in (("diagnoses", t_read), ("diagnose+store", t_store), ("CLI", t_cli)):
        print(f"  {name + ' / raw means':26} {took / t_raw:6.2f} x")
    clean = r_read == 0 and r_store == 0
    print(f"  raw `metrics` statements from radt: {r_read + r_store} ({'met: none' if clean else 'NOT MET: must be 0 with fresh rollups'})")
    return clean and same


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--seconds", type=int, default=600, help="each run's length at 1 Hz")
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--no-pg", action="store_true", help="SQLite only")
    args = parser.parse_args()
    statements = Statements()
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        uri = f"sqlite:///{tmp}/bench.db"
        SqlAlchemyStore(uri, Path(tmp).as_uri()).engine.dispose()
        ok &= measure("SQLite", uri, args, statements)
        if not args.no_pg:
            admin = sa.create_engine(args.pg, isolation_level="AUTOCOMMIT")
            database = f"radt_bench_diagnose_{int(time.time())}"
            with admin.connect() as conn:
                conn.execute(sa.text(f'CREATE DATABASE "{database}"'))
            pg = args.pg.rsplit("/", 1)[0] + "/" + database
            try:
                SqlAlchemyStore(pg, Path(tmp).as_uri()).engine.dispose()
                ok &= measure("PostgreSQL", pg, args, statements)
            finally:
                with admin.connect() as conn:
                    conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'))
                admin.dispose()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
