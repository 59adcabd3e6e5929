"""The Cluster page from radt's jobs table (radt/jobtable.py, issue #56 item 3), on SQLite and the real PostgreSQL: a load
reads the tags of the jobs it shows only, not of every job (5 s at 100,000 jobs); the SQL ranks, totals and counts
exactly as rank_key and the Python definitions do on random jobs; a deleted run leaves the page; a job diagnosed again
shows its new findings; a store an older radt imported is backfilled once; a store that takes no write still shows its jobs."""

from __future__ import annotations

import contextlib
import math
import random
import re

import pytest
import sqlalchemy as sa
from mlflow import MlflowClient

from radt import jobtable, mlflowdb
from radt.app.db import jobs
from radt.app.db.store import make_read_engine
from radt.catalogue import MetricName
from radt.collectors.slurm.slurmacct import Job
from radt.collectors.store.stores import SqlMetricStore
from radt.diagnosis import CODES
from radt.footprint import rank_key
from radt.runmodel import DIAGNOSIS_TAG, FOOTPRINT_PREFIX, SLURM_PREFIX
from tests.support import jobfill
from tests.support.diagnosed import write_series
from tests.support.postgres import read_only_user

pytestmark = pytest.mark.dialects  # the SQL radt issues differs per dialect: SQLite and the real PostgreSQL

NOW = jobfill.START + 10 * 86_400_000
TAGS_READ = re.compile(r'\bFROM\s+"?tags"?|\bJOIN\s+"?tags"?', re.IGNORECASE)  # MLflow's run tags (not experiment_tags)


def _edgy(count: int, seed: int) -> list[jobfill.Imported]:
    """Jobs whose figures tie, are missing, not finite or held by Slurm's facts only, some running, ids that sort as
    text (10 before 9, 1235_3 after 12350), names empty; the ranking's every branch."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        start = jobfill.START + rng.choice((0, 0, 3_600_000, 7_200_000, i * 1000))
        running = rng.random() < 0.15
        end = None if running else start + rng.choice((0, 1_800_000, 3_600_000, 5_400_000))
        gpus = rng.choice((0, 1, 2, 4))
        job = Job(
            job_id=rng.choice(("9", "10", "1235_3", "12350", "77")) if i % 7 == 0 else str(1000 + rng.randrange(5000)),
            raw_id=str(i),
            name=f"j{i}",
            user=rng.choice(("alice", "bob", "", "carol")),
            account=rng.choice(("proj", "other", "x_y")),
            partition=rng.choice(("gpu", "cpu", "a100")),
            submit_ms=start,
            start_ms=start,
            end_ms=end,
            state="RUNNING" if running else rng.choice(("COMPLETED", "FAILED")),
            exit_code=0,
            signal=0,
            nodes=("n1",),
            gpus_requested=gpus,
            gpus={"n1": tuple(range(gpus))} if gpus and rng.random() < 0.5 else None,
        )
        tags: dict[str, str] = {}
        if rng.random() < 0.2:
            tags[f"{SLURM_PREFIX}gpus_requested"] = "unknown"
        if rng.random() < 0.75:
            codes = rng.sample((*CODES, "no_such_code"), rng.choice((0, 1, 2)))
            tags[DIAGNOSIS_TAG] = ",".join(codes)
            figures = {
                "idle_gpu_hours": rng.choice((None, "0", "0.5", "1", "1", "2.5", "nan", "inf")),
                "gpu_hours": rng.choice((None, "1", "2", "2", "4")),
                "energy_kwh": rng.choice((None, "0.25", "1.5")),
                "co2_kg": rng.choice((None, "0.125")),
                "cost": rng.choice((None, "2", "8")),
            }
            tags |= {f"{FOOTPRINT_PREFIX}{k}": v for k, v in figures.items() if v is not None}
            tags[f"{FOOTPRINT_PREFIX}basis"] = rng.choice(("400 gCO2eq/kWh", "300 gCO2eq/kWh", ""))
        out.append(jobfill.Imported(job, tags))
    return out


def _close(a, b) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
    return a == b


def test_the_sql_ranks_totals_and_counts_as_rank_key_and_the_python_definitions(store_uri):
    ids = jobfill.fill(store_uri, _edgy(400, seed=56))
    engine = make_read_engine(store_uri)
    try:
        rows = jobs.job_rows(engine, NOW)  # the backfill: no row was kept yet
        assert len(rows) == len(ids)
        ranked = sorted(rows, key=lambda x: (rank_key(x["figures"]), -(x["start_ms"] or 0), x["job"], x["run_id"]))
        assert [r["run_id"] for r in rows] == [r["run_id"] for r in ranked], "ORDER BY is rank_key, then the newest, then the job id as text"
        from_tags = jobs._rows_from_tags(engine, NOW)
        assert [r["run_id"] for r in from_tags] == [r["run_id"] for r in rows]
        for sql_row, tag_row in zip(rows, from_tags, strict=True):
            assert sql_row.keys() == tag_row.keys() and all(_close(sql_row[k], tag_row[k]) or k == "figures" for k in sql_row), (sql_row, tag_row)
            assert sql_row["figures"].keys() == tag_row["figures"].keys()
        for by in jobs.GROUPS:
            for chosen in (
                {},
                {"user": "alice"},
                {"user": ""},
                {jobs.FINDING: "idle_gpus"},
                {"account": "x_y", jobs.FINDING: "throttled"},
                {"partition": "a100"},
            ):
                sql = jobs.cluster(engine, by, chosen, 25, NOW)
                python = jobs.from_rows(from_tags, by, chosen, 25)
                assert (sql.has_jobs, sql.count, sql.findings, sql.bases) == (python.has_jobs, python.count, python.findings, python.bases), (by, chosen)
                assert [r["run_id"] for r in sql.rows] == [r["run_id"] for r in python.rows], (by, chosen)
                assert [g["name"] for g in sql.totals] == [g["name"] for g in python.totals], (by, chosen)
                for mine, theirs in zip(sql.totals, python.totals, strict=True):
                    assert mine.keys() == theirs.keys() and all(_close(mine[k], theirs[k]) for k in mine), (by, chosen, mine, theirs)
    finally:
        engine.dispose()


@pytest.fixture
def page(store_uri, monkeypatch):
    """The Cluster page's layout on the store, as the dashboard serves it (its pages registered with an app)."""
    from radt.app.web.dashboard import create_app

    monkeypatch.setenv("RADT_CLUSTER_ROWS", "20")
    create_app(store_uri, "simple")
    from radt.app.db.state import STATE
    from radt.pages import cluster

    return lambda **query: str(cluster.layout(**query)), STATE


@contextlib.contextmanager
def statements(engine: sa.Engine):
    """The statements and their parameters the engine sends."""
    sent: list[tuple[str, object]] = []
    listener = lambda _conn, _cursor, sql, params, _context, _many: sent.append((sql, params))  # noqa: E731
    sa.event.listen(engine, "before_cursor_execute", listener)
    try:
        yield sent
    finally:
        sa.event.remove(engine, "before_cursor_execute", listener)


def test_a_page_load_reads_the_tags_of_the_jobs_it_shows_only(store_uri, page):
    """Issue #56 item 3: every load read the tags of every job (470 ms at 10,000 jobs, 5 s at 100,000). After the first
    load (which keeps a row per job), a load reads tags for the 20 jobs it lists at most."""
    jobfill.fill(store_uri, jobfill.cluster_jobs(600, users=30))
    layout, state = page
    assert "cluster-jobs" in layout(), "the first load: the rows are made"
    with statements(state.engine) as sent:
        text = layout(by="account")
    assert "The 20 with the most idle GPU-hours of 600 jobs" in text
    reads = [(sql, params) for sql, params in sent if TAGS_READ.search(sql)]
    assert reads, "the findings' sentences of the jobs shown"
    for sql, params in reads:
        bound = params.values() if isinstance(params, dict) else params
        assert "run_uuid IN" in sql.replace('"', "") and len([p for p in bound if isinstance(p, str) and len(p) == 32]) <= 20, sql[:300]


def test_a_deleted_run_leaves_the_page_and_comes_back_restored(store_uri):
    ids = jobfill.fill(store_uri, jobfill.cluster_jobs(40, users=3))
    engine = make_read_engine(store_uri)
    try:
        assert len(jobs.job_rows(engine)) == 40
        client = MlflowClient(store_uri)
        client.delete_run(ids[0])
        assert ids[0] not in {r["run_id"] for r in jobs.job_rows(engine)} and jobs.cluster(engine, "user", {}, 5).count == 39
        client.restore_run(ids[0])
        assert ids[0] in {r["run_id"] for r in jobs.job_rows(engine)}
    finally:
        engine.dispose()


SACCT = (  # sacct --parsable2 as the tests' Slurm printed it: 2 GPUs for 1 h, and a job array's task
    "201|201|train|alice|proj|gpu|2026-11-20T10:00:00|2026-11-20T10:00:05|2026-11-20T11:00:05|COMPLETED|0:0|gpu01|"
    "billing=1,cpu=8,gres/gpu=2,node=1|radt-gres=gpu01>gpu:2(IDX:0-1)\n"
    "300_1|301|sweep|alice|proj|gpu|2026-11-20T10:00:00|2026-11-20T10:00:05|2026-11-20T10:30:05|COMPLETED|0:0|gpu02|"
    "billing=1,cpu=8,node=1|\n"
)


def test_a_job_diagnosed_again_shows_its_findings_and_a_workload_parent_is_read_once(store_uri):
    """The page's rows are kept: a diagnosis stored later (radt diagnose) makes its job's row again; the array's workload
    parent (no job) keeps a row without one, so no load reads it again."""
    from radt.collectors.cluster import slurmimport
    from radt.collectors.diagnose.stored import diagnose_and_store
    from radt.collectors.slurm import slurmacct
    from radt.collectors.store import tracking

    client = tracking.connect(store_uri)
    importer = slurmimport.JobImporter(client, store_uri)
    runs = {job.job_id: importer.job(job).run_id for job in slurmacct.parse_sacct(SACCT)}
    engine = make_read_engine(store_uri)
    try:
        assert [(r["job"], r["diagnosed"]) for r in jobs.job_rows(engine)] == [("201", False), ("300_1", False)]
        with engine.connect() as conn:
            assert jobtable.out_of_step(conn, jobtable.experiments(conn)) == [], "the workload parent has its row"
            kept = conn.execute(sa.select(jobtable.jobs.c.run_uuid).where(jobtable.jobs.c.job.is_(None))).scalars().all()
        assert len(kept) == 1 and kept[0] not in runs.values()
        # 201's GPU 0 busy, GPU 1 idle: diagnosed after its row was made
        writer = SqlMetricStore(store_uri)
        start = client.get_run(runs["201"]).info.start_time
        write_series(writer, runs["201"], MetricName.SM_ACTIVE, 0, start, 60, lambda m: 0.9)
        write_series(writer, runs["201"], MetricName.SM_ACTIVE, 1, start, 60, lambda m: 0.0)
        writer.close()
        diagnose_and_store(client, [runs["201"]])
        (row,) = [r for r in jobs.job_rows(engine) if r["job"] == "201"]
        assert row["codes"] == ["idle_gpus"] and row["idle_gpu_hours"] == pytest.approx(1.0, rel=1e-3), row
        assert jobs.cluster(engine, "user", {jobs.FINDING: "idle_gpus"}, 10).count == 1
    finally:
        engine.dispose()


def test_diagnosing_a_run_outside_slurm_experiments_makes_no_jobs_table(store_uri):
    from radt.collectors.diagnose.stored import diagnose_and_store
    from radt.collectors.store import tracking
    from tests.support.runs import radt_run

    client = tracking.connect(store_uri)
    run_id = radt_run(client, tracking.resolve_experiment(client, store_uri, "training"), "plain", start_time=jobfill.START)
    diagnose_and_store(client, [run_id])
    with client.engine.connect() as conn:
        if store_uri.startswith("sqlite"):
            assert not sa.inspect(conn).has_table(jobtable.jobs.name)
        else:  # the tests' PostgreSQL template holds radt's tables (tests/support/postgres.py)
            assert conn.execute(sa.select(sa.func.count()).select_from(jobtable.jobs)).scalar() == 0


def test_a_row_of_a_run_moved_out_of_slurm_experiments_goes(store_uri):
    """refresh() of a run that is no longer in a slurm- experiment (renamed) drops its row; the page never lists it."""
    ids = jobfill.fill(store_uri, jobfill.cluster_jobs(5, users=1))
    engine = sa.create_engine(store_uri)
    try:
        assert jobtable.refresh(engine, ids) == 5
        with engine.begin() as conn:
            e = mlflowdb.experiments.c
            conn.execute(sa.update(mlflowdb.experiments).where(e.name == "slurm-user000").values(name="renamed"))
        reader = make_read_engine(store_uri)
        assert jobs.job_rows(reader) == [] and not jobs.cluster(reader, "user", {}, 5).has_jobs
        reader.dispose()
        assert jobtable.refresh(engine, ids) == 0
        with engine.connect() as conn:
            assert conn.execute(sa.select(sa.func.count()).select_from(jobtable.jobs)).scalar() == 0
    finally:
        engine.dispose()


def test_a_store_that_takes_no_write_still_shows_its_jobs(pg_uri, caplog):
    """A read-only database user: the rows come from the jobs' tags on each load, said once in the log."""
    ids = jobfill.fill(pg_uri, jobfill.cluster_jobs(30, users=3))
    with read_only_user(pg_uri, ids[0][:12]) as reader_uri:
        reader = make_read_engine(reader_uri)
        try:
            for _ in range(2):
                view = jobs.cluster(reader, "user", {}, 10)
                assert view.has_jobs and view.count == 30 and len(view.rows) == 10
            said = [r.getMessage() for r in caplog.records if "cannot keep the jobs table" in r.getMessage()]
            assert len(said) == 1 and "\n" not in said[0], said
        finally:
            reader.dispose()


def test_a_large_backfill_stops_before_the_deadline_and_goes_on_at_the_next_load(store_uri, page, monkeypatch):
    """A store of jobs an older radt imported: each load makes the rows it has time for (a batch at least) and says how
    many runs are still to go, instead of running past RADT_REQUEST_TIMEOUT; a later load shows the jobs."""
    from radt.app.db import deadline

    imported = jobfill.cluster_jobs(2 * jobtable.CHUNK + 100, users=10)
    jobfill.fill(store_uri, imported)
    layout, _state = page
    monkeypatch.setattr(jobs, "MARGIN_S", 3600.0)  # every load's time is as good as spent after its first batch
    left = []
    deadline.start(60)
    try:
        for _ in range(3):
            text = layout()
            left.append(int(re.search(r"([\d,]+) runs to go", text).group(1).replace(",", "")) if "cluster-making" in text else 0)
    finally:
        deadline.clear()
    total = len(imported) + len({i.job.array_job for i in imported if i.job.array_job})  # the jobs and their arrays' workload parents
    assert left == [total - jobtable.CHUNK, total - 2 * jobtable.CHUNK, 0], left
    assert "cluster-jobs" in text and f"of {2 * jobtable.CHUNK + 100:,} jobs" in text
