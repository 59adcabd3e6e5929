"""`radt retain --raw 30d`: drop the raw points of ended runs older than N days from MLflow's `metrics`, keeping
radt's rollups and each run's stored summary, so a store's size is bounded. Off unless run (cron, systemd timer).

Per run, under rollups.lock_run: its rollups are made to cover every raw point first (a plain MLflow run gets
them here), its summary is stored (app/summarystore.py) before its first drop, then its rows older than the
cutoff go and radt_rollup_series.raw_from_ms records where its raw points now start, so a later rebuild
(`radt rollup`, a chart's ensure_fresh) keeps the rollups before it. MLflow's latest_metrics is left alone:
MLflow's UI keeps each metric's latest value. The cutoff is floored to the coarsest rollup bucket, so every
bucket lies wholly before it (rollups only) or wholly after it (rebuilt from raw points); twice = once.

It lives on the dashboard side because the summaries are the dashboard's; the store engine is its own
(writable, no statement timeout: a long run's DELETE may take a while).
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Sequence
from typing import NamedTuple, TextIO

import sqlalchemy as sa

from radt import mlflowdb, rollups, summarytable
from radt.app.summarystore import readable, store_summaries
from radt.errors import UserError
from radt.options import store_parent
from radt.settings import STORE_TIMEOUT, display_uri, tracking_uri

LIVE_STATUSES = ("RUNNING", "SCHEDULED")  # their runs still grow: never cut
BUCKET_MS = max(rollups.RESOLUTIONS) * 1000  # the cutoff is a multiple of it: no rollup bucket straddles it
PROGRESS_EVERY = 100  # runs per progress line
KEYS_PER_DELETE = 500  # keys per IN list (SQLite's old limit is 999 variables per statement)
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([dh])")
_UNIT_MS = {"d": 86_400_000, "h": 3_600_000}


class RetainError(UserError):
    """A store or option `radt retain` cannot use; one line naming the fix."""


class Totals(NamedTuple):
    runs: int  # ended runs that lost (or, dry, would lose) raw points
    points: int  # raw points dropped (or that would be)
    rollup_rows: int  # rollup rows kept for the dropped span of those runs
    seconds: float


def parse_duration(text: str) -> int:
    """'30d' or '12h' -> milliseconds."""
    found = _DURATION.fullmatch(text.strip().lower())
    if not found or float(found.group(1)) <= 0:
        raise RetainError(f"--raw {text!r} is not a duration; give days or hours, such as --raw 30d or --raw 12h")
    return int(float(found.group(1)) * _UNIT_MS[found.group(2)])


def cutoff_ms(keep_ms: int, now_ms: int | None = None) -> int:
    """now - keep, floored to a multiple of the coarsest rollup bucket."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    return (now - keep_ms) // BUCKET_MS * BUCKET_MS


def open_store(uri: str) -> sa.Engine:
    """A writable engine on a SQLite or PostgreSQL MLflow store, checked to answer and to hold MLflow's runs."""
    backend = uri.split(":", 1)[0].split("+", 1)[0]
    if backend not in ("sqlite", "postgresql", "postgres"):
        raise RetainError(f"{display_uri(uri)} is not a SQLite or PostgreSQL store; give the database URI (--store) of the mlflow server's backend store")
    if uri.startswith("postgres://"):
        uri = "postgresql://" + uri[len("postgres://") :]
    timeout = STORE_TIMEOUT.get()
    if backend == "sqlite":
        database = sa.engine.make_url(uri).database or ""
        if database in ("", ":memory:") or not os.path.isfile(os.path.expanduser(database)):
            raise RetainError(f"no SQLite store at {display_uri(uri)}; give the path of an existing store (--store)")
        engine = sa.create_engine(uri, connect_args={"timeout": timeout})
    else:
        engine = sa.create_engine(uri, pool_pre_ping=True, pool_size=2, max_overflow=2, connect_args={"connect_timeout": max(2, int(timeout))})
    return mlflowdb.check_store(engine, display_uri(uri), RetainError)


def ended_runs(conn: sa.Connection) -> list[str]:
    """The runs that no longer grow (deleted ones too: their points stay until MLflow's gc), oldest first."""
    runs = mlflowdb.runs.c
    query = sa.select(runs.run_uuid).where(sa.or_(runs.status.is_(None), runs.status.not_in(LIVE_STATUSES)))
    return list(conn.execute(query.order_by(runs.start_time, runs.run_uuid)).scalars())


# --- one run ------------------------------------------------------------------------------------


def _stale_keys(conn: sa.Connection, run_id: str) -> list[str]:
    latest = rollups.latest_rows(conn, [run_id])
    covered = rollups.covered_rows(conn, [run_id])
    return sorted(k for (_r, k), row in latest.items() if covered.get((run_id, k)) != row)


def _freshen(conn: sa.Connection, run_id: str) -> bool:
    """Rollups of every series of the run that cover its latest_metrics row; whether the whole run was rebuilt."""
    todo = _stale_keys(conn, run_id)
    if len(todo) > 1:  # one scan of the run rather than one per key (a plain MLflow run: every key)
        rollups.rebuild_run(conn, run_id)
        return True
    if todo:
        rollups.rebuild_series(conn, run_id, todo[0])
    return False


def _complete(conn: sa.Connection, run_id: str) -> None:
    """Before a cut, the run's rollups must hold each of its raw points since its last cut once (count + nans against
    MLflow's rows, as rollups.refresh_series checks): a key whose old points another writer added without moving
    latest_metrics is rebuilt."""
    m, r, st = mlflowdb.metrics, rollups.rollups, rollups.series_state
    raw_q = (
        sa.select(m.c.key.label("k"), sa.func.count())
        .join_from(m, st, sa.and_(st.c.run_uuid == m.c.run_uuid, st.c.key == m.c.key))
        .where(m.c.run_uuid == run_id, sa.or_(st.c.raw_from_ms.is_(None), m.c.timestamp >= st.c.raw_from_ms))
        .group_by(m.c.key)
    )
    held_q = (
        sa.select(r.c.key, sa.func.sum(r.c["count"] + r.c.nans))
        .join_from(r, st, sa.and_(st.c.run_uuid == r.c.run_uuid, st.c.key == r.c.key))
        .where(r.c.run_uuid == run_id, r.c.resolution_s == max(rollups.RESOLUTIONS))
        .where(sa.or_(st.c.raw_from_ms.is_(None), r.c.bucket_ms >= st.c.raw_from_ms))
        .group_by(r.c.key)
    )
    raw, held = dict(conn.execute(raw_q).all()), dict(conn.execute(held_q).all())
    off = sorted(k for k in _raw_from(conn, run_id) if int(held.get(k) or 0) != raw.get(k, 0))
    if len(off) > 1:
        rollups.rebuild_run(conn, run_id)
    elif off:
        rollups.rebuild_series(conn, run_id, off[0])


def _raw_from(conn: sa.Connection, run_id: str) -> dict[str, int | None]:
    st = rollups.series_state.c
    return dict(conn.execute(sa.select(st.key, st.raw_from_ms).where(st.run_uuid == run_id)).all())


def _has_raw_before(conn: sa.Connection, run_id: str, cutoff: int) -> bool:
    """Whether fresh rollups show raw points before the cutoff not dropped yet (a 20-minute bucket per point span)."""
    r, st = rollups.rollups.c, rollups.series_state.c
    query = (
        sa.select(r.bucket_ms)
        .join_from(rollups.rollups, rollups.series_state, sa.and_(st.run_uuid == r.run_uuid, st.key == r.key))
        .where(r.run_uuid == run_id, r.resolution_s == max(rollups.RESOLUTIONS), r.bucket_ms < cutoff)
        .where(sa.or_(st.raw_from_ms.is_(None), r.bucket_ms >= st.raw_from_ms))
        .limit(1)
    )
    return conn.execute(query).first() is not None


def _count_before(conn: sa.Connection, run_id: str, keys: Sequence[str], cutoff: int) -> int:
    m = mlflowdb.metrics.c
    total = 0
    for start in range(0, len(keys), KEYS_PER_DELETE):
        part = list(keys[start : start + KEYS_PER_DELETE])
        total += conn.execute(sa.select(sa.func.count()).where(m.run_uuid == run_id, m.timestamp < cutoff, m.key.in_(part))).scalar_one()
    return total


def _drop(conn: sa.Connection, run_id: str, keys: Sequence[str], cutoff: int) -> int:
    """Delete the run's raw points of these keys before the cutoff and record the cut; the rows deleted."""
    m = mlflowdb.metrics
    dropped = 0
    for start in range(0, len(keys), KEYS_PER_DELETE):
        part = list(keys[start : start + KEYS_PER_DELETE])
        dropped += conn.execute(sa.delete(m).where(m.c.run_uuid == run_id, m.c.timestamp < cutoff, m.c.key.in_(part))).rowcount
    st = rollups.series_state
    later = sa.case((sa.or_(st.c.raw_from_ms.is_(None), st.c.raw_from_ms < cutoff), sa.literal(cutoff, sa.BigInteger)), else_=st.c.raw_from_ms)
    conn.execute(sa.update(st).where(st.c.run_uuid == run_id).values(raw_from_ms=later))
    return dropped


def _rows_kept(conn: sa.Connection, run_id: str, cutoff: int) -> int:
    r = rollups.rollups.c
    return conn.execute(sa.select(sa.func.count()).where(r.run_uuid == run_id, r.bucket_ms < cutoff)).scalar_one()


def retain_run(engine: sa.Engine, run_id: str, cutoff: int) -> tuple[int, int]:
    """Cut one ended run at the cutoff; (raw points dropped, rollup rows kept before the cutoff)."""
    with engine.begin() as conn:
        rollups.lock_run(conn, run_id)
        whole = _freshen(conn, run_id)
        if not _has_raw_before(conn, run_id, cutoff):
            return 0, 0
        if not whole:
            _complete(conn, run_id)
        first = all(ms is None for ms in _raw_from(conn, run_id).values())
    if first:  # the dashboard's numbers of the whole run, stored before any of its points goes
        _store_summary(engine, run_id)
    with engine.begin() as conn:
        rollups.lock_run(conn, run_id)
        _freshen(conn, run_id)  # nothing, unless a late writer added points meanwhile
        dropped = _drop(conn, run_id, sorted(_raw_from(conn, run_id)), cutoff)
        return dropped, _rows_kept(conn, run_id, cutoff)


def _store_summary(engine: sa.Engine, run_id: str) -> None:
    """Store the run's summary (app/summarystore.py), and make sure it is there: without it no point may go."""
    store_summaries(engine, [run_id])
    with engine.connect() as conn:
        kept = summarytable.read(conn, [run_id]).get(run_id)
    if not readable(kept):
        where = display_uri(engine.url.render_as_string(hide_password=True))
        raise RetainError(f"cannot store the summary of run {run_id} in {where}; its raw points were kept: give a user that may write radt_summaries (--store)")


def would_drop(conn: sa.Connection, run_id: str, cutoff: int, has_rollups: bool) -> int:
    """--dry-run: the raw points retain_run would drop, changing nothing."""
    if has_rollups and not _stale_keys(conn, run_id) and not _has_raw_before(conn, run_id, cutoff):
        return 0
    keys = sorted(k for (_r, k) in rollups.latest_rows(conn, [run_id]))
    return _count_before(conn, run_id, keys, cutoff)


# --- the command --------------------------------------------------------------------------------


def retain(uri: str, keep_ms: int, *, dry_run: bool = False, now_ms: int | None = None, out: TextIO = sys.stderr) -> Totals:
    """Cut every ended run of the store at now - keep_ms (floored to 20 minutes); the totals."""
    started = time.perf_counter()
    cutoff = cutoff_ms(keep_ms, now_ms)
    engine = open_store(uri)
    try:
        if not dry_run:
            rollups.ensure_table(engine)
        with engine.connect() as conn:
            ids = ended_runs(conn)
            has_rollups = all(sa.inspect(conn).has_table(t.name) for t in (rollups.rollups, rollups.series_state))
        runs = points = rows = 0
        for done, run_id in enumerate(ids, 1):
            if dry_run:
                with engine.connect() as conn:
                    dropped, kept = would_drop(conn, run_id, cutoff, has_rollups), 0
            else:
                dropped, kept = retain_run(engine, run_id, cutoff)
            runs, points, rows = runs + (dropped > 0), points + dropped, rows + kept
            if done % PROGRESS_EVERY == 0:
                print(f"radt retain: {done}/{len(ids)} runs, {points} points {'to drop' if dry_run else 'dropped'}", file=out)
        return Totals(runs, points, rows, time.perf_counter() - started)
    finally:
        engine.dispose()


def main(argv: list[str]) -> int:
    from radt.cli import OneLineParser  # mistakes in one line, like the rest of radt

    parser = OneLineParser(
        parents=[store_parent()],
        prog="radt retain",
        description="Drop the raw points of ended runs older than --raw from MLflow's metrics table; radt's rollups, each run's "
        "summary and MLflow's latest values stay. Nothing happens unless this is run (e.g. daily from cron).",
    )
    parser.add_argument("--raw", required=True, metavar="DURATION", help="keep raw points this recent: days or hours, e.g. 30d or 12h")
    parser.add_argument("--dry-run", action="store_true", help="count what would be dropped; change nothing")
    args = parser.parse_args(argv)
    keep_ms = parse_duration(args.raw)
    totals = retain(tracking_uri(args.store), keep_ms, dry_run=args.dry_run)
    verb = "would drop" if args.dry_run else "dropped"
    print(
        f"radt retain: {totals.runs} runs, {totals.points} raw points {verb}, {totals.rollup_rows} rollup rows kept, in {totals.seconds:.1f} s",
        file=sys.stderr,
    )
    return 0
