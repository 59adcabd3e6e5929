"""Rollups must equal a direct computation from the raw points however the points arrive, keep every dip and
spike exact, and leave MLflow's store as MLflow reads it."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import sqlalchemy as sa
from mlflow import MlflowClient

from radt import rollups
from radt.cli import main as radt_main
from radt.collectors.sqltracking import make_engine
from radt.collectors.stores import MAX_FLOAT, SqlMetricStore
from radt.points import Point

BASE = 1_700_000_000_000


def direct(run_id: str, points: list[Point]) -> dict[tuple, dict]:
    """The rollups computed the plain way: every bucket's points gathered in Python; NaNs and infinities counted
    as no reading, min and max at their earliest times."""
    found: dict[tuple, list] = {}
    gone: dict[tuple, int] = {}
    for p in points:
        for resolution in rollups.RESOLUTIONS:
            pk = (run_id, p.key, resolution, p.timestamp - p.timestamp % (resolution * 1000))
            if not math.isfinite(p.value) or abs(p.value) == MAX_FLOAT:
                gone[pk] = gone.get(pk, 0) + 1
            else:
                found.setdefault(pk, []).append((p.timestamp, p.step, p.value))
    rows = {}
    for pk in found.keys() | gone.keys():
        items = found.get(pk, [])
        row = dict.fromkeys(rollups.VALUE_COLUMNS) | {"count": len(items), "nans": gone.get(pk, 0)}
        if items:
            values = [v for _, _, v in items]
            last = max(items)
            row |= {
                "min": min(values),
                "max": max(values),
                "sum": math.fsum(values),
                "min_ms": min(t for t, _, v in items if v == min(values)),
                "max_ms": min(t for t, _, v in items if v == max(values)),
                "last_value": last[2],
                "last_ms": last[0],
                "last_step": last[1],
            }
        rows[pk] = row
    return rows


def stored(uri: str, run_id: str | None = None) -> dict[tuple, dict]:
    engine = make_engine(uri)
    query = sa.select(rollups.rollups)
    if run_id:
        query = query.where(rollups.rollups.c.run_uuid == run_id)
    with engine.connect() as conn:
        result = {(r.run_uuid, r.key, r.resolution_s, r.bucket_ms): {c: getattr(r, c) for c in rollups.VALUE_COLUMNS} for r in conn.execute(query)}
    engine.dispose()
    return result


def assert_same(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for pk, row in want.items():
        for column, value in row.items():
            if column == "sum" and value is not None:  # merged sums are added in another order: equal up to float rounding
                assert got[pk][column] == pytest.approx(value, rel=1e-12, abs=1e-9), (pk, column)
            else:
                assert got[pk][column] == value, (pk, column)


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
