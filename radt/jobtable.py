"""Imported Slurm jobs: one row per run of a Slurm experiment in radt's own table beside MLflow's, so the Cluster page
sorts, pages and totals 100,000 jobs in SQL instead of reading every job's tags on each load.

A row holds what the page shows, narrows and ranks by, read from the run's tags by `row_of` (the one reading of the
radt.slurm.*, radt.diagnosis and radt.footprint.* tags a job's run holds): its facts, its diagnosis codes as
",idle_gpus,input_starved," (a finding is one LIKE) and its footprint figures. The table holds a row for each active run
of the active slurm- experiments and no other; a run that is no job (an array's workload parent) has one without a job,
so it is not read again. `refresh(engine, run_ids)` makes these runs' rows again: radt calls it after it writes their
tags (`radt import --slurm`, every diagnosis stored); a dashboard calls it before it reads, for the runs `out_of_step`
finds (a store an older radt imported, another writer's runs, runs deleted, restored or moved).

`order(now_ms)` is footprint.rank_key in SQL, then the newest first, then the job id as text (tests/test_jobtable.py
holds it to rank_key on random jobs, on SQLite and PostgreSQL).

No foreign key, its own metadata: MLflow's tables and alembic_version are never touched.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import sqlalchemy as sa

from radt import mlflowdb, rollups
from radt.diagnosis import codes_of
from radt.footprint import figures_of
from radt.runmodel import (
    DIAGNOSIS_TAG,
    FOOTPRINT_PREFIX,
    NO_SERIES_TAG,
    SLURM_EXPERIMENT_PREFIX,
    SLURM_JOB_TAG,
    SLURM_PARTITION_TAG,
    SLURM_PREFIX,
    gpus_in_tag,
)

GROUPS = ("user", "account", "partition")  # what the Cluster page totals and narrows by (columns of the table)
FACTS = {f"{SLURM_PREFIX}user": "user", f"{SLURM_PREFIX}account": "account", SLURM_PARTITION_TAG: "partition", f"{SLURM_PREFIX}state": "state"}
GPUS_REQUESTED, GPUS_USED = f"{SLURM_PREFIX}gpus_requested", f"{SLURM_PREFIX}gpus_used"
FIGURES = ("gpu_hours", "idle_gpu_hours", "energy_kwh", "co2_kg", "cost")  # radt.footprint.<figure> the table keeps
BASIS_TAG = f"{FOOTPRINT_PREFIX}basis"
READ_TAGS = (SLURM_JOB_TAG, *FACTS, GPUS_REQUESTED, GPUS_USED, NO_SERIES_TAG, DIAGNOSIS_TAG, *(f"{FOOTPRINT_PREFIX}{name}" for name in FIGURES), BASIS_TAG)
CHUNK = 500  # run ids per IN list and per transaction of a refresh: a long backfill keeps what it did
HOUR_MS = 3_600_000

metadata = sa.MetaData()
_NAME = sa.String(8000)  # as long as the tag it comes from

jobs = sa.Table(
    "radt_jobs",
    metadata,
    sa.Column("run_uuid", sa.String(32), nullable=False),
    sa.Column("experiment_id", sa.Integer, nullable=False),
    sa.Column("job", _NAME, nullable=True),  # radt.slurm.job_id; NULL: a run of a Slurm experiment that is no job
    sa.Column("user", _NAME, nullable=False),  # '' where the tag is missing, as the page shows it
    sa.Column("account", _NAME, nullable=False),
    sa.Column("partition", _NAME, nullable=False),
    sa.Column("state", _NAME, nullable=False),
    sa.Column("gpus", sa.Integer, nullable=True),  # those it used, else those it asked for; NULL: not known
    sa.Column("start_ms", sa.BigInteger, nullable=True),
    sa.Column("end_ms", sa.BigInteger, nullable=True),
    sa.Column("diagnosed", sa.Boolean, nullable=False),
    sa.Column("codes", sa.String(1000), nullable=False),  # ",code,code," in the catalogue's order; '' without a finding
    *(sa.Column(name, sa.Float(precision=53), nullable=True) for name in FIGURES),  # NULL: no such figure (or none finite)
    sa.Column("basis", sa.Text, nullable=False),
    sa.Column("no_series", sa.Text, nullable=False),
    sa.PrimaryKeyConstraint("run_uuid", name="radt_jobs_pk"),
    # out_of_step's prints from the index alone. No index on user / account / partition: a scan of 100,000 rows is
    # ~30 ms, and SQLite grouped by one in its order (a lookup per row) 2-4x slower than a scan and a sort
    sa.Index("radt_jobs_experiment", "experiment_id", "start_ms", "end_ms"),
)

_OWN = rollups.OwnTable(jobs)


def ensure_table(engine: sa.Engine) -> None:
    """Create radt_jobs where it is missing; two processes may race to create it: the loser finds it made."""
    _OWN.ensure(engine)


def has_table(conn: sa.Connection) -> bool:
    """Whether the store holds radt_jobs (remembered per engine once it does: the table is never dropped)."""
    return _OWN.held(conn)


# --- a run's row from its tags ----------------------------------------------------------------------------------------


def gpus_of(tags: Mapping[str, str]) -> int | None:
    """The job's GPUs: those it used, else those it requested; None where the import could not count them."""
    count = gpus_in_tag(tags.get(GPUS_USED) or "")
    requested = tags.get(GPUS_REQUESTED) or ""
    return count or (int(requested) if requested.isdigit() else None)


def codes_text(codes: Sequence[str]) -> str:
    """The codes as stored: ',idle_gpus,input_starved,' ('' for none), so `finding` is one LIKE."""
    return f",{','.join(codes)}," if codes else ""


def codes_in(text: str) -> list[str]:
    """codes_text's inverse."""
    return [code for code in (text or "").split(",") if code]


def row_of(run_id: str, experiment_id: int, start_ms: int | None, end_ms: int | None, tags: Mapping[str, str]) -> dict:
    """The table's row of a run of a Slurm experiment from its tags (job None: the run is no job)."""
    figures = figures_of({f"{FOOTPRINT_PREFIX}{name}": tags[f"{FOOTPRINT_PREFIX}{name}"] for name in FIGURES if f"{FOOTPRINT_PREFIX}{name}" in tags})
    row = {"run_uuid": run_id, "experiment_id": int(experiment_id), "start_ms": start_ms, "end_ms": end_ms}
    row |= {name: tags.get(key) or "" for key, name in FACTS.items()}
    row["job"] = tags.get(SLURM_JOB_TAG)  # None: no job ('' is one: the tag is there)
    row |= {"gpus": gpus_of(tags), "diagnosed": DIAGNOSIS_TAG in tags, "codes": codes_text(codes_of(tags))}
    row |= {name: figures.get(name) for name in FIGURES}
    return row | {"basis": tags.get(BASIS_TAG) or "", "no_series": tags.get(NO_SERIES_TAG) or ""}


def experiments(conn: sa.Connection) -> list[int]:
    """The ids of the active slurm- experiments (one per user or account: a list bound into the queries below, so no
    plan joins MLflow's experiments, whose statistics a fresh import leaves wrong)."""
    e = mlflowdb.experiments.c
    query = sa.select(e.experiment_id).where(e.name.startswith(SLURM_EXPERIMENT_PREFIX, autoescape=True), e.lifecycle_stage == mlflowdb.ACTIVE)
    return sorted(conn.execute(query).scalars())


def _belongs(kept: Sequence[int]) -> list:
    """The conditions on MLflow's runs of those that get a row: active, in an active slurm- experiment."""
    r = mlflowdb.runs.c
    return [r.lifecycle_stage == mlflowdb.ACTIVE, r.experiment_id.in_(kept)]


def read_rows(conn: sa.Connection, run_ids: Sequence[str], kept: Sequence[int] | None = None) -> dict[str, dict]:
    """run id -> its row, for those of the runs that get one (active, in an active slurm- experiment: `kept`, read where
    not given), from MLflow's tables."""
    r, t = mlflowdb.runs.c, mlflowdb.tags.c
    kept = experiments(conn) if kept is None else kept
    out: dict[str, dict] = {}
    for part in rollups.chunks(list(run_ids), CHUNK):
        runs = {
            run_id: rest
            for run_id, *rest in _tuples(conn, sa.select(r.run_uuid, r.experiment_id, r.start_time, r.end_time).where(r.run_uuid.in_(part), *_belongs(kept)))
        }
        tags: dict[str, dict[str, str]] = {run_id: {} for run_id in runs}
        if runs:
            for run_id, key, value in _tuples(conn, sa.select(t.run_uuid, t.key, t.value).where(t.run_uuid.in_(list(runs)), t.key.in_(READ_TAGS))):
                tags[run_id][key] = value or ""
        out.update((run_id, row_of(run_id, *facts, tags[run_id])) for run_id, facts in runs.items())
    return out


def _tuples(conn: sa.Connection, stmt) -> list[tuple]:
    """The DBAPI's plain tuples (no Row object per row: a backfill reads a million tags)."""
    result = conn.execute(stmt)
    try:
        return result.cursor.fetchall() if result.cursor is not None else []
    finally:
        result.close()


# --- keeping the rows -------------------------------------------------------------------------------------------------


def refresh(engine: sa.Engine, run_ids: Sequence[str]) -> int:
    """Compute these runs' rows again from their tags, CHUNK runs a transaction; a run that gets no row (deleted, gone,
    outside the active slurm- experiments) loses the one it had. Makes the table only where one of the runs needs a row.
    The number of job rows written."""
    written, kept = 0, None
    for part in rollups.chunks(list(dict.fromkeys(run_ids)), CHUNK):
        with engine.connect() as conn:
            kept = experiments(conn) if kept is None else kept
            rows = read_rows(conn, part, kept)
            if not rows and not has_table(conn):
                continue
        ensure_table(engine)
        gone = [run_id for run_id in part if run_id not in rows]
        with engine.begin() as conn:
            if gone:
                conn.execute(sa.delete(jobs).where(jobs.c.run_uuid.in_(gone)))
            if rows:
                conn.execute(_upsert(conn.dialect.name), [rows[run_id] for run_id in sorted(rows)])  # in key order: two refreshes never deadlock
        written += sum(row["job"] is not None for row in rows.values())
    return written


def _upsert(dialect: str):
    stmt = mlflowdb.dialect_insert(dialect, "the jobs table")(jobs)
    return stmt.on_conflict_do_update(index_elements=[jobs.c.run_uuid], set_={c.name: stmt.excluded[c.name] for c in jobs.columns if c.name != "run_uuid"})


def slurm_runs(conn: sa.Connection, kept: Sequence[int]) -> list[str]:
    """The runs that get a row: active, in the active slurm- experiments `kept`."""
    return list(conn.execute(sa.select(mlflowdb.runs.c.run_uuid).where(*_belongs(kept))).scalars())


def out_of_step(conn: sa.Connection, kept: Sequence[int]) -> list[str]:
    """The runs whose row is missing, should be gone or holds another start or end: those a dashboard refreshes before
    it reads the table. A run made by a writer that does not refresh (an older radt, MLflow's client) has no row; a run
    deleted, restored or gone from the store (mlflow gc), or of an experiment deleted or renamed, one too many or too
    few; a run another writer ended, another end.

    Each experiment's runs and rows are compared first by a print (how many, their starts and ends: one scan of each
    table); only the runs of experiments whose prints differ are compared one by one (an anti-join each way). A run
    deleted and another made with the same times in the same experiment by another writer is not seen."""
    if not has_table(conn):
        return slurm_runs(conn, kept)
    r, j = mlflowdb.runs.c, jobs.c
    runs = _prints(conn, r.experiment_id, r.start_time, r.end_time, _belongs(kept))
    rows = _prints(conn, j.experiment_id, j.start_ms, j.end_ms, [])  # an experiment deleted or renamed since: its rows go
    differ = sorted(e for e in runs.keys() | rows.keys() if runs.get(e) != rows.get(e))
    if not differ:
        return []
    same = sa.select(sa.literal(1)).where(j.run_uuid == r.run_uuid, sa.func.coalesce(j.start_ms, -1) == sa.func.coalesce(r.start_time, -1))
    same = same.where(sa.func.coalesce(j.end_ms, -1) == sa.func.coalesce(r.end_time, -1)).exists()
    belongs = sa.select(sa.literal(1)).where(r.run_uuid == j.run_uuid, *_belongs(kept)).exists()
    missing = conn.execute(sa.select(r.run_uuid).where(*_belongs(sorted(set(differ) & set(kept))), ~same)).scalars().all()
    extra = conn.execute(sa.select(j.run_uuid).where(j.experiment_id.in_(differ), ~belongs)).scalars().all()
    return [*missing, *extra]


PRINT_MOD = 1_000_003  # a start or end is summed modulo this prime: 10 million jobs' sums stay far inside 64 bits


def _prints(conn: sa.Connection, experiment, start, end, where: Sequence) -> dict[int, tuple[int, int]]:
    """experiment id -> (rows, the sum of their starts and ends modulo PRINT_MOD) of a table's rows `where` leaves."""
    moved = sa.func.coalesce(start, 0) % PRINT_MOD + sa.func.coalesce(end, 0) % PRINT_MOD
    query = sa.select(experiment, sa.func.count(), sa.func.sum(moved)).where(*where).group_by(experiment)
    return {int(e): (int(n), int(total or 0)) for e, n, total in conn.execute(query)}


# --- reading: the rows listed, their hours, their order ---------------------------------------------------------------


def listed() -> list:
    """The conditions of the rows the Cluster page lists once the table is in step (`out_of_step` empty): the jobs."""
    return [jobs.c.job.is_not(None)]


def hours(start_ms: int | None, end_ms: int | None, now_ms: int) -> float:
    """The job's hours: to its end, or to now while it runs; 0 without a start."""
    return max(0.0, ((end_ms or now_ms) - (start_ms or now_ms)) / HOUR_MS)


def hours_sql(now_ms: int):
    """`hours` in SQL, the same float operations (a difference of whole ms, divided, times GPUs in `held_sql`)."""
    j = jobs.c
    span = sa.func.coalesce(sa.func.nullif(j.end_ms, 0), now_ms) - sa.func.coalesce(sa.func.nullif(j.start_ms, 0), now_ms)  # `or now_ms`
    return sa.case((span > 0, sa.cast(span, sa.Float(precision=53)) / float(HOUR_MS)), else_=0.0)


def held(row: Mapping, now_ms: int) -> float | None:
    """The GPU-hours a job held: its footprint's, else its GPUs × its hours (Slurm's facts); None where neither is known."""
    if row["gpu_hours"] is not None:
        return row["gpu_hours"]
    return None if row["gpus"] is None else row["gpus"] * hours(row["start_ms"], row["end_ms"], now_ms)


def held_sql(now_ms: int):
    """`held` in SQL."""
    return sa.func.coalesce(jobs.c.gpu_hours, jobs.c.gpus * hours_sql(now_ms))


def order(dialect: str, now_ms: int) -> list:
    """ORDER BY of footprint.rank_key (the most idle GPU-hours, then the most GPU-hours held; the jobs without idle
    GPU-hours after every ranked one), then the newest first, then the job id as text (10 before 9), then the run."""
    j = jobs.c
    unranked = j.idle_gpu_hours.is_(None)
    job = sa.collate(j.job, "C") if dialect == "postgresql" else j.job  # code-point order, as Python's; the database's collation may not be
    return [
        sa.case((unranked, 1), else_=0),
        j.idle_gpu_hours.desc(),
        sa.case((unranked, 0.0), else_=sa.func.coalesce(held_sql(now_ms), 0.0)).desc(),
        sa.func.coalesce(j.start_ms, 0).desc(),
        job,
        j.run_uuid,
    ]
