"""Rollups must equal a direct computation from the raw points however the points arrive, keep every dip and
spike exact, and leave MLflow's store as MLflow reads it."""

from __future__ import annotations

import math
import random
import threading

import numpy as np
import pytest
import sqlalchemy as sa
from mlflow import MlflowClient
from mlflow.entities import Metric

from radt import rollups
from radt.cli import main as radt_main
from radt.collectors.recovery.sync import replay_spool
from radt.collectors.store.sqltracking import make_engine
from radt.collectors.store.stores import MAX_FLOAT, SqlMetricStore
from radt.collectors.store.writer import Spool
from radt.points import Point
from radt.rundir import SPOOL_FILE
from tests.support.rollupcheck import assert_rollups_cover_raw, assert_same, direct, stored

pytestmark = pytest.mark.dialects  # the SQL radt issues differs per dialect: SQLite and the real PostgreSQL

BASE = 1_700_000_000_000


def random_series(rng: random.Random, key: str, n: int) -> list[Point]:
    """A 1 Hz series with gaps (minutes without points), NaNs, duplicate timestamps, a spike and a one-sample dip."""
    points, t = [], BASE + rng.randrange(0, 10_000)
    for step in range(1, n + 1):
        t += 1000 if rng.random() > 0.01 else rng.randrange(60_000, 900_000)  # a gap
        value = 50 + 10 * rng.gauss(0, 1)
        if rng.random() < 0.03:
            value = float("nan")
        points.append(Point(key, value, t, step))
        if rng.random() < 0.01:  # the same timestamp and step twice, another value
            points.append(Point(key, value + 1 if not math.isnan(value) else 1.0, t, step))
    points[n // 3] = Point(key, -1000.0, points[n // 3].timestamp, points[n // 3].step)  # a stall dip
    points[n // 2] = Point(key, 1e6, points[n // 2].timestamp, points[n // 2].step)  # a spike
    return points


def deliveries(rng: random.Random, points: list[Point], batches: int) -> list[list[Point]]:
    """The points cut into batches delivered out of order, with late points moved into later batches."""
    cut = sorted(rng.sample(range(1, len(points)), batches - 1))
    parts = [points[a:b] for a, b in zip([0, *cut], [*cut, len(points)], strict=True)]
    rng.shuffle(parts)
    late = [p for part in parts for p in part if rng.random() < 0.02]
    lateset = {id(p) for p in late}
    parts = [[p for p in part if id(p) not in lateset] for part in parts]
    parts[-1].extend(late)
    for part in parts:
        rng.shuffle(part)
    return [part for part in parts if part]


def _run(client: MlflowClient, name: str) -> str:
    return client.create_run(client.create_experiment(name)).info.run_id


def test_bucket_rows_match_direct_computation():
    rng = random.Random(1)
    points = random_series(rng, "k", 5000) + [Point("k", float("inf"), BASE + 7, 1), Point("k", -float("inf"), BASE + 8, 2)]
    clamped = [Point(p.key, max(-MAX_FLOAT, min(MAX_FLOAT, p.value)), p.timestamp, p.step) for p in points]
    got = {(r["run_uuid"], r["key"], r["resolution_s"], r["bucket_ms"]): r for r in rollups.rows_of_points("r", clamped)}
    assert_same({pk: {c: r[c] for c in rollups.VALUE_COLUMNS} for pk, r in got.items()}, direct("r", points))


def test_merging_any_split_equals_one_computation():
    rng = random.Random(2)
    points = random_series(rng, "k", 3000)
    whole = {(r["resolution_s"], r["bucket_ms"]): r for r in rollups.rows_of_points("r", points)}
    merged: dict = {}
    for part in deliveries(rng, points, 7):
        for row in rollups.rows_of_points("r", part):
            pk = (row["resolution_s"], row["bucket_ms"])
            merged[pk] = rollups.merge_row(merged[pk], row) if pk in merged else row
    assert merged.keys() == whole.keys()
    for pk, row in whole.items():
        assert {**merged[pk], "sum": 0} == {**row, "sum": 0}
        assert merged[pk]["sum"] == (None if row["sum"] is None else pytest.approx(row["sum"], rel=1e-12))


def test_upserts_of_late_out_of_order_batches_equal_direct_computation(store_uri):
    """Batch by batch through the SQL merge (ON CONFLICT DO UPDATE), as the writer will, on SQLite and PostgreSQL."""
    rng = random.Random(3)
    run_id = _run(MlflowClient(store_uri), "upserts")
    series = random_series(rng, "system/gpu_0_sm_active", 4000) + random_series(rng, "system/gpu_0_power_usage_watts", 2500)
    engine = make_engine(store_uri)
    rollups.ensure_table(engine)
    rollups.ensure_table(engine)  # a second call finds it
    for batch in deliveries(rng, series, 9):
        with engine.begin() as conn:
            rollups.add_points(conn, run_id, batch)
    engine.dispose()
    assert_same(stored(store_uri, run_id), direct(run_id, series))


def test_envelopes_are_exact_and_keep_a_single_sample_dip(store_uri):
    rng = random.Random(4)
    run_id = _run(MlflowClient(store_uri), "envelope")
    points = [Point("k", 80 + rng.random(), BASE + i * 1000, i) for i in range(3600)]
    dip = points[1234] = Point("k", 0.5, points[1234].timestamp, 1234)  # one sample of a stall
    spike = points[2345] = Point("k", 500.0, points[2345].timestamp, 2345)
    engine = make_engine(store_uri)
    rollups.ensure_table(engine)
    with engine.begin() as conn:
        rollups.add_points(conn, run_id, points)
    engine.dispose()
    rows = stored(store_uri, run_id)
    for resolution in rollups.RESOLUTIONS:
        mine = {pk[3]: row for pk, row in rows.items() if pk[2] == resolution}
        assert min(r["min"] for r in mine.values()) == min(p.value for p in points)
        assert max(r["max"] for r in mine.values()) == max(p.value for p in points)
        width = resolution * 1000
        assert mine[dip.timestamp - dip.timestamp % width]["min"] == 0.5
        assert mine[spike.timestamp - spike.timestamp % width]["max"] == 500.0
        assert sum(r["count"] for r in mine.values()) == len(points)


def test_radt_rollup_builds_what_the_writer_wrote_and_twice_changes_nothing(store_uri, capsys):
    rng = random.Random(5)
    client = MlflowClient(store_uri)
    experiment = client.create_experiment("written")
    runs = {client.create_run(experiment).info.run_id: None for _ in range(3)}
    store = SqlMetricStore(store_uri)
    for run_id in runs:
        points = random_series(rng, "system/gpu_0_sm_active", 3000) + random_series(rng, "loss", 700)
        for batch in deliveries(rng, points, 5):  # the writer's batches, late and out of order
            store.write(run_id, batch)
        runs[run_id] = points
    store.close()
    before = {run_id: sorted((m.step, m.timestamp, repr(m.value)) for m in client.get_metric_history(run_id, "loss")) for run_id in runs}

    assert radt_main(["rollup", "--store", store_uri]) == 0
    assert "radt rollup: 3 runs, 6 series," in capsys.readouterr().err
    want = {}
    for run_id, points in runs.items():
        want.update(direct(run_id, points))
    first = stored(store_uri)
    assert_same(first, want)

    assert radt_main(["rollup", "--store", store_uri, "--run", next(iter(runs))]) == 0
    assert radt_main(["rollup", "--store", store_uri]) == 0
    assert_same(stored(store_uri), first)

    # MLflow reads the store as before: the runs, their histories, the latest values
    client = MlflowClient(store_uri)
    for run_id in runs:
        assert sorted((m.step, m.timestamp, repr(m.value)) for m in client.get_metric_history(run_id, "loss")) == before[run_id]
        assert set(client.get_run(run_id).data.metrics) == {"system/gpu_0_sm_active", "loss"}
    assert len(client.search_runs([experiment])) == 3


def test_rollup_table_leaves_mlflow_schema_alone(store_uri):
    engine = make_engine(store_uri)
    with engine.connect() as conn:
        tables = set(sa.inspect(conn).get_table_names())
        revision = conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalars().all()
    rollups.ensure_table(engine)
    with engine.connect() as conn:
        assert set(sa.inspect(conn).get_table_names()) == tables | {"radt_rollups", "radt_rollup_series"}
        assert conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalars().all() == revision
    engine.dispose()
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore  # what `mlflow server` and the UI open

    SqlAlchemyStore(store_uri, "/tmp/radt-rollup-artifacts").search_experiments()


def test_rollup_errors_are_one_line(store_uri, tmp_path, capsys):
    assert radt_main(["rollup", "--store", store_uri, "--run", "0" * 32]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"radt rollup: run '{'0' * 32}' not found in") and "\n" not in err
    assert radt_main(["rollup", "--store", "postgresql://postgres@127.0.0.1:1/none"]) == 2
    err = capsys.readouterr().err.strip()
    assert "unreachable" in err and "\n" not in err and "Traceback" not in err
    assert radt_main(["rollup", "--store", "http://127.0.0.1:1"]) == 2
    assert "not a SQLite or PostgreSQL store" in capsys.readouterr().err


def test_rebuild_in_small_chunks_equals_one_chunk(store_uri):
    """Chunk boundaries cut series mid-bucket: the shared buckets are merged, not doubled or lost."""
    rng = random.Random(6)
    run_id = _run(MlflowClient(store_uri), "chunks")
    points = random_series(rng, "a", 1500) + random_series(rng, "b", 900)
    store = SqlMetricStore(store_uri)
    store.write(run_id, points)
    store.close()
    engine = make_engine(store_uri)
    rollups.ensure_table(engine)
    with engine.begin() as conn:
        assert rollups.rebuild_run(conn, run_id, chunk=97)[0] == 2
    engine.dispose()
    assert_same(stored(store_uri, run_id), direct(run_id, points))
    assert np.isfinite([r["sum"] for r in stored(store_uri, run_id).values() if r["count"]]).all()


# --- what radt's write paths leave -----------------------------------------------------------------


def test_a_batch_stored_twice_is_counted_once(store_uri):
    """A write whose answer was lost is spooled and sent again: the store keeps its points once, the rollups count them once."""
    rng = random.Random(7)
    run_id = _run(MlflowClient(store_uri), "twice")
    points = random_series(rng, "system/gpu_0_sm_active", 1200)
    store = SqlMetricStore(store_uri)
    store.write(run_id, points[:700])
    store.write(run_id, points[400:])  # overlaps the first
    store.write(run_id, points[:700])  # all of it again
    store.close()
    assert assert_rollups_cover_raw(store_uri, run_id) == len({(p.key, p.timestamp, p.step, repr(p.value)) for p in points})


def test_spooled_batches_replayed_by_sync_keep_rollups_exact(store_uri, tmp_path):
    """Batches spooled while the store was away (one of them also stored: it was in flight) reach the store through
    sync's replay; the rollups then equal one computation over every stored point."""
    rng = random.Random(8)
    run_id = _run(MlflowClient(store_uri), "spooled")
    batches = deliveries(rng, random_series(rng, "system/gpu_0_sm_active", 2000) + random_series(rng, "loss", 300), 8)
    store = SqlMetricStore(store_uri)
    for batch in batches[:3]:
        store.write(run_id, batch)
    store.close()
    spool = Spool(tmp_path / SPOOL_FILE)
    for batch in batches[2:]:
        spool.append(batch)
    assert replay_spool(store_uri, tmp_path, run_id, spool) == sum(len(b) for b in batches[2:])
    assert not spool
    assert_rollups_cover_raw(store_uri, run_id)


def test_writers_of_one_run_on_several_nodes_at_once(pg_uri):
    """Each node's radt writes the same run at the same time (its own keys and a shared one): no point lost or doubled."""
    rng = random.Random(9)
    run_id = _run(MlflowClient(pg_uri), "nodes")
    shared = random_series(rng, "system/gpu_0_power_usage_watts", 3000)
    work = [deliveries(rng, random_series(rng, f"system/node-{n}/gpu_0_sm_active", 1500) + shared[n::3], 12) for n in range(3)]
    errors: list[BaseException] = []

    def node(batches):
        store = SqlMetricStore(pg_uri)
        try:
            for batch in batches:
                store.write(run_id, batch)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)
        finally:
            store.close()

    threads = [threading.Thread(target=node, args=(w,)) for w in work]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert_rollups_cover_raw(pg_uri, run_id)


def test_buckets_past_a_series_end_go_straight_in_and_the_rest_are_merged(pg_uri, monkeypatch):
    """PostgreSQL's writer COPYs the buckets past each series' last stored one straight into radt_rollups and merges
    only the rest (the bucket a batch continues, late points): with the split taken at every batch, catching-up,
    out-of-order and replayed batches of two runs still give one computation's rows, and both halves were used."""
    monkeypatch.setattr(rollups, "SPLIT_FROM", 1)
    halves = {"straight": 0, "merged": 0}
    split = rollups._split_new

    def counted(conn, ordered):
        fresh, merged = split(conn, ordered)
        halves["straight"] += len(fresh)
        halves["merged"] += len(merged)
        return fresh, merged

    monkeypatch.setattr(rollups, "_split_new", counted)
    rng = random.Random(16)
    client = MlflowClient(pg_uri)
    runs = [_run(client, f"split-{i}") for i in range(2)]
    store = SqlMetricStore(pg_uri)
    everything = {}
    for run_id in runs:
        series = random_series(rng, "system/gpu_0_sm_active", 3000) + random_series(rng, "system/gpu_1_sm_active", 2000)
        in_order = sorted(series, key=lambda p: p.timestamp)
        for start in range(0, len(in_order), 777):  # catching up: each batch continues the last one's buckets
            store.write(run_id, in_order[start : start + 777])
        late = random_series(rng, "system/gpu_0_sm_active", 400)  # the same span again, other values: every bucket merged
        for batch in deliveries(rng, late, 3):
            store.write(run_id, batch)
        store.write(run_id, late[:100])  # replayed: stored once, counted once
        everything[run_id] = series + late
    store.close()
    for run_id, points in everything.items():
        assert_same(stored(pg_uri, run_id), direct(run_id, points))
    assert halves["straight"] > 5 * halves["merged"] > 0, halves


def test_a_point_another_writer_adds_makes_the_series_stale_until_rebuilt(store_uri):
    rng = random.Random(10)
    client = MlflowClient(store_uri)
    run_id = _run(client, "other-writer")
    store = SqlMetricStore(store_uri)
    store.write(run_id, random_series(rng, "loss", 500))
    store.close()
    engine = make_engine(store_uri)
    with engine.connect() as conn:
        assert rollups.stale(conn, [run_id], "loss") == []
    client.log_metric(run_id, "loss", 123.0, timestamp=BASE + 10**7, step=10**6)  # the script's own mlflow.log_metric
    with engine.connect() as conn:
        assert rollups.stale(conn, [run_id], "loss") == [run_id]
    assert rollups.ensure_fresh(engine, [run_id, run_id], "loss") == [run_id]
    assert rollups.ensure_fresh(engine, [run_id], "loss") == []  # fresh now: nothing to do
    engine.dispose()
    assert_rollups_cover_raw(store_uri, run_id)


def test_a_plain_mlflow_run_gets_its_rollups_when_first_asked(store_uri):
    rng = random.Random(11)
    client = MlflowClient(store_uri)
    run_id = _run(client, "plain")
    points = random_series(rng, "system/gpu_0_sm_active", 900)
    metrics = [Metric(p.key, p.value, p.timestamp, p.step) for p in points]
    for start in range(0, len(metrics), 1000):
        client.log_batch(run_id, metrics=metrics[start : start + 1000])
    engine = make_engine(store_uri)
    rollups.ensure_table(engine)
    assert stored(store_uri, run_id) == {}
    assert rollups.ensure_fresh(engine, [run_id], "system/gpu_0_sm_active") == [run_id]
    engine.dispose()
    assert_rollups_cover_raw(store_uri, run_id)


def test_a_sqlite_without_returning_counts_a_batch_stored_twice_once(empty_sqlite, tmp_path):
    """SQLite before 3.35 has no RETURNING (SQLAlchemy's dialect says so): the store asks what it holds first."""
    sqlite_uri = empty_sqlite(tmp_path / "store.db")
    rng = random.Random(12)
    run_id = _run(MlflowClient(sqlite_uri), "old-sqlite")
    points = random_series(rng, "system/gpu_0_sm_active", 800)
    store = SqlMetricStore(sqlite_uri)
    store.engine.dialect.insert_returning = False  # what the dialect sets for sqlite_version_info < (3, 35)
    store.write(run_id, points[:500])
    store.write(run_id, points[200:])
    store.write(run_id, points)
    store.close()
    assert assert_rollups_cover_raw(sqlite_uri, run_id) == len({(p.key, p.timestamp, p.step, repr(p.value)) for p in points})


def _log(client: MlflowClient, run_id: str, points: list[Point]) -> None:
    metrics = [Metric(p.key, p.value, p.timestamp, p.step) for p in points]
    for start in range(0, len(metrics), 1000):
        client.log_batch(run_id, metrics=metrics[start : start + 1000])


def test_a_live_run_another_writer_logs_to_is_refreshed_from_its_tail_and_a_late_point_rebuilds_it(store_uri):
    """Each draw of a live run logged through MLflow refreshes only the last 10 minutes; a point logged with an
    older time is found by the count check and the whole series is rebuilt: the rollups always equal the raw points."""
    rng = random.Random(13)
    client = MlflowClient(store_uri)
    run_id = _run(client, "live-mlflow")
    key = "system/gpu_0_sm_active"
    points = [Point(key, 50 + rng.random(), BASE + i * 1000, i) for i in range(7200)]
    _log(client, run_id, points[:3600])
    engine = make_engine(store_uri)
    rollups.ensure_table(engine)
    assert rollups.ensure_fresh(engine, [run_id], key) == [run_id]  # first draw: built whole
    _log(client, run_id, points[3600:])  # the run goes on
    with engine.begin() as conn:
        assert rollups.stale(conn, [run_id], key) == [run_id]
        assert rollups.refresh_series(conn, run_id, key) is True  # its tail only
    assert_rollups_cover_raw(store_uri, run_id)
    client.log_metric(run_id, key, 0.25, timestamp=BASE + 1500 * 1000 + 1, step=99_999)  # late: an hour back
    client.log_metric(run_id, key, 60.0, timestamp=BASE + 7200 * 1000, step=7200)  # and a new one at the end
    with engine.begin() as conn:
        assert rollups.refresh_series(conn, run_id, key) is False  # the count did not match: rebuilt whole
    engine.dispose()
    assert_rollups_cover_raw(store_uri, run_id)


def test_the_writers_plain_python_rows_equal_the_numpy_rows():
    """The plain-Python bucketing (a live writer's few points: the recording process never loads numpy), numpy over
    every key of a batch at once (bucket_stored: a catching-up writer, imports) and numpy per key (bucket_rows:
    rebuilds) give the same rows for the same points, legacy sentinels included, whether NaN comes as NaN or as
    MLflow stores it (0 with is_nan)."""
    rng = random.Random(14)
    points = random_series(rng, "a", 3000) + random_series(rng, "SMI - GPU Util", 500) + random_series(rng, "b", 700)
    points += [Point("SMI - GPU Util", v, BASE + 5_000_000 + i, i) for i, v in enumerate(rollups.catalogue.missing_values("SMI - GPU Util") * 3)]
    rng.shuffle(points)
    stored_form = rollups.Stored.of_rows([(p.key, 0.0 if math.isnan(p.value) else p.value, p.timestamp, p.step, math.isnan(p.value)) for p in points])
    python = rollups._few_rows("r", stored_form, rollups.RESOLUTIONS)
    together = rollups.bucket_stored("r", stored_form)
    by_key: dict = {}
    for p in points:
        by_key.setdefault(p.key, []).append(p)
    per_key = [
        row for key in sorted(by_key) for row in rollups.bucket_rows("r", key, *zip(*((p.timestamp, p.step, p.value) for p in by_key[key]), strict=True))
    ]
    pk = lambda row: (row["key"], row["resolution_s"], row["bucket_ms"])  # noqa: E731
    assert [pk(row) for row in python] == [pk(row) for row in together] == sorted(map(pk, per_key))
    per_key_by = {pk(row): row for row in per_key}
    for row, other in zip(python, together, strict=True):
        for one in (other, per_key_by[pk(row)]):
            assert {**row, "sum": 0} == {**one, "sum": 0}
            assert row["sum"] == (None if one["sum"] is None else pytest.approx(one["sum"], rel=1e-12))
    assert any(row["nans"] and not row["count"] for row in python if row["key"] == "SMI - GPU Util"), "sentinels are no reading"
    missing = rollups.catalogue.missing_values("SMI - GPU Util")
    no_reading = sum(math.isnan(p.value) or (p.key == "SMI - GPU Util" and p.value in missing) for p in points)
    assert sum(row["nans"] for row in together if row["resolution_s"] == 10) == no_reading


def test_legacy_keys_sentinels_are_no_reading_in_the_writers_rollups(store_uri):
    """radT's legacy keys carry "no reading" sentinels (-1): the writer's rollups count them as no reading, beside
    radt's own keys in the same batch."""
    rng = random.Random(15)
    run_id = _run(MlflowClient(store_uri), "legacy")
    points = [Point("SMI - GPU Util", rng.choice([-1.0, 0.5, 0.9]), BASE + i * 1000, i) for i in range(900)]
    points += random_series(rng, "system/gpu_0_sm_active", 900)
    store = SqlMetricStore(store_uri)
    store.write(run_id, points)
    store.close()
    assert_rollups_cover_raw(store_uri, run_id)
    legacy = [row for pk, row in stored(store_uri, run_id).items() if pk[1] == "SMI - GPU Util" and pk[2] == 10]
    assert sum(row["nans"] for row in legacy) == sum(p.value == -1.0 for p in points[:900]) > 0
    assert min(row["min"] for row in legacy if row["count"]) == 0.5
