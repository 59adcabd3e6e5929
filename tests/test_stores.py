"""The bulk SQL path must read back through MLflow exactly as if MLflow's own log_batch wrote it, and no store call waits forever."""

from __future__ import annotations

import math
import os
import socket
import sqlite3
import threading
import time

import psycopg2
import pytest
import sqlalchemy as sa
from mlflow import MlflowClient
from mlflow.entities import Metric

from radt.collectors.store.stores import MlflowMetricStore, SqlMetricStore, StoreUnavailable, open_metric_store, sanitize
from radt.collectors.store.tracking import PROCESS_ONLY_ENV
from radt.collectors.store.writer import MetricWriter
from radt.points import Point
from tests.support.polling import wait_for

pytestmark = pytest.mark.dialects  # the SQL radt issues differs per dialect: SQLite and the real PostgreSQL


def _points() -> list[Point]:
    base = 1_700_000_000_000
    pts = []
    for step in range(50):
        pts.append(Point("system/gpu_0_sm_active", (step % 7) / 7, base + step * 1000, step))
        pts.append(Point("system/cpu_utilization_percentage", 10.0 + step, base + step * 1000, step))
    # out of order: an older step arriving late must not become the latest value
    pts.append(Point("system/gpu_0_power_usage_watts", 300.0, base + 5000, 5))
    pts.append(Point("system/gpu_0_power_usage_watts", 100.0, base + 2000, 2))
    # NaN and infinities follow MLflow's rule
    pts.append(Point("odd", float("nan"), base, 0))
    pts.append(Point("odd", float("inf"), base + 1, 1))
    pts.append(Point("odd", float("-inf"), base + 2, 2))
    # same timestamp, same step, different values: both kept, the larger is latest (MLflow's tie-break)
    pts.append(Point("tie", 1.0, base, 3))
    pts.append(Point("tie", 2.0, base, 3))
    return pts


def _history(client: MlflowClient, run_id: str, key: str):
    return sorted((m.step, m.timestamp, m.value if not math.isnan(m.value) else "nan") for m in client.get_metric_history(run_id, key))


@pytest.mark.parametrize("split", [1, 3])
def test_bulk_path_reads_back_like_log_batch(store_uri, split):
    client = MlflowClient(store_uri)
    experiment = client.create_experiment("equivalence")
    ours = client.create_run(experiment).info.run_id
    theirs = client.create_run(experiment).info.run_id
    points = _points()

    store = SqlMetricStore(store_uri)
    chunk = math.ceil(len(points) / split)
    for start in range(0, len(points), chunk):
        store.write(ours, points[start : start + chunk])
    store.close()
    client.log_batch(theirs, metrics=[Metric(p.key, p.value, p.timestamp, p.step) for p in points])

    for key in {p.key for p in points}:
        assert _history(client, ours, key) == _history(client, theirs, key), key
    ours_latest = client.get_run(ours).data.metrics
    theirs_latest = client.get_run(theirs).data.metrics
    assert ours_latest.keys() == theirs_latest.keys()
    for key, value in theirs_latest.items():
        if math.isnan(value):
            assert math.isnan(ours_latest[key])
        else:
            assert ours_latest[key] == value, key
    assert ours_latest["system/gpu_0_power_usage_watts"] == 300.0
    assert ours_latest["tie"] == 2.0
    assert ours_latest["system/cpu_utilization_percentage"] == 59.0


def test_replaying_a_batch_adds_nothing(store_uri):
    client = MlflowClient(store_uri)
    run_id = client.create_run(client.create_experiment("replay")).info.run_id
    store = open_metric_store(store_uri)
    assert isinstance(store, SqlMetricStore)
    points = _points()
    store.write(run_id, points)
    store.write(run_id, points[:20])  # a spool replayed after a half-acknowledged write
    assert len(client.get_metric_history(run_id, "system/gpu_0_sm_active")) == 50
    assert client.get_run(run_id).data.metrics["system/gpu_0_sm_active"] == pytest.approx(49 % 7 / 7)


def test_latest_metrics_only_moves_forward_across_batches(store_uri):
    client = MlflowClient(store_uri)
    run_id = client.create_run(client.create_experiment("forward")).info.run_id
    store = SqlMetricStore(store_uri)
    store.write(run_id, [Point("k", 5.0, 2000, 10)])
    store.write(run_id, [Point("k", 1.0, 3000, 4)])  # later wall clock, earlier step: MLflow orders by step first
    assert client.get_run(run_id).data.metrics["k"] == 5.0
    store.write(run_id, [Point("k", 7.0, 1000, 11)])
    assert client.get_run(run_id).data.metrics["k"] == 7.0


def test_sanitize_matches_mlflow():
    assert sanitize(float("nan")) == (0.0, True)
    assert sanitize(float("inf")) == (1.7976931348623157e308, False)
    assert sanitize(-float("inf")) == (-1.7976931348623157e308, False)
    assert sanitize(0.5) == (0.5, False)


def test_http_uri_uses_mlflow_client():
    assert isinstance(open_metric_store("http://127.0.0.1:1"), MlflowMetricStore)


def _error_of(call) -> BaseException | None:
    try:
        call()
    except BaseException as exc:
        return exc
    return None


def test_a_write_blocked_by_a_lock_fails_within_the_store_timeout(store_uri, monkeypatch):
    """A store that holds the table (a long transaction, a migration) answers the writer within RADT_STORE_TIMEOUT, not never."""
    monkeypatch.setenv("RADT_STORE_TIMEOUT", "1")
    client = MlflowClient(store_uri)
    run_id = client.create_run(client.create_experiment("locked")).info.run_id
    store = SqlMetricStore(store_uri)
    if store_uri.startswith("sqlite"):
        blocker = sqlite3.connect(store_uri[len("sqlite:///") :], isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")  # another writer holds SQLite's write lock
    else:
        blocker = psycopg2.connect(store_uri)
        blocker.cursor().execute("LOCK TABLE metrics IN ACCESS EXCLUSIVE MODE")  # held until rollback
    try:
        started = time.monotonic()
        outcome: list[BaseException | None] = []
        writer = threading.Thread(target=lambda: outcome.append(_error_of(lambda: store.write(run_id, [Point("k", 1.0, 1000, 0)]))), daemon=True)
        writer.start()
        writer.join(10)
        assert outcome, "the write still hangs after 10 s"
        assert isinstance(outcome[0], sa.exc.OperationalError), outcome
        assert time.monotonic() - started < 3, "statement_timeout / busy timeout end the wait"
    finally:
        blocker.rollback() if not store_uri.startswith("sqlite") else blocker.execute("ROLLBACK")
        blocker.close()
    store.write(run_id, [Point("k", 1.0, 1000, 0)])  # the same store carries on once the lock is gone
    assert [m.value for m in client.get_metric_history(run_id, "k")] == [1.0]
    store.close()


def test_mlflow_server_errors_are_one_line(monkeypatch):
    for name, value in PROCESS_ONLY_ENV.items():  # what radt sets in its own process, undone after the test
        monkeypatch.setenv(name, os.environ.get(name, value))
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES")
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_TIMEOUT")
    store = MlflowMetricStore("http://127.0.0.1:1")  # nobody listens on port 1
    started = time.monotonic()
    with pytest.raises(StoreUnavailable) as caught:
        store.write("0" * 32, [Point("k", 1.0, 1000, 0)])
    assert str(caught.value).startswith("mlflow server http://127.0.0.1:1 unreachable ([Errno 111] Connection refused")
    assert time.monotonic() - started < 2, "radt's client does not retry for minutes (MLflow's default)"


def test_an_mlflow_server_that_takes_the_request_and_never_answers_is_not_answering(monkeypatch, tmp_path):
    """A frozen `mlflow server` (SIGSTOP, a full worker pool): MLflow's read timeout fired before radt's own deadline and
    the writer said 'store unreachable (... unreachable (Read timed out))' for a server it had reached (seen in test_outage
    under load, where the writer's deadline and MLflow's timeout race); it is 'not answering', as that deadline says."""
    from radt.collectors.store.stores import StoreNotAnswering

    for name, value in PROCESS_ONLY_ENV.items():
        monkeypatch.setenv(name, os.environ.get(name, value))
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "1")
    with socket.socket() as silent:  # accepts (the kernel's backlog) and never replies
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        uri = f"http://127.0.0.1:{silent.getsockname()[1]}"
        with pytest.raises(StoreNotAnswering) as caught:
            MlflowMetricStore(uri).write("0" * 32, [Point("k", 1.0, 1000, 0)])
    assert str(caught.value) == f"mlflow server {uri} sent no reply (Read timed out)"

    # the writer's own outage line, through a real writer whose deadline (30 s) is not the one that fires
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        uri = f"http://127.0.0.1:{silent.getsockname()[1]}"
        lines: list[str] = []
        writer = MetricWriter(
            MlflowMetricStore(uri), "0" * 32, tmp_path / "spool.jsonl", flush_interval=0.05, retry_interval=60, report=lines.append, store_timeout=30
        ).start()
        writer.put([Point("k", 1.0, 1000, 0)])
        wait_for(lambda: lines, what="the writer's outage line")
        writer.close(timeout=0)
    assert lines[0].startswith(f"radt: store not answering (mlflow server {uri} sent no reply (Read timed out)); 1 points spooled to"), lines


def _rollup_rows(store_uri: str, run_id: str) -> list[tuple]:
    from radt import rollups

    engine = sa.create_engine(store_uri)
    with engine.connect() as conn:
        t = rollups.rollups
        rows = conn.execute(sa.select(*(c for c in t.c if c.name != "run_uuid")).where(t.c.run_uuid == run_id)).all()
    engine.dispose()
    return sorted(map(tuple, rows))


def test_several_runs_written_in_one_transaction_hold_what_each_written_alone_holds(store_uri):
    """An import's many short jobs go in one call (write_runs): every run's points, latest values and rollups are what
    its own write makes, a second call continuing each run's buckets too (the staging tables reused within one call)."""
    client = MlflowClient(store_uri)
    experiment = client.create_experiment("many")
    base = 1_700_000_000_000
    batches = []
    for part in range(2):  # the second call continues buckets the first began (the rollups' merge path)
        batches.append(
            {
                n: [
                    Point(f"system/gpu_{g}_sm_active", ((s + n) % 9) / 9, base + s * 1000 + n, s) for s in range(part * 150, part * 150 + 150) for g in range(2)
                ]
                for n in range(3)
            }
        )
    together = [client.create_run(experiment).info.run_id for _ in range(3)]
    alone = [client.create_run(experiment).info.run_id for _ in range(3)]
    store = SqlMetricStore(store_uri)
    for batch in batches:
        store.write_runs({together[n]: points for n, points in batch.items()})
        for n, points in batch.items():
            store.write(alone[n], points)
    store.write_runs({together[0]: batches[0][0][:30], together[1]: []})  # replayed and empty: nothing added, nothing fails
    store.close()
    for mine, theirs in zip(together, alone, strict=True):
        for key in ("system/gpu_0_sm_active", "system/gpu_1_sm_active"):
            assert _history(client, mine, key) == _history(client, theirs, key)
            assert len(_history(client, mine, key)) == 300
        assert client.get_run(mine).data.metrics == client.get_run(theirs).data.metrics
        assert _rollup_rows(store_uri, mine) == _rollup_rows(store_uri, theirs) != []
