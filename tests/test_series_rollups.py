"""Long charts drawn from radt's rollups must show what the raw chart shows: every stall dip and spike at its own
time, gaps where there were no readings, the envelope's band exact; plain MLflow runs get their rollups on first
view and points logged later on the next; short zooms and stores that cannot hold rollups read raw points."""

from __future__ import annotations

import logging
import uuid

import numpy as np
import pytest
import sqlalchemy as sa
from mlflow import MlflowClient
from mlflow.entities import Metric

from radt import rollups
from radt.app.db import series
from radt.app.db.downsample import ENVELOPE, Envelope
from radt.app.db.series import load_series
from radt.app.db.store import make_read_engine
from radt.collectors.store.sqltracking import make_engine
from radt.collectors.store.stores import SqlMetricStore
from radt.points import Point

pytestmark = pytest.mark.dialects  # the SQL radt issues differs per dialect: SQLite and the real PostgreSQL

KEY = "system/gpu_0_sm_active"
BASE = 1_760_000_000_000
N = 3 * 3600  # three hours at 1 Hz
DIPS = (1234, 5555, 9876)  # one sample each: a stall
SPIKES = (3333, 6789, 10500)
NAN = slice(4000, 4300)  # five minutes without readings
GAPS = (slice(2000, 2600), slice(7000, 7600))  # ten minutes without points, twice


def long_series(seed: int, start: int = BASE) -> tuple[np.ndarray, np.ndarray]:
    """Three hours at 1 Hz with two gaps, a stretch of NaN, one-sample dips and one-sample spikes."""
    rng = np.random.default_rng(seed)
    ts = start + np.arange(N, dtype=np.int64) * 1000
    values = 0.5 + 0.1 * np.sin(np.arange(N) / 300.0) + rng.normal(0, 0.02, N)
    values[list(DIPS)] = 0.0
    values[list(SPIKES)] = 1.0 + 0.01 * np.arange(len(SPIKES))
    values[NAN] = np.nan
    keep = np.ones(N, dtype=bool)
    for gap in GAPS:
        keep[gap] = False
    return ts[keep], values[keep]


def radt_written(uri: str, client: MlflowClient, experiment: str, ts: np.ndarray, values: np.ndarray) -> str:
    """A run written by radt's writer: its rollups are made with its points."""
    run_id = client.create_run(experiment).info.run_id
    store = SqlMetricStore(uri)
    points = [Point(KEY, float(v), int(t), i) for i, (t, v) in enumerate(zip(ts, values, strict=True))]
    for start in range(0, len(points), 5000):
        store.write(run_id, points[start : start + 5000])
    store.close()
    return run_id


def mlflow_logged(client: MlflowClient, run_id: str, ts: np.ndarray, values: np.ndarray, first_step: int = 0) -> None:
    """Points logged by MLflow's own client: no rollups."""
    metrics = [Metric(KEY, float(v), int(t), first_step + i) for i, (t, v) in enumerate(zip(ts, values, strict=True))]
    for start in range(0, len(metrics), 1000):
        client.log_batch(run_id, metrics=metrics[start : start + 1000])


def rollup_rows(uri: str, run_id: str) -> int:
    engine = make_engine(uri)
    try:
        with engine.connect() as conn:
            if not sa.inspect(conn).has_table(rollups.rollups.name):
                return 0
            return conn.execute(sa.select(sa.func.count()).select_from(rollups.rollups).where(rollups.rollups.c.run_uuid == run_id)).scalar_one()
    finally:
        engine.dispose()


def raw_chart(engine: sa.Engine, run_ids: list[str], *args, **options) -> dict:
    """What the chart was before rollups: the raw points, downsampled."""
    saved, series.USE_ROLLUPS = series.USE_ROLLUPS, False
    try:
        return load_series(engine, run_ids, KEY, *args, **options)
    finally:
        series.USE_ROLLUPS = saved


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for run_id in a:
        assert np.array_equal(a[run_id][0], b[run_id][0]) and np.array_equal(a[run_id][1], b[run_id][1], equal_nan=True)


def _long_series() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    return {"radt": long_series(1), "mlflow": long_series(2, BASE + 3_600_000)}


def _two_runs(uri: str) -> dict[str, str]:
    """A run written by radt and a plain MLflow run, three hours each (10,800 points through MLflow's client: 1.5 s)."""
    client = MlflowClient(uri)
    experiment = client.create_experiment("long runs")
    data = _long_series()
    runs = {"radt": radt_written(uri, client, experiment, *data["radt"])}
    runs["mlflow"] = client.create_run(experiment).info.run_id
    mlflow_logged(client, runs["mlflow"], *data["mlflow"])
    return runs


@pytest.fixture
def two_runs(store_uri, snapshots):
    """_two_runs' rows in the test's own store, written once per test run (tests/support/snapshots.py): a test that
    draws, adds points or builds rollups changes nothing for the next."""
    runs = snapshots.restore(_two_runs, store_uri)
    return store_uri, MlflowClient(store_uri), runs, _long_series()


def test_the_rollup_chart_keeps_every_dip_spike_and_gap_at_its_own_time(two_runs):
    uri, _client, runs, data = two_runs
    assert rollup_rows(uri, runs["mlflow"]) == 0, "MLflow's client made no rollups"
    engine = make_read_engine(uri)  # the dashboard's engine, which cannot write MLflow's tables
    ids = [runs["radt"], runs["mlflow"]]
    drawn = load_series(engine, ids, KEY)
    assert rollup_rows(uri, runs["mlflow"]) > 0, "the plain MLflow run got its rollups on first view"
    raw = raw_chart(engine, ids)
    for label, run_id in runs.items():
        ts, values = data[label]
        lookup = dict(zip(ts.tolist(), values.tolist(), strict=True))
        xs, ys = drawn[run_id]
        assert len(xs) <= 2000 and np.all(np.diff(xs) > 0)
        real = ~np.isnan(ys)
        assert all(lookup[x] == y for x, y in zip(xs[real].tolist(), ys[real].tolist(), strict=True)), "real points at their own times"
        for i in DIPS + SPIKES:  # each one sample long: the raw chart shows them, and so does this one, at the sample's time
            at = int(ts[0]) + i * 1000
            assert lookup[at] in raw[run_id][1][raw[run_id][0] == at]
            assert list(ys[xs == at]) == [lookup[at]], (label, i)
        assert np.nanmin(ys) == np.nanmin(raw[run_id][1]) == 0.0 and np.nanmax(ys) == np.nanmax(raw[run_id][1])
        stretch = (xs >= ts[0] + NAN.start * 1000) & (xs < ts[0] + NAN.stop * 1000)
        assert stretch.any() and np.isnan(ys[stretch]).all(), "the minutes without readings are a gap"
        for gap in GAPS:  # no points where none were stored
            assert not ((xs > ts[0] + (gap.start - 1) * 1000) & (xs < ts[0] + gap.stop * 1000)).any()

    # a zoom short enough for the budget reads the raw points: the same answer as before rollups
    lo, hi = int(data["radt"][0][0] + 3_600_000), int(data["radt"][0][0] + 4_500_000)
    assert_same(load_series(engine, ids, KEY, lo, hi), raw_chart(engine, ids, lo, hi))
    windows = {runs["radt"]: (lo, hi), runs["mlflow"]: (lo + 3_600_000, hi + 3_600_000)}  # a time-since-start axis
    assert_same(load_series(engine, ids, KEY, windows=windows), raw_chart(engine, ids, windows=windows))
    # a long zoom comes from the rollups, within its window
    lo, hi = int(data["radt"][0][0] + 600_000), int(data["radt"][0][0] + 10_700_000)
    xs, ys = load_series(engine, [runs["radt"]], KEY, lo, hi)[runs["radt"]]
    assert xs[0] >= lo and xs[-1] <= hi and 0.0 in ys and len(xs) <= 2000
    with pytest.raises(sa.exc.DBAPIError), engine.begin() as conn:  # only the rollup builds were read-write
        conn.execute(sa.delete(rollups.rollups))
    engine.dispose()


def test_the_envelope_band_is_each_buckets_raw_minimum_and_maximum(two_runs):
    uri, _client, runs, data = two_runs
    engine = make_read_engine(uri)
    found = load_series(engine, list(runs.values()), KEY, method=ENVELOPE, budget=600)
    engine.dispose()
    for label, run_id in runs.items():
        env = found[run_id]
        assert isinstance(env, Envelope) and len(env.x) * 3 <= 600
        ts, values = data[label]
        half = float(np.min(np.diff(env.x))) / 2
        for x, mean, low, high in zip(env.x, env.mean, env.low, env.high, strict=True):
            inside = values[(ts >= x - half) & (ts < x + half)]
            inside = inside[~np.isnan(inside)]
            if len(inside) == 0:
                assert np.isnan(low) and np.isnan(high) and np.isnan(mean)
                continue
            assert (low, high) == (inside.min(), inside.max())
            assert mean == pytest.approx(inside.mean(), rel=1e-12)
        assert np.nanmin(env.low) == 0.0 and np.nanmax(env.high) == values[~np.isnan(values)].max()


def test_points_mlflow_logs_after_a_view_show_on_the_next_view(two_runs):
    uri, client, runs, data = two_runs
    engine = make_read_engine(uri)
    run_id = runs["mlflow"]
    before = load_series(engine, [run_id], KEY)[run_id]
    ts, _values = data["mlflow"]
    later = ts[-1] + 1000 + np.arange(3600, dtype=np.int64) * 1000  # another hour, with a spike
    values = np.full(3600, 0.5)
    values[1800] = 7.0
    mlflow_logged(client, run_id, later, values, first_step=len(ts))
    xs, ys = load_series(engine, [run_id], KEY)[run_id]
    assert xs[-1] > before[0][-1] and list(ys[xs == later[1800]]) == [7.0], "the stale series was rebuilt"
    with engine.connect() as conn:
        assert rollups.covered_rows(conn, [run_id], [KEY])[(run_id, KEY)][1] == int(later[-1])
    engine.dispose()


def test_a_fresh_series_is_not_rebuilt_on_the_next_draw(two_runs):
    """A running run radt writes stays fresh: polls read its rollups, they never delete and rebuild them."""
    uri, _client, runs, data = two_runs
    engine = make_read_engine(uri)
    deletes: list[str] = []

    @sa.event.listens_for(engine, "before_cursor_execute")
    def _count(_conn, _cursor, statement, *_args):
        if statement.lstrip().upper().startswith("DELETE FROM RADT_ROLLUPS"):
            deletes.append(statement)

    ids = list(runs.values())
    load_series(engine, ids, KEY)
    assert len(deletes) == 1, "the plain MLflow run is built once; the radt run is fresh already"
    load_series(engine, ids, KEY)
    ts, _values = data["radt"]
    store = SqlMetricStore(uri)  # the writer goes on: its batch keeps the series fresh
    store.write(runs["radt"], [Point(KEY, 9.0, int(ts[-1]) + 1000, N + 1)])
    store.close()
    xs, ys = load_series(engine, ids, KEY)[runs["radt"]]
    assert len(deletes) == 1 and xs[-1] == ts[-1] + 1000 and ys[-1] == 9.0
    engine.dispose()


def test_a_store_that_cannot_hold_rollups_draws_raw_points(store_uri, tmp_path, caplog):
    client = MlflowClient(store_uri)
    run_id = client.create_run(client.create_experiment("read only")).info.run_id
    mlflow_logged(client, run_id, *long_series(3))
    if store_uri.startswith("sqlite"):
        path = store_uri[len("sqlite:///") :]
        reader_uri, cleanup = f"sqlite:///file:{path}?mode=ro&uri=true", None  # a file this user may only read
        engine = sa.create_engine(reader_uri)
    else:
        role = f"radt_reader_{uuid.uuid4().hex[:8]}"
        admin = make_engine(store_uri)
        with admin.begin() as conn:
            conn.execute(sa.text(f"CREATE ROLE {role} LOGIN"))
            conn.execute(sa.text(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}"))
            conn.execute(sa.text(f"REVOKE CREATE ON SCHEMA public FROM {role}"))
        engine = make_read_engine(sa.make_url(store_uri).set(username=role).render_as_string(hide_password=False))

        def cleanup():
            with admin.begin() as conn:
                conn.execute(sa.text(f"DROP OWNED BY {role}"))
                conn.execute(sa.text(f"DROP ROLE {role}"))
            admin.dispose()

    try:
        with caplog.at_level(logging.WARNING, logger="radt.app.db.rollupseries"):
            drawn = load_series(engine, [run_id], KEY)
        assert_same(drawn, raw_chart(engine, [run_id]))
        assert [r.message for r in caplog.records if "rollups unavailable" in r.message], "one line says why"
        assert rollup_rows(store_uri, run_id) == 0
        caplog.clear()
        assert_same(load_series(engine, [run_id], KEY), drawn)
        assert not caplog.records, "logged once"
    finally:
        engine.dispose()
        if cleanup:
            cleanup()


def test_a_zoom_before_the_kept_raw_points_is_drawn_from_the_finest_rollups(store_uri):
    """`radt retain` drops old raw points and keeps their rollups: a zoom into that time is not empty."""
    client = MlflowClient(store_uri)
    ts, values = long_series(4)
    run_id = radt_written(store_uri, client, client.create_experiment("retained"), ts, values)
    cut = int(ts[0]) + 7200 * 1000
    admin = make_engine(store_uri)
    with admin.begin() as conn:  # what radt retain leaves: the rollups, and the raw points from `cut` on
        state = rollups.series_state.c
        conn.execute(sa.update(rollups.series_state).where(state.run_uuid == run_id, state.key == KEY).values(raw_from_ms=cut))
        metrics = sa.table("metrics", sa.column("run_uuid"), sa.column("timestamp"))
        conn.execute(sa.delete(metrics).where(metrics.c.run_uuid == run_id, metrics.c.timestamp < cut))
    admin.dispose()
    engine = make_read_engine(store_uri)
    lo, hi = int(ts[0]) + 1200 * 1000, int(ts[0]) + 1800 * 1000  # ten minutes around the first dip: raw before the cut
    xs, ys = load_series(engine, [run_id], KEY, lo, hi)[run_id]
    assert xs[0] >= lo and xs[-1] <= hi and len(xs) > 60 and ys.min() == 0.0
    assert list(xs[ys == 0.0]) == [int(ts[0]) + DIPS[0] * 1000]
    late = load_series(engine, [run_id], KEY, cut, cut + 600_000)[run_id]  # after the cut: raw points, as before
    assert np.array_equal(late[0], ts[(ts >= cut) & (ts <= cut + 600_000)])
    engine.dispose()


def test_a_chart_of_many_runs_shares_its_point_budget_and_keeps_a_floor_per_series():
    """Up to 75 runs each series gets the whole budget; beyond, the chart's 75 x budget points are shared (256 runs
    x 2,000 points were a 6 MB figure), never below 200 a series; exports (a larger budget) scale the same way."""
    from radt.app.view.views import EXPORT_BUDGET, SCREEN_BUDGET, series_budget

    assert [series_budget(SCREEN_BUDGET, n) for n in (1, 10, 75)] == [2000, 2000, 2000]
    assert series_budget(SCREEN_BUDGET, 256) == 585 and 256 * series_budget(SCREEN_BUDGET, 256) <= 75 * SCREEN_BUDGET
    assert series_budget(SCREEN_BUDGET, 1000) == 200
    assert series_budget(EXPORT_BUDGET, 256) == 5859
    assert series_budget(100, 1000) == 100  # a budget under the floor is kept as asked
