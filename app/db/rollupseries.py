"""Long series drawn from radt's rollups (radt/rollups.py) instead of their raw points: a cold chart costs runs ×
point budget, not run length. series.load_series decides per run (`plan`) and draws the buckets (`points`, `envelope`).

The dashboard's engine cannot write (app/db/store.py). Rollups are radt's own tables, built on a series' first draw
(a plain MLflow run) or rebuilt when another writer added points: those transactions alone, on the same pool,
are made read-write (`writable`). Where that fails (a read-only database user, a read-only SQLite file) the
chart is drawn from the raw points, the failure is logged once, and rollups are left off for that store for
RETRY_S seconds.
"""

from __future__ import annotations

import functools
import logging
import math
import time
import weakref
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from radt import rollups
from radt.app.db import deadline
from radt.app.db.downsample import Envelope, downsample_indices
from radt.app.db.store import Series, binary_rows, chunks, plain_rows

LOG = logging.getLogger(__name__)
RETRY_S = 300.0  # a store whose rollups could not be made or read is drawn raw for this long before trying again
EXTENT_RESOLUTION = max(rollups.RESOLUTIONS)  # a series' first and last bucket at the coarsest resolution: its span, cheaply
FINEST = min(rollups.RESOLUTIONS)

_WRITERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # engine -> its read-write view (same pool)
_TABLES: weakref.WeakSet = weakref.WeakSet()  # engines whose store has the rollup tables
_OFF: dict[str, float] = {}  # store -> monotonic time until which it is drawn raw


class Extent(NamedTuple):
    """What a series' rollups say about it: where it starts and ends (ms), and where its raw points start (None: all kept)."""

    first_ms: int
    last_ms: int
    raw_from_ms: int | None


def writable(engine: sa.Engine) -> sa.Engine:
    """The engine, its transactions read-write: PostgreSQL's read-only session default and SQLite's query_only are
    lifted for this view's transactions only (SQLite's is put back when the connection returns to the pool)."""
    found = _WRITERS.get(engine)
    if found is not None:
        return found
    writer = engine.execution_options(radt_rollup_writer=True)

    @sa.event.listens_for(writer, "begin")
    def _read_write(conn: sa.Connection) -> None:
        dbapi = conn.connection.dbapi_connection
        if conn.dialect.name == "postgresql":
            with dbapi.cursor() as cursor:
                cursor.execute("SET TRANSACTION READ WRITE")  # the transaction's first statement
        elif conn.dialect.name == "sqlite" and dbapi.execute("PRAGMA query_only").fetchone()[0]:
            dbapi.execute("PRAGMA query_only = OFF")
            conn.connection._connection_record.info["radt_query_only"] = True

    @sa.event.listens_for(engine, "checkin")
    def _read_only_again(dbapi_connection, record) -> None:
        if record is not None and record.info.pop("radt_query_only", False):
            dbapi_connection.execute("PRAGMA query_only = ON")

    _WRITERS[engine] = writer
    return writer


def available(engine: sa.Engine) -> bool:
    """False while the store is drawn raw after a failure (RETRY_S); PostgreSQL and SQLite stores only."""
    if engine.dialect.name not in ("postgresql", "sqlite"):
        return False
    until = _OFF.get(_store(engine))
    return until is None or time.monotonic() >= until


def give_up(engine: sa.Engine, exc: Exception) -> None:
    """One line in the log, and the store drawn raw for RETRY_S; a request past its deadline is raised instead."""
    if deadline.timed_out(exc):
        raise exc
    store = _store(engine)
    if store not in _OFF or time.monotonic() >= _OFF[store]:
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()
        LOG.warning("rollups unavailable on %s, charts read raw points for %.0f s: %s", store, RETRY_S, reason[0][:200] if reason else type(exc).__name__)
    _OFF[store] = time.monotonic() + RETRY_S


def _store(engine: sa.Engine) -> str:
    return engine.url.render_as_string(hide_password=True)


def prepare(engine: sa.Engine, run_ids: Sequence[str], key: str) -> dict[str, Extent]:
    """Make the series' rollups cover every point (tables made once, stale series rebuilt), then run_id -> its Extent.
    Raises SQLAlchemy's errors (give_up turns them into the raw path)."""
    writer = writable(engine)
    if engine not in _TABLES:
        rollups.ensure_table(writer)
        _TABLES.add(engine)
    rollups.ensure_fresh(writer, run_ids, key)
    with engine.connect() as conn:
        return extents(conn, run_ids, key)


def extents(conn: sa.Connection, run_ids: Sequence[str], key: str) -> dict[str, Extent]:
    """run_id -> Extent of its series `key`, from its coarsest buckets (a few rows per day) and its state row."""
    r, st = rollups.rollups.c, rollups.series_state.c
    width = EXTENT_RESOLUTION * 1000
    spans: dict[str, tuple[int, int]] = {}
    cut: dict[str, int] = {}
    ids = list(dict.fromkeys(run_ids))
    for start in range(0, len(ids), 500):
        part = ids[start : start + 500]
        query = (
            sa.select(r.run_uuid, sa.func.min(r.bucket_ms), sa.func.max(r.bucket_ms), sa.func.max(r.last_ms))
            .where(r.run_uuid.in_(part), r.key == key, r.resolution_s == EXTENT_RESOLUTION)
            .group_by(r.run_uuid)
        )
        for run_id, first, last_bucket, last_ms in conn.execute(query):
            spans[run_id] = (int(first), int(last_ms) if last_ms is not None else int(last_bucket) + width - 1)
        query = sa.select(st.run_uuid, st.raw_from_ms).where(st.run_uuid.in_(part), st.key == key, st.raw_from_ms.is_not(None))
        cut.update((run_id, int(ms)) for run_id, ms in conn.execute(query))
    return {run_id: Extent(first, last, cut.get(run_id)) for run_id, (first, last) in spans.items()}


def resolution(extent: Extent, lo: int | None, hi: int | None, budget: int, per_bucket: int = 2) -> int | None:
    """The rollup resolution a run's window [lo, hi] (either open) is drawn from; None: its raw points.

    The coarsest that still gives the budget over the part of the window the series covers; the finest where
    the window reaches before the raw points `radt retain` kept (those are only in the rollups)."""
    first = extent.first_ms if lo is None else max(lo, extent.first_ms)
    last = extent.last_ms if hi is None else min(hi, extent.last_ms)
    found = rollups.resolution_for(max(0, last - first), budget, per_bucket)
    if found is None and extent.raw_from_ms is not None and first < extent.raw_from_ms:
        return FINEST
    return found


def read(engine: sa.Engine, groups: Mapping[tuple[int, int | None, int | None], Sequence[str]], key: str) -> dict[str, rollups.Buckets]:
    """run_id -> its buckets, for runs grouped by (resolution, lo, hi): one indexed range read per group.

    PostgreSQL packs each run's buckets into bytea columns (float8send) that numpy reads without a Python object per
    bucket, as the raw path does (32 runs x 1,080 buckets: rows one by one through SQLAlchemy took 0.8 s); SQLite's
    rows come straight off the DBAPI cursor."""
    out: dict[str, rollups.Buckets] = {}
    with engine.connect() as conn:
        for (res, lo, hi), runs in groups.items():
            for part in chunks(list(runs)):
                where = _bucket_range(part, key, res, lo, hi)
                if conn.dialect.name == "postgresql":
                    out.update(_read_packed(conn, where))
                else:
                    out.update(_read_rows(conn, where))
    return out


_COLUMNS = ("bucket_ms", "min", "max", "sum", "count", "nans", "min_ms", "max_ms", "last_value", "last_ms")
_INTEGER = ("bucket_ms", "count", "nans")


def _bucket_range(run_ids: Sequence[str], key: str, resolution_s: int, lo: int | None, hi: int | None) -> list:
    """The rows of these runs' series at one resolution whose buckets overlap [lo, hi] (rollups.read's condition)."""
    r = rollups.rollups.c
    width = resolution_s * 1000
    where = [r.run_uuid.in_(list(run_ids)), r.key == key, r.resolution_s == resolution_s]
    if lo is not None:
        where.append(r.bucket_ms >= (int(lo) // width) * width)
    if hi is not None:
        where.append(r.bucket_ms <= int(hi))
    return where


def _read_packed(conn: sa.Connection, where: list) -> dict[str, rollups.Buckets]:
    """One bytea per run: each bucket's columns as float8send, concatenated row by row, in one aggregate (one per
    column, or one ORDER BY per column, was most of the query's time); sorted by bucket here."""
    r = rollups.rollups.c
    nan = sa.cast("NaN", postgresql.DOUBLE_PRECISION)
    row = functools.reduce(
        lambda a, b: a.op("||")(b), (sa.func.float8send(sa.func.coalesce(sa.cast(r[c], postgresql.DOUBLE_PRECISION), nan)) for c in _COLUMNS)
    )
    stmt = sa.select(r.run_uuid, sa.func.string_agg(row, sa.literal(b"", sa.LargeBinary))).where(*where).group_by(r.run_uuid)
    out: dict[str, rollups.Buckets] = {}
    for run_id, packed in binary_rows(conn, stmt):
        table = np.frombuffer(packed, dtype=">f8").astype(np.float64).reshape(-1, len(_COLUMNS))
        out[run_id] = _buckets(table[np.argsort(table[:, 0], kind="stable")])
    return out


def _buckets(table: np.ndarray) -> rollups.Buckets:
    """Buckets from a table of rows sorted by bucket, columns as _COLUMNS, NaN for NULL."""
    return rollups.Buckets(*(table[:, i].astype(np.int64) if name in _INTEGER else table[:, i] for i, name in enumerate(_COLUMNS)))


def _read_rows(conn: sa.Connection, where: list) -> dict[str, rollups.Buckets]:
    r = rollups.rollups.c
    stmt = sa.select(r.run_uuid, *(r[c] for c in _COLUMNS)).where(*where).order_by(r.run_uuid, r.bucket_ms)
    found: dict[str, list] = {}
    for row in plain_rows(conn, stmt):
        found.setdefault(row[0], []).append(row[1:])
    out: dict[str, rollups.Buckets] = {}
    for run_id, rows in found.items():
        out[run_id] = _buckets(np.array(rows, dtype=np.float64))  # NULL (None) reads as NaN
    return out


def points(buckets: rollups.Buckets, lo: int | None, hi: int | None, budget: int, method: str = "minmax") -> Series:
    """A run's chart points from its buckets: each bucket's minimum and maximum at their own times, in time order;
    a bucket of no readings a NaN at its start (the line breaks there); within [lo, hi]; downsampled past `budget`."""
    real = buckets.count > 0
    xs = np.concatenate((buckets.min_ms[real], buckets.max_ms[real], buckets.bucket_ms[~real].astype(np.float64)))
    values = np.concatenate((buckets.min[real], buckets.max[real], np.full(int((~real).sum()), np.nan)))
    xs = xs.astype(np.int64)
    order = np.lexsort((values, xs))  # by time, ties by value (NaN last): the raw path's order
    xs, values = xs[order], values[order]
    if len(xs) > 1:  # a bucket whose minimum and maximum are one sample: one point
        same = np.r_[False, (xs[1:] == xs[:-1]) & ((values[1:] == values[:-1]) | (np.isnan(values[1:]) & np.isnan(values[:-1])))]
        xs, values = xs[~same], values[~same]
    inside = np.ones(len(xs), dtype=bool)
    if lo is not None:
        inside &= xs >= lo
    if hi is not None:
        inside &= xs <= hi
    xs, values = xs[inside], values[inside]
    if len(xs) > budget:
        idx = downsample_indices(xs, values, budget, method)
        xs, values = xs[idx], values[idx]
    return xs, values


ENVELOPE_POINTS = 3  # as app.db.downsample.envelope: the mean, and the band's two edges


def envelope(buckets: rollups.Buckets, resolution_s: int, lo: int | None, hi: int | None, budget: int) -> Envelope:
    """An Envelope from buckets (mean = sum / count, low = min, high = max), neighbours merged into equal-width groups
    until at most ``budget // 3`` are left; x is a group's middle; a group of no readings is NaN (a gap)."""
    keep = np.ones(len(buckets.bucket_ms), dtype=bool)
    width = resolution_s * 1000
    if lo is not None:
        keep &= buckets.bucket_ms + width > lo
    if hi is not None:
        keep &= buckets.bucket_ms <= hi
    b = rollups.Buckets(*(column[keep] for column in buckets))
    if not len(b.bucket_ms):
        empty = np.array([], dtype=np.float64)
        return Envelope(empty, empty, empty, empty)
    origin = int(b.bucket_ms[0])
    slots = (int(b.bucket_ms[-1]) - origin) // width + 1
    per = max(1, math.ceil(slots / max(1, budget // ENVELOPE_POINTS)))
    group = (b.bucket_ms - origin) // (width * per)
    starts = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])
    count = np.add.reduceat(b.count, starts)
    total = np.add.reduceat(np.where(b.count > 0, b.sum, 0.0), starts)
    low = np.minimum.reduceat(np.where(b.count > 0, b.min, np.inf), starts)
    high = np.maximum.reduceat(np.where(b.count > 0, b.max, -np.inf), starts)
    centre = origin + group[starts] * width * per + width * per / 2
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(count > 0, total / np.maximum(count, 1), np.nan)
    return Envelope(centre.astype(np.float64), mean, np.where(count > 0, low, np.nan), np.where(count > 0, high, np.nan))
