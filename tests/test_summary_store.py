"""Run summaries written once per ended run (radt_summaries, app/summary/summarystore.py) and read after, on SQLite and the real
PostgreSQL: the same frame run_summary computes from the raw points, no raw point read for a stored run, and a run
whose points change (through radt's writer, or MLflow's client behind radt's back) computed again."""

from __future__ import annotations

import contextlib
import io
import math
import re

import numpy as np
import pandas as pd
import pytest
import sqlalchemy as sa
from mlflow import MlflowClient

from radt import rollups, summarytable
from radt.app.db.store import make_read_engine
from radt.app.summary.summaries import SUMMARY_VERSION, run_summary
from radt.app.summary.summarystore import UNAVAILABLE, readable, store_summaries
from radt.collectors.store.sqltracking import make_engine
from radt.collectors.store.stores import SqlMetricStore
from radt.points import Point
from tests.support.paths import FIXTURES
from tests.support.postgres import read_only_user
from tests.support.state import dashboard_reads
from tests.support.stores import import_five_gpus

pytestmark = pytest.mark.dialects  # the SQL radt issues differs per dialect: SQLite and the real PostgreSQL

BASE = 1_700_000_000_000
SMACT = "system/gpu_0_sm_active"
RAW = re.compile(r"\bmetrics\b", re.IGNORECASE)  # MLflow's raw points; latest_metrics is not them
FILTERS = ["smact.mean > 0.3", "smact.p95 >= 0.5 and power.mean > 100", "memory.peak > 10GB", "energy > 1kJ", "duration > 1m", "steps >= 5", "gpus.used = 1"]


@contextlib.contextmanager
def raw_reads(engine: sa.Engine):
    """The statements the engine sends that touch MLflow's `metrics` table: those SQLAlchemy sends
    ("before_cursor_execute"), and on PostgreSQL those sent on psycopg's cursor directly (app.db.store.binary_rows)."""
    seen: list[str] = []

    def count(_conn, _cursor, statement, *_args):
        if RAW.search(statement):
            seen.append(statement)

    sa.event.listen(engine, "before_cursor_execute", count)
    with pytest.MonkeyPatch.context() as mp:
        if engine.dialect.name == "postgresql":
            import psycopg

            execute = psycopg.Cursor.execute

            def sent(cursor, query, *args, **kwargs):
                count(None, cursor, str(query), *args)
                return execute(cursor, query, *args, **kwargs)

            mp.setattr(psycopg.Cursor, "execute", sent)
        try:
            yield seen
        finally:
            sa.event.remove(engine, "before_cursor_execute", count)


def _import_microbench(uri: str) -> str:
    """`radt import` of a real dcgmi dmon + nvidia-smi pair (one thread block of one thread on GPU 0 of five)."""
    from radt.collectors.imports import importer

    files = [str(FIXTURES / f"microbench_1.1_{f}") for f in ("dcgmi_dmon.txt", "nvidia_smi.csv")]
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert importer.main([*files, "-e", "microbench", "--start", "2023-02-20T10:00:00", "--store", uri]) == 0
    return out.getvalue().split()[-1]


def _all_runs(uri: str) -> list[str]:
    engine = make_engine(uri)
    with engine.connect() as conn:
        ids = rollups.run_ids(conn)
    engine.dispose()
    return ids


def _run(client: MlflowClient, uri: str, values, end: bool = True) -> str:
    """An ended run whose SMACT points radt's writer stored, one a second from BASE."""
    experiment = client.get_experiment_by_name("summaries") or client.get_experiment(client.create_experiment("summaries"))
    run_id = client.create_run(experiment.experiment_id, start_time=BASE).info.run_id
    store = SqlMetricStore(uri)
    store.write(run_id, [Point(SMACT, float(v), BASE + 1000 * i, i) for i, v in enumerate(values)])
    store.close()
    if end:
        client.set_terminated(run_id, "FINISHED", end_time=BASE + 1000 * len(values))
    return run_id


def test_stored_summaries_are_run_summarys_and_a_second_view_reads_no_raw_point(store_uri, fixtures_dir, monkeypatch):
    from radt.app.view import data, filters
    from radt.collectors import demo

    demo.write_demo(store_uri, minutes=2, report=lambda _line: None)
    imported = [import_five_gpus(store_uri), _import_microbench(store_uri)]
    ids = _all_runs(store_uri)
    engine = make_read_engine(store_uri)  # the dashboard's, which cannot write
    expected = run_summary(engine, ids)
    assert expected.set_index("run_id").loc[imported, "gpus_watched"].tolist() == [5, 5] and expected["smact_mean"].notna().sum() >= 10

    first = store_summaries(engine, ids)
    pd.testing.assert_frame_equal(first, expected, check_exact=True)
    with raw_reads(engine) as seen:
        again = store_summaries(engine, ids)
    pd.testing.assert_frame_equal(again, expected, check_exact=True)  # every column, NaN where NaN, the per-GPU energies
    assert seen == [], f"a stored summary reads no raw point: {seen}"
    engine.dispose()

    with dashboard_reads(store_uri, monkeypatch) as reader:  # a new dashboard process: its cache is empty
        runs = data.runs(list(dict.fromkeys(_experiments(store_uri))))
        with raw_reads(reader) as seen:
            table = data.summary(runs)
            kept = {text: set(filters.apply(runs, text)["run_id"]) for text in FILTERS}
        assert seen == []
        want = expected.set_index("run_id").loc[list(runs["run_id"])].reset_index()
        pd.testing.assert_frame_equal(table, want, check_exact=True, check_dtype=False)  # the table's frame, as data.summary builds it
        for text, found in kept.items():
            assert found == _filtered(runs, expected, text), text
        assert kept["gpus.used = 1"] and kept["smact.mean > 0.3"], "the filters keep some runs and leave others"


def _experiments(uri: str) -> list[str]:
    return [e.experiment_id for e in MlflowClient(uri).search_experiments()]


def _filtered(runs: pd.DataFrame, summary: pd.DataFrame, text: str) -> set[str]:
    """What the filter keeps with run_summary's own answers (the old path) in data.summary's place."""
    from radt.app.view import data, filters

    original = data.summary
    data.summary = lambda asked: summary[summary["run_id"].isin(list(asked["run_id"]))].reset_index(drop=True)
    try:
        return set(filters.apply(runs, text)["run_id"])
    finally:
        data.summary = original


def test_a_point_radt_adds_to_an_ended_run_computes_its_summary_again(store_uri):
    """`radt sync` uploads a spooled batch after the run ended, older than its latest point: latest_metrics and the
    fingerprint stay as they were, the writer drops the stored summary."""
    client = MlflowClient(store_uri)
    run_id = _run(client, store_uri, [0.2] * 60)
    engine = make_read_engine(store_uri)
    assert store_summaries(engine, [run_id])["smact_mean"].tolist() == [pytest.approx(0.2)]
    store = SqlMetricStore(store_uri)
    store.write(run_id, [Point(SMACT, 1.0, BASE + 500 + 1000 * i, 0) for i in range(60)])  # between the others, step 0
    store.close()
    with raw_reads(engine) as seen:
        found = store_summaries(engine, [run_id])
    assert seen, "computed again from the raw points"
    assert found["smact_mean"].tolist() == [pytest.approx(0.6)]
    pd.testing.assert_frame_equal(found, run_summary(engine, [run_id]), check_exact=True)
    engine.dispose()


def test_a_run_changed_through_mlflows_client_is_computed_again(store_uri):
    client = MlflowClient(store_uri)
    run_id = _run(client, store_uri, [0.2] * 60)
    other = _run(client, store_uri, [0.4] * 60)
    engine = make_read_engine(store_uri)
    store_summaries(engine, [run_id, other])
    client.log_metric(run_id, SMACT, 0.8, timestamp=BASE + 60_000, step=60)  # a script's mlflow.log_metric, behind radt's back
    client.set_terminated(other, "FINISHED", end_time=BASE + 120_000)
    found = store_summaries(engine, [run_id, other]).set_index("run_id")
    assert found.loc[run_id, "smact_mean"] == pytest.approx((0.2 * 60 + 0.8) / 61)
    assert found.loc[other, "duration_s"] == pytest.approx(120.0)
    pd.testing.assert_frame_equal(found.reset_index(), run_summary(engine, [run_id, other]), check_exact=True)
    with raw_reads(engine) as seen:
        store_summaries(engine, [run_id, other])
    assert seen == [], "stored again once computed"
    engine.dispose()


def test_running_runs_are_computed_on_each_view_and_never_stored(store_uri):
    client = MlflowClient(store_uri)
    run_id = _run(client, store_uri, [0.3] * 10, end=False)
    engine = make_read_engine(store_uri)
    store_summaries(engine, [run_id])
    with raw_reads(engine) as seen:
        assert store_summaries(engine, [run_id])["smact_mean"].tolist() == [pytest.approx(0.3)]
    assert seen, "a running run grows: read from its points"
    with engine.connect() as conn:
        assert summarytable.read(conn, [run_id]) == {}
    engine.dispose()


def test_a_run_radt_retain_cut_keeps_its_stored_summary_or_says_it_is_lost(store_uri):
    """Once older raw points are dropped, what is left gives other numbers: the stored row stands whatever changed since,
    and a run cut before its summary was stored shows none rather than one of part of the run."""
    client = MlflowClient(store_uri)
    kept, lost = _run(client, store_uri, [0.2] * 30 + [0.8] * 30), _run(client, store_uri, [0.2] * 30 + [0.8] * 30)
    engine = make_read_engine(store_uri)
    before = store_summaries(engine, [kept])
    writer = make_engine(store_uri)
    with writer.begin() as conn:  # what `radt retain` leaves: the first half's raw points gone, the series marked
        conn.execute(sa.delete(rollups.mlflowdb.metrics).where(rollups.mlflowdb.metrics.c.timestamp < BASE + 30_000))
        conn.execute(sa.update(rollups.series_state).values(raw_from_ms=BASE + 30_000))
    writer.dispose()
    client.set_tag(kept, "radt.host", "elsewhere")  # the fingerprint changes
    found = store_summaries(engine, [kept, lost]).set_index("run_id")
    assert found.loc[kept, "smact_mean"] == before["smact_mean"][0] == pytest.approx(0.5)
    assert found.loc[lost, "gpus_text"] == UNAVAILABLE and math.isnan(found.loc[lost, "smact_mean"])
    assert run_summary(engine, [lost])["smact_mean"][0] == pytest.approx(0.8), "what computing again would have shown"
    engine.dispose()


def test_a_cut_runs_row_of_a_version_that_lacked_only_new_columns_still_stands(store_uri):
    """Version 3 added run_memory_peak_mb, version 4 defined gpu_memory_peak_mb anew (the used GPUs', a slice's own): a run
    cut under version 2 keeps its stored figures, those two empty, instead of losing them all as 'unavailable'; a row of
    a version whose figures changed since is still refused, and an uncut run's old row is computed again."""
    client = MlflowClient(store_uri)
    runs = [_run(client, store_uri, [0.2] * 30 + [0.8] * 30) for _ in range(3)]
    engine = make_read_engine(store_uri)
    store_summaries(engine, runs)
    s = summarytable.summaries
    writer = make_engine(store_uri)
    with writer.begin() as conn:
        for run_id, version in zip(runs, (2, 1, 2), strict=True):  # as versions 2 and 1 stored them: no run_memory_peak_mb
            row = summarytable.read(conn, [run_id])[run_id].summary
            row.pop("run_memory_peak_mb")
            row["gpu_memory_peak_mb"] = 70_000.0  # as version 2 defined it: every watched GPU's, the whole GPU's for a slice
            conn.execute(sa.update(s).where(s.c.run_uuid == run_id).values(version=version, summary=summarytable.encode(row)))
        cut = rollups.mlflowdb.metrics.c.run_uuid.in_(runs[:2])
        conn.execute(sa.delete(rollups.mlflowdb.metrics).where(cut, rollups.mlflowdb.metrics.c.timestamp < BASE + 30_000))
        conn.execute(sa.update(rollups.series_state).where(rollups.series_state.c.run_uuid.in_(runs[:2])).values(raw_from_ms=BASE + 30_000))
    writer.dispose()
    found = store_summaries(engine, runs).set_index("run_id")
    assert found.loc[runs[0], "smact_mean"] == pytest.approx(0.5) and math.isnan(found.loc[runs[0], "run_memory_peak_mb"])
    assert math.isnan(found.loc[runs[0], "gpu_memory_peak_mb"]), "version 2's figure of a column defined anew since is not shown"
    assert found.loc[runs[1], "gpus_text"] == UNAVAILABLE, "version 1's figures are not this version's"
    figures = found.loc[runs[0]].to_dict()
    assert readable(summarytable.Stored(SUMMARY_VERSION, "", figures)), "this version's row"
    assert not readable(summarytable.Stored(SUMMARY_VERSION + 1, "", figures)), "a newer radt's row: other definitions"
    assert found.loc[runs[2], "smact_mean"] == pytest.approx(0.5)
    with engine.connect() as conn:
        assert summarytable.read(conn, [runs[2]])[runs[2]].version == SUMMARY_VERSION, "an uncut run's old row is computed again"
    engine.dispose()


def test_summary_table_leaves_mlflow_schema_alone(store_uri):
    client = MlflowClient(store_uri)
    run_id = _run(client, store_uri, np.linspace(0, 1, 20))
    engine = make_engine(store_uri)
    with engine.connect() as conn:
        tables = set(sa.inspect(conn).get_table_names())
        revision = conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalars().all()
    reader = make_read_engine(store_uri)
    store_summaries(reader, [run_id])
    reader.dispose()
    with engine.connect() as conn:
        assert set(sa.inspect(conn).get_table_names()) == tables | {"radt_summaries"}
        assert conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalars().all() == revision
        assert conn.execute(sa.select(summarytable.summaries.c.run_uuid)).scalars().all() == [run_id]
    engine.dispose()
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore  # what `mlflow server` and the UI open

    store = SqlAlchemyStore(store_uri, "/tmp/radt-summary-artifacts")
    assert store.get_run(run_id).data.metrics[SMACT] == 1.0
    assert len(store.get_metric_history(run_id, SMACT)) == 20


def test_a_store_that_takes_no_write_still_shows_summaries(pg_uri, caplog):
    """A read-only database user: summaries are computed on each view, said once in the log."""
    client = MlflowClient(pg_uri)
    run_id = _run(client, pg_uri, [0.25] * 10)
    with read_only_user(pg_uri, run_id[:12]) as reader_uri:
        reader = make_read_engine(reader_uri)
        try:
            for _ in range(2):
                assert store_summaries(reader, [run_id])["smact_mean"].tolist() == [pytest.approx(0.25)]
            said = [r.getMessage() for r in caplog.records if "cannot store run summaries" in r.getMessage()]
            assert len(said) == 1 and "\n" not in said[0], said
        finally:
            reader.dispose()
