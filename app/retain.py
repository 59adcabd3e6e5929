"""`radt retain --raw 30d`: drop the raw points of ended runs older than N days from MLflow's `metrics`, keeping
radt's rollups and each run's stored summary, so a store's size is bounded. Off unless run (cron, systemd timer).

Runs go in batches of PROGRESS_EVERY: their rollups are made to cover every raw point first (a plain MLflow run gets
them here, in a transaction of its own), the summaries of those cut for the first time are stored together
(app/summary/summarystore.py) before any drop, then, in one transaction per ~POINTS_PER_CUT points with each run under
rollups.lock_run, their rows older than the cutoff go and radt_rollup_series.raw_from_ms records where their raw
points now start, so a later rebuild (`radt rollup`, a chart's ensure_fresh) keeps the rollups before it. Killed at
any point, every run is whole or cut, never its points gone with its cut unrecorded; the next retain finishes.
MLflow's latest_metrics is left alone: MLflow's UI keeps each metric's latest value. The cutoff is floored to the
coarsest rollup bucket, so every bucket lies wholly before it (rollups only) or wholly after it (rebuilt from raw
points); twice = once.

It lives on the dashboard side because the summaries are the dashboard's; the store engine is its own
(writable, no statement timeout: a long run's DELETE may take a while).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from typing import NamedTuple, TextIO

import sqlalchemy as sa

from radt import mlflowdb, rollups, summarytable
from radt.app.figures.words import counted
from radt.app.summary.summarystore import readable, store_summaries
from radt.errors import UserError
from radt.options import span_ms, store_parent
from radt.settings import STORE_TIMEOUT, display_uri, tracking_uri

LIVE_STATUSES = ("RUNNING", "SCHEDULED")  # their runs still grow: never cut
BUCKET_MS = max(rollups.RESOLUTIONS) * 1000  # the cutoff is a multiple of it: no rollup bucket straddles it
PROGRESS_EVERY = 100  # runs per batch and per progress line
KEYS_PER_DELETE = 500  # keys per IN list (SQLite's old limit is 999 variables per statement)
# raw points dropped per transaction (runs together, a longer run alone): SQLite deletes ~100,000 a second, and a live
# run's writer waits for the store's write lock no longer than RADT_STORE_TIMEOUT (5 s)
POINTS_PER_CUT = 100_000


class RetainError(UserError):
    """A store or option `radt retain` cannot use; one line naming the fix."""


class Totals(NamedTuple):
    runs: int  # ended runs that lost (or, dry, would lose) raw points
    points: int  # raw points dropped (or that would be)
    rollup_rows: int  # rollup rows kept for the dropped span of those runs
    seconds: float


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


# --- a batch of runs -----------------------------------------------------------------------------
# A run costs a few statements of each batch's, not transactions of its own: over 5,548 small runs, a transaction and
# a summary computation per run (4 commits, ~85 ms a run on SQLite, ~145 ms on PostgreSQL) made ~290 points/s.


class Cut(NamedTuple):
    """One run's cut: raw points dropped, rollup rows kept before the cutoff."""

    run_id: str
    dropped: int
    kept: int


def _series(conn: sa.Connection, run_ids: Sequence[str]) -> dict[str, dict[str, int | None]]:
    """run -> {key: raw_from_ms} of its series that have rollups (those whose raw points may go)."""
    st = rollups.series_state.c
    out: dict[str, dict[str, int | None]] = {}
    for part in rollups.chunks(list(run_ids)):
        for run_id, key, ms in conn.execute(sa.select(st.run_uuid, st.key, st.raw_from_ms).where(st.run_uuid.in_(part))):
            out.setdefault(run_id, {})[key] = ms
    return out


def _stale(conn: sa.Connection, run_ids: Sequence[str]) -> dict[str, list[str]]:
    """run -> its series whose rollups do not cover MLflow's latest_metrics row (a plain MLflow run: every one)."""
    latest = rollups.latest_rows(conn, run_ids)
    covered = rollups.covered_rows(conn, run_ids)
    out: dict[str, list[str]] = {}
    for (run_id, key), row in sorted(latest.items()):
        if covered.get((run_id, key)) != row:
            out.setdefault(run_id, []).append(key)
    return out


def _rebuild(conn: sa.Connection, run_id: str, keys: Sequence[str]) -> None:
    """Rollups of these series of the run made anew from its raw points: one scan of the run for more than one key."""
    if len(keys) > 1:
        rollups.rebuild_run(conn, run_id)
    elif keys:
        rollups.rebuild_series(conn, run_id, keys[0])


def _freshen(engine: sa.Engine, run_ids: Sequence[str]) -> None:
    """Rollups that cover every series' latest_metrics row; a stale run is rebuilt in a transaction of its own
    (a plain MLflow run's rebuild reads all its points: no batch of them holds the store's write lock)."""
    with engine.connect() as conn:
        todo = _stale(conn, run_ids)
    for run_id in todo:
        with engine.begin() as conn:
            rollups.lock_run(conn, run_id)
            _rebuild(conn, run_id, _stale(conn, [run_id]).get(run_id, []))  # another process may have built it meanwhile


def _incomplete(conn: sa.Connection, series: dict[str, dict[str, int | None]]) -> dict[str, list[str]]:
    """run -> its series whose rollups do not hold each raw point since their last cut once (count + nans against
    MLflow's rows, as rollups.refresh_series checks): points another writer added without moving latest_metrics."""
    m, r, st = mlflowdb.metrics, rollups.rollups, rollups.series_state
    raw: dict[tuple[str, str], int] = {}
    held: dict[tuple[str, str], int] = {}
    for part in rollups.chunks(list(series)):
        raw_q = (
            sa.select(m.c.run_uuid, m.c.key, sa.func.count())
            .join_from(m, st, sa.and_(st.c.run_uuid == m.c.run_uuid, st.c.key == m.c.key))
            .where(m.c.run_uuid.in_(part), sa.or_(st.c.raw_from_ms.is_(None), m.c.timestamp >= st.c.raw_from_ms))
            .group_by(m.c.run_uuid, m.c.key)
        )
        held_q = (
            sa.select(r.c.run_uuid, r.c.key, sa.func.sum(r.c["count"] + r.c.nans))
            .join_from(r, st, sa.and_(st.c.run_uuid == r.c.run_uuid, st.c.key == r.c.key))
            .where(r.c.run_uuid.in_(part), r.c.resolution_s == max(rollups.RESOLUTIONS))
            .where(sa.or_(st.c.raw_from_ms.is_(None), r.c.bucket_ms >= st.c.raw_from_ms))
            .group_by(r.c.run_uuid, r.c.key)
        )
        raw.update({(run_id, key): n for run_id, key, n in conn.execute(raw_q)})
        held.update({(run_id, key): int(n or 0) for run_id, key, n in conn.execute(held_q)})
    out: dict[str, list[str]] = {}
    for run_id, keys in series.items():
        off = sorted(k for k in keys if held.get((run_id, k), 0) != raw.get((run_id, k), 0))
        if off:
            out[run_id] = off
    return out


def _complete(engine: sa.Engine, run_ids: Sequence[str]) -> None:
    """Before a cut, every run's rollups hold each of its raw points since its last cut; a run that misses some is
    rebuilt in a transaction of its own."""
    with engine.connect() as conn:
        off = _incomplete(conn, _series(conn, run_ids))
    for run_id in off:
        with engine.begin() as conn:
            rollups.lock_run(conn, run_id)
            _rebuild(conn, run_id, _incomplete(conn, _series(conn, [run_id])).get(run_id, []))


def _due(conn: sa.Connection, run_ids: Sequence[str], cutoff: int) -> dict[str, int]:
    """run -> the raw points before the cutoff not dropped yet, as its (complete) rollups count them; runs with none left out."""
    r, st = rollups.rollups.c, rollups.series_state.c
    out: dict[str, int] = {}
    for part in rollups.chunks(list(run_ids)):
        query = (
            sa.select(r.run_uuid, sa.func.sum(r["count"] + r.nans))
            .join_from(rollups.rollups, rollups.series_state, sa.and_(st.run_uuid == r.run_uuid, st.key == r.key))
            .where(r.run_uuid.in_(part), r.resolution_s == max(rollups.RESOLUTIONS), r.bucket_ms < cutoff)
            .where(sa.or_(st.raw_from_ms.is_(None), r.bucket_ms >= st.raw_from_ms))
            .group_by(r.run_uuid)
        )
        out.update({run_id: int(n) for run_id, n in conn.execute(query)})
    return {run_id: out[run_id] for run_id in run_ids if out.get(run_id)}


def _count_before(conn: sa.Connection, run_id: str, keys: Sequence[str], cutoff: int) -> int:
    m = mlflowdb.metrics.c
    total = 0
    for start in range(0, len(keys), KEYS_PER_DELETE):
        part = list(keys[start : start + KEYS_PER_DELETE])
        total += conn.execute(sa.select(sa.func.count()).where(m.run_uuid == run_id, m.timestamp < cutoff, m.key.in_(part))).scalar_one()
    return total


def _drop(conn: sa.Connection, run_id: str, keys: Sequence[str], cutoff: int) -> int:
    """Delete the run's raw points of these keys before the cutoff; the rows deleted."""
    m = mlflowdb.metrics
    dropped = 0
    for start in range(0, len(keys), KEYS_PER_DELETE):
        part = list(keys[start : start + KEYS_PER_DELETE])
        dropped += conn.execute(sa.delete(m).where(m.c.run_uuid == run_id, m.c.timestamp < cutoff, m.c.key.in_(part))).rowcount
    return dropped


def _mark_cut(conn: sa.Connection, run_ids: Sequence[str], cutoff: int) -> None:
    """raw_from_ms = the cutoff for every series of these runs (a later one kept): a rebuild keeps the rollups before it.
    In the transaction of the DELETE: no run is ever seen with its points gone and its cut unrecorded."""
    st = rollups.series_state
    later = sa.case((sa.or_(st.c.raw_from_ms.is_(None), st.c.raw_from_ms < cutoff), sa.literal(cutoff, sa.BigInteger)), else_=st.c.raw_from_ms)
    for part in rollups.chunks(list(run_ids)):
        conn.execute(sa.update(st).where(st.c.run_uuid.in_(part)).values(raw_from_ms=later))


def _rows_kept(conn: sa.Connection, run_ids: Sequence[str], cutoff: int) -> dict[str, int]:
    r = rollups.rollups.c
    out: dict[str, int] = {}
    for part in rollups.chunks(list(run_ids)):
        query = sa.select(r.run_uuid, sa.func.count()).where(r.run_uuid.in_(part), r.bucket_ms < cutoff).group_by(r.run_uuid)
        out.update(dict(conn.execute(query).all()))
    return out


def _groups(due: dict[str, int], points: int) -> list[list[str]]:
    """The runs in groups of about `points` raw points to drop (a run alone where it has more): one transaction each."""
    groups: list[list[str]] = [[]]
    held = 0
    for run_id, n in due.items():
        if groups[-1] and held + n > points:
            groups.append([])
            held = 0
        groups[-1].append(run_id)
        held += n
    return [g for g in groups if g]


def _cut(engine: sa.Engine, run_ids: Sequence[str], cutoff: int) -> list[Cut]:
    """Drop the runs' raw points before the cutoff and record where, in one transaction, each run under its lock."""
    with engine.begin() as conn:
        rollups.lock_runs(conn, run_ids)
        for run_id, keys in _stale(conn, run_ids).items():  # nothing, unless a late writer added points meanwhile
            _rebuild(conn, run_id, keys)
        series = _series(conn, run_ids)
        dropped = {run_id: _drop(conn, run_id, sorted(series.get(run_id, {})), cutoff) for run_id in run_ids}
        _mark_cut(conn, run_ids, cutoff)
        kept = _rows_kept(conn, run_ids, cutoff)
    return [Cut(run_id, dropped[run_id], kept.get(run_id, 0)) for run_id in run_ids]


def retain_runs(engine: sa.Engine, run_ids: Sequence[str], cutoff: int) -> list[Cut]:
    """Cut ended runs at the cutoff: their rollups made to hold every raw point, the summary of each run cut for the
    first time stored, then their old raw points dropped; the runs that had any."""
    _freshen(engine, run_ids)
    with engine.connect() as conn:
        ready = list(_due(conn, run_ids, cutoff))
    _complete(engine, ready)
    with engine.connect() as conn:
        due = _due(conn, ready, cutoff)
        series = _series(conn, list(due))
    first = [r for r in due if all(ms is None for ms in series.get(r, {}).values())]
    if first:  # the dashboard's numbers of the whole run, stored before any of its points goes
        _store_summaries(engine, first)
    return [cut for group in _groups(due, POINTS_PER_CUT) for cut in _cut(engine, group, cutoff)]


def _store_summaries(engine: sa.Engine, run_ids: Sequence[str]) -> None:
    """Store the runs' summaries (app/summary/summarystore.py), and make sure they are there: without its summary no run's point may go."""
    store_summaries(engine, run_ids)
    with engine.connect() as conn:
        kept = summarytable.read(conn, run_ids)
    missing = [r for r in run_ids if not readable(kept.get(r))]
    if missing:
        where = display_uri(engine.url.render_as_string(hide_password=True))
        raise RetainError(
            f"cannot store the summary of run {missing[0]} in {where}; its raw points were kept: give a user that may write radt_summaries (--store)"
        )


def would_drop(conn: sa.Connection, run_id: str, cutoff: int, has_rollups: bool) -> int:
    """--dry-run: the raw points retain_runs would drop of this run, changing nothing."""
    if has_rollups and not _stale(conn, [run_id]) and not _due(conn, [run_id], cutoff):
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
        for done, part in enumerate(rollups.chunks(ids, PROGRESS_EVERY), 1):
            if dry_run:
                with engine.connect() as conn:
                    cuts = [Cut(run_id, would_drop(conn, run_id, cutoff, has_rollups), 0) for run_id in part]
            else:
                cuts = retain_runs(engine, part, cutoff)
            runs += sum(1 for c in cuts if c.dropped > 0)
            points += sum(c.dropped for c in cuts)
            rows += sum(c.kept for c in cuts)
            if len(part) == PROGRESS_EVERY:
                print(
                    f"radt retain: {(done - 1) * PROGRESS_EVERY + len(part)}/{counted(len(ids), 'run')}, {counted(points, 'point')} {'to drop' if dry_run else 'dropped'}",
                    file=out,
                )
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
    parser.add_argument(
        "--raw", required=True, metavar="DURATION", help="keep raw points this recent: a span of minutes, hours, days or weeks, e.g. 30d, 12h or 2w"
    )
    parser.add_argument("--dry-run", action="store_true", help="count what would be dropped; change nothing")
    args = parser.parse_args(argv)
    keep_ms = span_ms(args.raw, "--raw")  # the one span parser (radt/options.py): 30d, 12h, 2w
    totals = retain(tracking_uri(args.store), keep_ms, dry_run=args.dry_run)
    verb = "would drop" if args.dry_run else "dropped"
    print(
        f"radt retain: {counted(totals.runs, 'run')}, {counted(totals.points, 'raw point')} {verb}, {counted(totals.rollup_rows, 'rollup row')} kept, "
        f"in {totals.seconds:.1f} s",
        file=sys.stderr,
    )
    return 0
