"""The Cluster view's rows: every run `radt import --slurm` made, with its job's facts and diagnosis, the most idle
GPU-hours first, totalled per user / account / partition and counted per finding.

Read in SQL from radt's jobs table (radt/jobtable.py): the jobs listed (ORDER BY the rank, LIMIT), the totals (GROUP
BY), the counts per finding, so a load costs about the same at 100,000 jobs as at 1,000. The table is put in step with
the store first (jobtable.out_of_step: the rows a store an older radt imported lacks, another writer's runs, runs
deleted or restored): a store pays its backfill once, over as many loads as the request's deadline asks.
Where the table cannot be written (a read-only user or file) the rows come from the runs' tags on each load, and are
narrowed, counted and totalled here (`narrow`, `finding_counts`, `totals`: the definitions the SQL gives the same figures as).

Idle GPU-hours and GPU-hours are the job's footprint (radt.footprint.idle_gpu_hours and gpu_hours: each GPU's share of the
job with its engine idle × the job's hours, radt/diagnosis.py's idle_numbers); the order is radt/footprint.py's rank_key,
the one ranking of jobs and of totals. Jobs without idle GPU-hours (never diagnosed, no activity series) come last, the
newest first. A job's findings are its radt.diagnosis codes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import sqlalchemy as sa

from radt import jobtable
from radt.app.db import deadline
from radt.app.db.rollupseries import writable
from radt.app.db.store import TAGS, chunks, plain_rows
from radt.diagnosis import CODES
from radt.footprint import rank_key
from radt.runmodel import diagnosis_tag

LOG = logging.getLogger(__name__)
SUMMED = ("energy_kwh", "co2_kg", "cost")  # footprint figures the totals add up (each job's as its diagnosis figured it)
GROUPS = jobtable.GROUPS  # what the Cluster view totals and narrows by
FINDING = "finding"  # the query key that narrows the view to the jobs with one finding (a radt.diagnosis code)

MARGIN_S = 3.0  # what a backfill leaves of the request's time for the page's own reads (about 1 s at 100,000 jobs)
_REFUSED: set[str] = set()  # stores that would not take the jobs table's rows (said once per process)


class Cluster(NamedTuple):
    """What the Cluster page shows for a grouping and a choice: whether the store has jobs at all, the first `limit`
    jobs the choice leaves (worst first), how many it leaves, their totals, the counts per finding of the jobs the
    user / account / partition choice leaves, and the footprint bases their figures used. `making`: the runs whose rows
    are still to be made (a backfill stopped before the request's deadline), and nothing else is known yet."""

    has_jobs: bool
    rows: list[dict]
    count: int
    totals: list[dict]
    findings: list[tuple[str, int]]
    bases: list[str]
    making: int = 0


def cluster(engine: sa.Engine, by: str, chosen: Mapping[str, str], limit: int, now_ms: int | None = None) -> Cluster:
    """The page's figures: in SQL over the jobs table, or from every job's tags where the table cannot be kept."""
    now = _now(now_ms)
    left = _kept(engine, before_deadline=True)
    if left is None:
        return from_rows(_rows_from_tags(engine, now), by, chosen, limit)
    if left:
        return Cluster(True, [], 0, [], [], [], making=left)
    j = jobtable.jobs.c
    in_groups = [*jobtable.listed(), *(j[k] == v for k, v in chosen.items() if k in GROUPS and v)]
    finding = chosen.get(FINDING) or ""
    where = [*in_groups, j.codes.contains(f",{finding},", autoescape=True)] if finding else in_groups
    with engine.connect() as conn:
        groups = _sql_totals(conn, by, where, now)
        count = sum(group["jobs"] for group in groups)
        if not count and not conn.execute(sa.select(sa.literal(1)).where(*jobtable.listed()).limit(1)).first():
            return Cluster(False, [], 0, [], [], [])
        listed = _listed(conn, where, now, limit) if count else []
        bases = sorted(conn.execute(sa.select(j.basis).where(*where, j.basis != "").distinct()).scalars())
        return Cluster(True, listed, count, groups, _sql_finding_counts(conn, in_groups), bases)


def from_rows(rows: list[dict], by: str, chosen: Mapping[str, str], limit: int) -> Cluster:
    """`cluster`'s figures from every job's row (worst first), in Python."""
    if not rows:
        return Cluster(False, [], 0, [], [], [])
    in_groups = narrow(rows, {k: v for k, v in chosen.items() if k != FINDING})  # the counts per finding: of every finding
    rows = narrow(in_groups, chosen)
    bases = sorted({row["basis"] for row in rows if row.get("basis")})
    return Cluster(True, rows[:limit], len(rows), totals(rows, by), finding_counts(in_groups), bases)


def job_rows(engine: sa.Engine, now_ms: int | None = None) -> list[dict]:
    """One dict per imported job (its run id and experiment id beside its facts, codes and figures), worst first."""
    now = _now(now_ms)
    if _kept(engine) is None:
        return _rows_from_tags(engine, now)
    with engine.connect() as conn:
        return _listed(conn, jobtable.listed(), now, None)


def _now(now_ms: int | None) -> int:
    return int(time.time() * 1000) if now_ms is None else now_ms


def _kept(engine: sa.Engine, before_deadline: bool = False) -> int | None:
    """Put the jobs table in step with the store (the rows out of step made again, CHUNK runs a transaction, so a
    backfill cut short keeps what it did); the runs left to make: 0 once in step, more where `before_deadline` stopped
    it short of the request's deadline (time left for the page's own reads). None where there is no table and nothing
    to put in it, or where the store will not take its rows (said once)."""
    with engine.connect() as conn:
        todo = jobtable.out_of_step(conn, jobtable.experiments(conn))
        if not todo:
            return 0 if jobtable.has_table(conn) else None
    slowest = 0.0
    try:
        for done in range(0, len(todo), jobtable.CHUNK):
            left = deadline.remaining()
            if before_deadline and done and left is not None and left < MARGIN_S + 2 * slowest:  # each load makes one batch at least
                return len(todo) - done
            deadline.check()
            began = time.monotonic()
            jobtable.refresh(writable(engine), todo[done : done + jobtable.CHUNK])
            slowest = max(slowest, time.monotonic() - began)
        return 0
    except sa.exc.DBAPIError as exc:
        if deadline.timed_out(exc):
            raise
        where = engine.url.render_as_string(hide_password=True)
        if where not in _REFUSED:
            _REFUSED.add(where)
            reason = (str(getattr(exc, "orig", None) or exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            LOG.warning("radt: cannot keep the jobs table in %s (%s); the Cluster page reads every job's tags on each load", where, reason)
        return None


def page_row(row: Mapping, now_ms: int) -> dict:
    """A jobs table row as the page uses it: run and experiment ids, hours, codes as a list, its figures (GPU-hours held
    from Slurm's facts, GPUs × hours, where no footprint gives them)."""
    out = {k: v for k, v in row.items() if k != "run_uuid"}
    out |= {"run_id": row["run_uuid"], "experiment_id": str(row["experiment_id"]), "codes": jobtable.codes_in(row["codes"])}
    out["hours"] = jobtable.hours(row["start_ms"], row["end_ms"], now_ms)
    figures = {name: row[name] for name in jobtable.FIGURES if row[name] is not None}
    held = jobtable.held(row, now_ms)
    if held is not None:
        figures["gpu_hours"] = held
    return out | {"figures": figures, "gpu_hours": figures.get("gpu_hours"), "idle_gpu_hours": figures.get("idle_gpu_hours")}


def _listed(conn: sa.Connection, where: Sequence, now_ms: int, limit: int | None) -> list[dict]:
    """The rows `where` leaves, worst first (jobtable.order: rank_key in SQL), the first `limit` of them: their ids
    sorted first (a sort that carries ids, not whole rows: half the time on PostgreSQL), then their rows."""
    j = jobtable.jobs
    order = jobtable.order(conn.dialect.name, now_ms)
    if limit is None:
        return [page_row(row, now_ms) for row in conn.execute(sa.select(j).where(*where).order_by(*order)).mappings()]
    ids = conn.execute(sa.select(j.c.run_uuid).where(*where).order_by(*order).limit(limit)).scalars().all()
    found = {row["run_uuid"]: row for part in chunks(ids) for row in conn.execute(sa.select(j).where(j.c.run_uuid.in_(part))).mappings()}
    return [page_row(found[run_id], now_ms) for run_id in ids if run_id in found]


def _rows_from_tags(engine: sa.Engine, now_ms: int) -> list[dict]:
    """Every job's row read from its run's tags (the table's reading, jobtable.row_of), worst first by rank_key."""
    with engine.connect() as conn:
        kept = jobtable.experiments(conn)
        rows = jobtable.read_rows(conn, jobtable.slurm_runs(conn, kept), kept)
    out = [page_row(row, now_ms) for row in rows.values() if row["job"] is not None]
    # the worst first (rank_key); the unranked after them, the newest first (job ids sort as text: 10 < 9)
    out.sort(key=lambda x: (rank_key(x["figures"]), -(x["start_ms"] or 0), x["job"], x["run_id"]))
    return out


def _sql_totals(conn: sa.Connection, by: str, where: Sequence, now_ms: int) -> list[dict]:
    """`totals` in one GROUP BY."""
    j = jobtable.jobs.c
    held, idle = jobtable.held_sql(now_ms), j.idle_gpu_hours
    count = lambda condition: sa.func.sum(sa.case((condition, 1), else_=0))  # noqa: E731
    query = sa.select(
        j[by],
        sa.func.count(),
        sa.func.count(idle),
        count(held.is_(None)),
        sa.func.sum(held),
        sa.func.sum(idle),
        sa.func.sum(sa.case((idle.is_not(None), sa.func.coalesce(held, 0.0)), else_=0.0)),
        *(sa.func.sum(j[name]) for name in SUMMED),
    )
    out = []
    for name, jobs, ranked, unknown, gpu_hours, idle_hours, ranked_held, *summed in conn.execute(query.where(*where).group_by(j[by])):
        group = {"name": name, "jobs": jobs, "ranked": ranked, "gpus_unknown": int(unknown or 0), "gpu_hours": gpu_hours or 0.0, "idle_gpu_hours": idle_hours}
        group |= dict(zip(SUMMED, summed, strict=True))
        group["idle_share"] = idle_hours / ranked_held if idle_hours is not None and ranked_held > 0 else None
        out.append(group)
    return _ranked(out)


def _sql_finding_counts(conn: sa.Connection, where: Sequence) -> list[tuple[str, int]]:
    """`finding_counts` from one GROUP BY of the jobs' findings (a few hundred combinations at most)."""
    codes = jobtable.jobs.c.codes
    counts = dict.fromkeys(CODES, 0)
    for text, jobs in conn.execute(sa.select(codes, sa.func.count()).where(*where).group_by(codes)):
        for code in jobtable.codes_in(text):
            if code in counts:
                counts[code] += jobs
    return _by_frequency(counts)


def narrow(rows: list[dict], chosen: Mapping[str, str]) -> list[dict]:
    """The rows whose user / account / partition equal the chosen ones (compared as text) and that hold the chosen
    finding (a radt.diagnosis code); the order kept."""
    wanted = {k: v for k, v in chosen.items() if k in GROUPS and v}
    finding = chosen.get(FINDING) or ""
    return [row for row in rows if all(row.get(k, "") == v for k, v in wanted.items()) and (not finding or finding in row["codes"])]


def finding_counts(rows: Sequence[dict]) -> list[tuple[str, int]]:
    """(code, jobs with that finding) for every code some job has, the most frequent first (then the catalogue's order)."""
    return _by_frequency({code: sum(code in row["codes"] for row in rows) for code in CODES})


def _by_frequency(counts: Mapping[str, int]) -> list[tuple[str, int]]:
    return sorted(((c, n) for c, n in counts.items() if n), key=lambda item: (-item[1], CODES.index(item[0])))


def totals(rows: list[dict], by: str) -> list[dict]:
    """Per user / account / partition: jobs, GPU-hours held, idle GPU-hours and the idle share of the GPU-hours of the
    jobs that have idle GPU-hours (`ranked`); worst first by the same rank_key as the jobs. `gpus_unknown`: the jobs whose
    GPU-hours are not known, which the total lacks."""
    groups: dict[str, dict] = {}
    for row in rows:
        name = row.get(by, "") or ""
        group = groups.setdefault(
            name, {"name": name, "jobs": 0, "ranked": 0, "gpus_unknown": 0, "gpu_hours": 0.0, "idle_gpu_hours": None, "_held": 0.0} | dict.fromkeys(SUMMED)
        )
        group["jobs"] += 1
        held, idle = row["gpu_hours"], row["idle_gpu_hours"]
        if held is None:
            group["gpus_unknown"] += 1
        else:
            group["gpu_hours"] += held
        if idle is not None:
            group["ranked"] += 1
            group["idle_gpu_hours"] = (group["idle_gpu_hours"] or 0.0) + idle
            group["_held"] += held or 0.0
        for name in SUMMED:
            if name in row["figures"]:
                group[name] = (group[name] or 0.0) + row["figures"][name]
    out = []
    for group in groups.values():
        held = group.pop("_held")
        group["idle_share"] = group["idle_gpu_hours"] / held if group["idle_gpu_hours"] is not None and held > 0 else None
        out.append(group)
    return _ranked(out)


def _ranked(groups: list[dict]) -> list[dict]:
    """Groups worst first by rank_key (the jobs' one ranking), then by name."""
    return sorted(groups, key=lambda g: (rank_key({"idle_gpu_hours": g["idle_gpu_hours"], "gpu_hours": g["gpu_hours"]}), g["name"]))


def finding_sentences(engine: sa.Engine, run_ids: Sequence[str]) -> dict[str, dict[str, str]]:
    """run id -> code -> the finding's sentence (radt.diagnosis.<code>), for the jobs shown only."""
    keys = [diagnosis_tag(code) for code in CODES]
    out: dict[str, dict[str, str]] = {}
    with engine.connect() as conn:
        for chunk in chunks(list(run_ids)):
            stmt = sa.select(TAGS.c.run_uuid, TAGS.c.key, TAGS.c.value).where(TAGS.c.run_uuid.in_(chunk), TAGS.c.key.in_(keys))
            for run_id, key, value in plain_rows(conn, stmt):
                out.setdefault(run_id, {})[key[len(diagnosis_tag("")) :]] = value or ""
    return out
