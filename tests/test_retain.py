"""`radt retain --raw 30d` drops the old raw points of ended runs only, after their rollups cover them, and the
store reads as before: the same rollups (also after `radt rollup`), MLflow's run and latest values; twice = once."""

from __future__ import annotations

import math
import random
import time

import pandas as pd
import pytest
import sqlalchemy as sa
from mlflow import MlflowClient
from mlflow.entities import Metric

from radt import rollups
from radt.app import retain
from radt.app.db.store import make_read_engine
from radt.app.summary.summaries import run_summary
from radt.app.summary.summarystore import store_summaries
from radt.cli import main as radt_main
from radt.collectors.store.sqltracking import make_engine
from radt.collectors.store.stores import SqlMetricStore
from radt.points import Point
from tests.support.rollupcheck import assert_same, direct, raw_points, stored

pytestmark = pytest.mark.dialects  # the SQL radt issues differs per dialect: SQLite and the real PostgreSQL

DAY_MS = 86_400_000
NOW = (int(time.time() * 1000) // 600_000) * 600_000 + 123_456  # a fixed "now" for the library calls
CUTOFF = retain.cutoff_ms(30 * DAY_MS, NOW)


def series(rng: random.Random, key: str, start_ms: int, seconds: int) -> list[Point]:
    """A 1 Hz series with NaNs, a dip and a spike."""
    points = [Point(key, 50 + 10 * rng.gauss(0, 1) if rng.random() > 0.03 else math.nan, start_ms + 1000 * i, i) for i in range(seconds)]
    points[seconds // 3] = Point(key, -1000.0, points[seconds // 3].timestamp, points[seconds // 3].step)
    points[seconds // 2] = Point(key, 1e6, points[seconds // 2].timestamp, points[seconds // 2].step)
    return points


def ended_run(uri: str, name: str, points: list[Point], *, end: bool = True) -> str:
    """A run radt wrote (raw points and rollups in one transaction), FINISHED unless end=False."""
    client = MlflowClient(uri)
    run_id = client.create_run(client.create_experiment(name)).info.run_id
    store = SqlMetricStore(uri)
    store.write(run_id, points)
    store.close()
    if end:
        client.set_terminated(run_id)
    return run_id


def raw_from(uri: str, run_id: str) -> dict[str, int | None]:
    st = rollups.series_state.c
    engine = make_engine(uri)
    with engine.connect() as conn:
        found = dict(conn.execute(sa.select(st.key, st.raw_from_ms).where(st.run_uuid == run_id)).all())
    engine.dispose()
    return found


def metrics_of(uri: str, run_id: str) -> dict[str, float]:
    return MlflowClient(uri).get_run(run_id).data.metrics


def test_an_old_run_loses_exactly_its_raw_points_before_the_cutoff_and_keeps_its_rollups(store_uri):
    rng = random.Random(1)
    start = CUTOFF - 90 * 60_000  # a 3 h run across the cutoff: 1.5 h before it, 1.5 h after
    points = series(rng, "system/gpu_0_sm_active", start, 3 * 3600) + series(rng, "system/gpu_0_power_usage_watts", start, 3 * 3600)
    run_id = ended_run(store_uri, "across", points)
    before, latest = stored(store_uri, run_id), metrics_of(store_uri, run_id)

    totals = retain.retain(store_uri, 30 * DAY_MS, now_ms=NOW)

    dropped = [p for p in points if p.timestamp < CUTOFF]
    assert (totals.runs, totals.points) == (1, len(dropped))
    assert totals.rollup_rows == sum(1 for (_r, _k, _res, b) in before if b < CUTOFF)
    left = raw_points(store_uri, run_id)
    assert sorted((p.key, p.timestamp) for p in left) == sorted((p.key, p.timestamp) for p in points if p.timestamp >= CUTOFF)
    assert_same(stored(store_uri, run_id), before)
    assert raw_from(store_uri, run_id) == dict.fromkeys({p.key for p in points}, CUTOFF)
    assert metrics_of(store_uri, run_id) == latest  # MLflow still opens the run with its latest values
    history = MlflowClient(store_uri).get_metric_history(run_id, "system/gpu_0_sm_active")
    assert min(m.timestamp for m in history) == CUTOFF


def test_radt_rollup_after_retain_and_retain_twice_change_nothing(store_uri, capsys):
    rng = random.Random(2)
    old = series(rng, "system/gpu_0_sm_active", NOW - 40 * DAY_MS, 2 * 3600)
    recent = series(rng, "system/gpu_0_sm_active", NOW - 2 * DAY_MS, 600)
    run_id = ended_run(store_uri, "old", old + recent)
    before = stored(store_uri)

    assert radt_main(["retain", "--raw", "30d", "--store", store_uri]) == 0
    assert capsys.readouterr().err.strip().startswith(f"radt retain: 1 run, {len(old)} raw points dropped, ")
    assert sorted(p.timestamp for p in raw_points(store_uri, run_id)) == [p.timestamp for p in recent]
    assert_same(stored(store_uri), before)

    assert radt_main(["rollup", "--store", store_uri]) == 0  # a rebuild from what raw points are left
    capsys.readouterr()
    assert_same(stored(store_uri), before)

    assert radt_main(["retain", "--raw", "30d", "--store", store_uri]) == 0
    assert capsys.readouterr().err.strip().startswith("radt retain: 0 runs, 0 raw points dropped, ")
    assert len(raw_points(store_uri, run_id)) == len(recent)
    assert_same(stored(store_uri), before)


def test_a_point_added_after_the_cut_is_drawn_and_the_rollups_before_the_cut_stay(store_uri):
    """MLflow's client adds a point to a cut run: the chart's rebuild of the now stale series (ensure_fresh) reads the
    raw points left and keeps the rollups before the cut."""
    rng = random.Random(7)
    key = "system/gpu_0_sm_active"
    start = CUTOFF - 30 * 60_000
    run_id = ended_run(store_uri, "late", series(rng, key, start, 3600))
    before = stored(store_uri, run_id)
    retain.retain(store_uri, 30 * DAY_MS, now_ms=NOW)
    MlflowClient(store_uri).log_metric(run_id, key, 0.5, timestamp=start + 3600 * 1000, step=3600)

    engine = make_engine(store_uri)
    assert rollups.ensure_fresh(engine, [run_id], key) == [run_id]
    engine.dispose()

    after = stored(store_uri, run_id)
    assert_same({pk: row for pk, row in after.items() if pk[3] < CUTOFF}, {pk: row for pk, row in before.items() if pk[3] < CUTOFF})
    left = raw_points(store_uri, run_id)
    assert min(p.timestamp for p in left) >= CUTOFF
    assert_same({pk: row for pk, row in after.items() if pk[3] >= CUTOFF}, direct(run_id, left))


def test_a_plain_mlflow_run_gets_its_rollups_before_its_points_go(store_uri):
    """A run logged by MLflow's own client has no rollups (nor rollup tables): they are built from its raw points first."""
    rng = random.Random(3)
    client = MlflowClient(store_uri)
    run_id = client.create_run(client.create_experiment("plain")).info.run_id
    points = series(rng, "system/gpu_0_utilization_percentage", NOW - 40 * DAY_MS, 1800) + series(rng, "loss", NOW - 40 * DAY_MS, 1800)
    for start in range(0, len(points), 1000):
        client.log_batch(run_id, metrics=[Metric(p.key, p.value, p.timestamp, p.step) for p in points[start : start + 1000]])
    client.set_terminated(run_id)
    latest = metrics_of(store_uri, run_id)

    totals = retain.retain(store_uri, 30 * DAY_MS, now_ms=NOW)

    assert totals.points == len(points)
    assert raw_points(store_uri, run_id) == []
    assert_same(stored(store_uri, run_id), direct(run_id, points))
    assert {k: v for k, v in metrics_of(store_uri, run_id).items()} == latest


def test_old_points_another_writer_added_without_moving_latest_metrics_are_in_the_rollups_before_the_cut(store_uri):
    """MLflow's client logs points with old timestamps and low steps into a run radt wrote: latest_metrics does not
    move, so the series looks fresh; the first cut finds them (counts) and builds them in before they go."""
    rng = random.Random(8)
    key = "system/gpu_0_sm_active"
    mine = series(rng, key, NOW - 40 * DAY_MS, 1800)
    run_id = ended_run(store_uri, "mixed", mine)
    extra = [Point(key, 0.25 * i, NOW - 40 * DAY_MS + 500 + 1000 * i, 1) for i in range(0, 1800, 7)]
    MlflowClient(store_uri).log_batch(run_id, metrics=[Metric(p.key, p.value, p.timestamp, p.step) for p in extra])
    engine = make_engine(store_uri)
    with engine.connect() as conn:
        assert rollups.stale(conn, [run_id], key) == []  # it looks fresh
    engine.dispose()

    totals = retain.retain(store_uri, 30 * DAY_MS, now_ms=NOW)

    assert totals.points == len(mine) + len(extra)
    assert_same(stored(store_uri, run_id), direct(run_id, mine + extra))


def test_a_later_cut_also_builds_in_points_added_after_the_first(store_uri):
    rng = random.Random(9)
    key = "system/gpu_0_sm_active"
    mine = series(rng, key, CUTOFF - 3600 * 1000, 3 * 3600)  # 1 h before the first cut, 2 h after it
    run_id = ended_run(store_uri, "twice", mine)
    retain.retain(store_uri, 30 * DAY_MS, now_ms=NOW)
    extra = [Point(key, 0.5, CUTOFF + 300 + 1000 * i, 1) for i in range(0, 3600, 11)]  # old steps: latest_metrics stays
    MlflowClient(store_uri).log_batch(run_id, metrics=[Metric(p.key, p.value, p.timestamp, p.step) for p in extra])
    later = retain.cutoff_ms(30 * DAY_MS, NOW + 3600 * 1000)

    totals = retain.retain(store_uri, 30 * DAY_MS, now_ms=NOW + 3600 * 1000)

    assert totals.points == sum(1 for p in mine + extra if CUTOFF <= p.timestamp < later)
    got = stored(store_uri, run_id)
    assert_same({pk: row for pk, row in got.items() if pk[3] >= CUTOFF}, direct(run_id, [p for p in mine + extra if p.timestamp >= CUTOFF]))


def test_a_running_run_keeps_everything(store_uri, capsys):
    rng = random.Random(4)
    points = series(rng, "system/gpu_0_sm_active", NOW - 40 * DAY_MS, 1200)
    run_id = ended_run(store_uri, "running", points, end=False)
    before = stored(store_uri, run_id)

    assert radt_main(["retain", "--raw", "30d", "--store", store_uri]) == 0
    assert capsys.readouterr().err.startswith("radt retain: 0 runs, 0 raw points dropped")
    assert len(raw_points(store_uri, run_id)) == len(points)
    assert_same(stored(store_uri, run_id), before)
    assert raw_from(store_uri, run_id) == {"system/gpu_0_sm_active": None}


def test_dry_run_counts_what_would_go_and_changes_nothing(store_uri, capsys):
    rng = random.Random(5)
    old = series(rng, "system/gpu_0_sm_active", NOW - 40 * DAY_MS, 900)
    run_id = ended_run(store_uri, "dry", old + series(rng, "system/gpu_0_sm_active", NOW - DAY_MS, 60))
    before = stored(store_uri, run_id)

    assert radt_main(["retain", "--raw", "30d", "--store", store_uri, "--dry-run"]) == 0
    assert capsys.readouterr().err.startswith(f"radt retain: 1 run, {len(old)} raw points would drop")
    assert len(raw_points(store_uri, run_id)) == len(old) + 60
    assert_same(stored(store_uri, run_id), before)
    assert raw_from(store_uri, run_id) == {"system/gpu_0_sm_active": None}


def test_retain_errors_are_one_line(store_uri, tmp_path, capsys):
    for argv, said in (
        (["--raw", "30 days", "--store", store_uri], "--raw '30 days' is not a span of time; give minutes, hours, days or weeks"),
        (["--raw", "0d", "--store", store_uri], "is not a span of time"),
        (["--raw", "30d", "--store", "http://127.0.0.1:1"], "not a SQLite or PostgreSQL store"),
        (["--raw", "30d", "--store", "postgresql://postgres@127.0.0.1:1/none"], "unreachable"),
        (["--raw", "30d", "--store", str(tmp_path / "typo.db")], "no SQLite store at"),
    ):
        assert radt_main(["retain", *argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith("radt retain: ") and said in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert not (tmp_path / "typo.db").exists()  # no empty store made on a typo


def test_the_summary_stored_before_the_cut_is_what_the_dashboard_reads_after(store_uri):
    rng = random.Random(6)
    start = NOW - 40 * DAY_MS
    points = [
        p for key in ("system/gpu_0_sm_active", "system/gpu_0_power_usage_watts", "system/gpu_0_memory_usage_megabytes") for p in series(rng, key, start, 1800)
    ]
    run_id = ended_run(store_uri, "summary", [Point(p.key, abs(p.value) % 100, p.timestamp, p.step) for p in points])
    reader = make_read_engine(store_uri)
    whole = run_summary(reader, [run_id])
    assert whole["smact_mean"].notna().all() and whole["power_mean_w"].notna().all()

    retain.retain(store_uri, 30 * DAY_MS, now_ms=NOW)

    assert raw_points(store_uri, run_id) == []
    pd.testing.assert_frame_equal(store_summaries(reader, [run_id]), whole)
    reader.dispose()


class Crash(Exception):
    """radt retain dying at a statement (the process killed, the connection cut): nothing after it runs."""


@pytest.mark.parametrize(
    "statement, nth",
    [
        ("DELETE FROM metrics", 3),  # inside the second batch's cut, before its first run's points went
        ("UPDATE radt_rollup_series", 2),  # the second batch's points deleted, their cut not yet recorded
        ("UPDATE radt_summaries", 2),  # the second batch's summaries claimed, not yet filled
    ],
    ids=["delete", "mark-cut", "summary"],
)
def test_an_interrupted_retain_leaves_every_run_whole_or_cut_and_a_second_retain_finishes(store_uri, monkeypatch, statement, nth):
    """Killed mid-way, at the lowest boundary (a statement of the store's driver): each run is either untouched (its raw
    points all there, its rollups those of its points, no cut recorded) or cut (raw points from the cutoff only, the cut
    recorded, its rollups those before): never points gone with the cut unrecorded, which a rebuild would lose. A second
    retain cuts the rest; the rollups are those before the first."""
    rng = random.Random(10)
    client = MlflowClient(store_uri)
    experiment = client.create_experiment("interrupted")
    writer = SqlMetricStore(store_uri)
    points: dict[str, list[Point]] = {}
    for i in range(6):
        run_id = client.create_run(experiment).info.run_id
        points[run_id] = series(rng, "system/gpu_0_sm_active", CUTOFF - (90 + i) * 60_000, 3600) + series(rng, "loss", CUTOFF - 80 * 60_000, 900)
        writer.write(run_id, points[run_id])
        client.set_terminated(run_id)
    writer.close()
    before = stored(store_uri)
    monkeypatch.setattr(retain, "PROGRESS_EVERY", 2)  # three batches of two runs

    seen = [0]

    def crash(_conn, _cursor, sql, *_args):
        if sql.lstrip().startswith(statement):
            seen[0] += 1
            if seen[0] == nth:
                raise Crash(sql[:40])

    sa.event.listen(sa.engine.Engine, "before_cursor_execute", crash)
    try:
        with pytest.raises(Crash):
            retain.retain(store_uri, 30 * DAY_MS, now_ms=NOW)
    finally:
        sa.event.remove(sa.engine.Engine, "before_cursor_execute", crash)

    cut = whole = 0
    for run_id, mine in points.items():
        left, state = raw_points(store_uri, run_id), raw_from(store_uri, run_id)
        if set(state.values()) == {None}:
            whole += 1
            assert len(left) == len(mine), "an uncut run keeps every raw point"
            assert_same(stored(store_uri, run_id), direct(run_id, left))
        else:
            cut += 1
            assert state == dict.fromkeys({p.key for p in mine}, CUTOFF)
            assert sorted((p.key, p.timestamp) for p in left) == sorted((p.key, p.timestamp) for p in mine if p.timestamp >= CUTOFF)
            assert_same(stored(store_uri, run_id), {pk: row for pk, row in before.items() if pk[0] == run_id})
    assert (cut, whole) == (2, 4), "the first batch was cut, the second and third were not"

    totals = retain.retain(store_uri, 30 * DAY_MS, now_ms=NOW)

    assert (totals.runs, totals.points) == (4, sum(1 for run_id in list(points)[2:] for p in points[run_id] if p.timestamp < CUTOFF))
    for run_id, mine in points.items():
        assert raw_from(store_uri, run_id) == dict.fromkeys({p.key for p in mine}, CUTOFF)
        assert len(raw_points(store_uri, run_id)) == sum(1 for p in mine if p.timestamp >= CUTOFF)
    assert_same(stored(store_uri), before)
    reader = make_read_engine(store_uri)
    assert store_summaries(reader, list(points))["smact_mean"].notna().all(), "every run's whole summary was stored before its cut"
    reader.dispose()


def test_retain_over_many_small_runs_commits_per_batch_not_per_run(store_uri):
    """5,548 small runs took over 300 s (~290 points/s): each run was two transactions and a summary computed and
    stored on its own, four commits a run. A batch of runs shares its transactions now (bench/retain_many.py)."""
    rng = random.Random(11)
    client = MlflowClient(store_uri)
    experiment = client.create_experiment("many small")
    writer = SqlMetricStore(store_uri)
    runs = []
    for i in range(120):
        run_id = client.create_run(experiment, start_time=NOW - 40 * DAY_MS + i * 1000).info.run_id
        writer.write(run_id, series(rng, "system/gpu_0_sm_active", NOW - 40 * DAY_MS + i * 1000, 30))
        client.set_terminated(run_id)
        runs.append(run_id)
    writer.close()
    commits = [0]

    def count(_conn):
        commits[0] += 1

    sa.event.listen(sa.engine.Engine, "commit", count)
    try:
        totals = retain.retain(store_uri, 30 * DAY_MS, now_ms=NOW)
    finally:
        sa.event.remove(sa.engine.Engine, "commit", count)

    assert (totals.runs, totals.points) == (120, 120 * 30)
    assert commits[0] <= 12, f"{commits[0]} commits for 120 runs"
