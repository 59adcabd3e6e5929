"""Rollups: min / max / sum / count / last of every series per time bucket (10 s, 1 min, 5 min, 20 min), in radt's own table beside MLflow's.

A chart draws a run from the coarsest resolution that still gives it its point budget, so its cost depends
on runs × budget, not on run length; min and max keep every dip and spike exact at every resolution.

Rules, the same in numpy (`_bucket`), in plain Python (`_few_rows`, `merge_row`) and in SQL (`upsert`):
- a bucket is [bucket_ms, bucket_ms + resolution_s * 1000) of the point's timestamp (ms since the epoch);
- values that are no reading are counted in `nans`, not in min/max/sum/count: NaN (MLflow stores it as 0 with
  is_nan), infinities (MLflow stores them as ±1.797e308, ±MAX_FLOAT: a sum or mean holding them means nothing,
  and PostgreSQL refuses the overflowing sum of two) and radT's "no reading" sentinels of legacy keys
  (catalogue.missing_values). A bucket of such values only has count 0 and NULL min/max/sum/last: a chart
  draws it as a gap, as the raw chart draws its NaNs;
- min_ms / max_ms are the earliest timestamps of the bucket's min and max: a chart puts the dip and the spike
  where they happened;
- last is the value at the greatest (timestamp, step, value): the value breaks ties as MLflow's
  latest_metrics does, so the result does not depend on the order batches arrive in;
- merging is min of mins, max of maxes, sum + sum, count + count, nans + nans, the later last: late and
  out-of-order batches give the rows one computation over all points gives (sums up to float rounding).

Writing (PostgreSQL): a batch's buckets past each series' last stored one are COPYed straight into the table;
only the rest (the bucket the batch continues, late points) is merged by ON CONFLICT DO UPDATE. Every writer of a
run's rollups holds lock_run, so where a series ends is known exactly (bench/ingest.py: the fold costs about a
tenth of a catching-up writer's throughput).

Freshness: `radt_rollup_series` holds, per series, the MLflow `latest_metrics` row its rollups cover. A series
is fresh while that row is MLflow's current one; one another writer added to (a script's mlflow.log_metric, a
server radt reached over HTTP, a store older than rollups) is stale and rebuilt from its raw points the next
time it is drawn (`ensure_fresh`). radt's own writes keep a fresh series fresh (`fold_batch`, in the same
transaction as the raw points). `raw_from_ms` marks where `radt retain` dropped older raw points: rebuilds
keep the rollups before it.

The table has no foreign key and is created with its own metadata: MLflow's tables and alembic_version
are never touched, and MLflow (which checks its schema revision only) opens the store as before.
"""

from __future__ import annotations

import functools
import math
import operator
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple

import sqlalchemy as sa

from radt import catalogue, mlflowdb

if TYPE_CHECKING:
    import numpy as np

RESOLUTIONS = (10, 60, 300, 1200)  # seconds per bucket, finest first; each divides the next (a coarse bucket is whole finer ones)
UPSERT_BATCH = 5000  # rows per upsert statement batch
NUMPY_MIN_POINTS = 200  # points in a batch from which numpy buckets them (all keys at once) faster than plain Python
READ_CHUNK = 200_000  # raw points read at a time by rebuild_run: memory stays bounded on any run length

metadata = sa.MetaData()

rollups = sa.Table(
    "radt_rollups",
    metadata,
    sa.Column("run_uuid", sa.String(32), nullable=False),
    sa.Column("key", sa.String(250), nullable=False),
    sa.Column("resolution_s", sa.Integer, nullable=False),
    sa.Column("bucket_ms", sa.BigInteger, nullable=False),
    sa.Column("min", sa.Float(precision=53), nullable=True),  # NULL: the bucket held no reading (count 0)
    sa.Column("max", sa.Float(precision=53), nullable=True),
    sa.Column("sum", sa.Float(precision=53), nullable=True),
    sa.Column("count", sa.BigInteger, nullable=False),
    sa.Column("nans", sa.BigInteger, nullable=False),
    sa.Column("min_ms", sa.BigInteger, nullable=True),
    sa.Column("max_ms", sa.BigInteger, nullable=True),
    sa.Column("last_value", sa.Float(precision=53), nullable=True),
    sa.Column("last_ms", sa.BigInteger, nullable=True),
    sa.Column("last_step", sa.BigInteger, nullable=True),
    sa.PrimaryKeyConstraint("run_uuid", "key", "resolution_s", "bucket_ms", name="radt_rollups_pk"),
)

series_state = sa.Table(
    "radt_rollup_series",
    metadata,
    sa.Column("run_uuid", sa.String(32), nullable=False),
    sa.Column("key", sa.String(250), nullable=False),
    # MLflow's latest_metrics row (step, timestamp, value, is_nan) the rollups cover; NULL: not built
    sa.Column("latest_step", sa.BigInteger, nullable=True),
    sa.Column("latest_ms", sa.BigInteger, nullable=True),
    sa.Column("latest_value", sa.Float(precision=53), nullable=True),
    sa.Column("latest_is_nan", sa.Boolean, nullable=True),
    sa.Column("raw_from_ms", sa.BigInteger, nullable=True),  # raw points before it were dropped (radt retain)
    sa.PrimaryKeyConstraint("run_uuid", "key", name="radt_rollup_series_pk"),
)

COLUMNS = tuple(c.name for c in rollups.columns)
VALUE_COLUMNS = ("min", "max", "sum", "count", "nans", "min_ms", "max_ms", "last_value", "last_ms", "last_step")
_NO_READING = dict.fromkeys(("min", "max", "sum", "min_ms", "max_ms", "last_value", "last_ms", "last_step"))


CREATE_TRIES = 5  # a loser's tries while the winner of a race to make radt's tables is still making them


def ensure_table(engine: sa.Engine) -> None:
    """Create radt's rollup tables where they are missing; nothing else in the store is created or changed."""
    create_missing(engine, (rollups, series_state))


def create_missing(bind: sa.Engine | sa.Connection, tables: Sequence[sa.Table]) -> None:
    """Create radt's `tables` where they are missing. Processes may race to create them (radts started together, writers
    of several nodes, two dashboards): a loser's CREATE fails (PostgreSQL: its catalog's unique key; SQLite: "already
    exists", once the winner committed) and it finds them made, or tries again for those the winner has not made yet
    (SQLite commits each CREATE alone, so a loser can fail on the first table before the second exists); any other
    failure, or one that lasts CREATE_TRIES tries, is raised."""
    for attempt in range(CREATE_TRIES):
        try:
            tables[0].metadata.create_all(bind, tables=list(tables), checkfirst=True)
            return
        except sa.exc.DBAPIError:
            if _all_exist(bind, tables):
                return
            if attempt == CREATE_TRIES - 1 or not _any_exist(bind, tables):
                raise


class OwnTable:
    """One of radt's own tables beside MLflow's, and the engines whose database is known to hold it (it is never dropped):
    made once per engine where missing (``create_missing``'s race rule), asked of the database once per engine."""

    def __init__(self, table: sa.Table) -> None:
        self.table = table
        self.made: weakref.WeakSet = weakref.WeakSet()

    def ensure(self, engine: sa.Engine) -> None:
        """Create the table where it is missing; processes may race to create it: the losers find it made."""
        if engine not in self.made:
            create_missing(engine, (self.table,))
            self.made.add(engine)

    def held(self, conn: sa.Connection) -> bool:
        """Whether the store holds the table."""
        if conn.engine in self.made:
            return True
        if sa.inspect(conn).has_table(self.table.name):
            self.made.add(conn.engine)
            return True
        return False


def _existing(bind: sa.Engine | sa.Connection, tables: Sequence[sa.Table]) -> list[bool]:
    if isinstance(bind, sa.Engine):
        with bind.connect() as conn:
            return _existing(conn, tables)
    return [sa.inspect(bind).has_table(t.name) for t in tables]


def _all_exist(bind: sa.Engine | sa.Connection, tables: Sequence[sa.Table]) -> bool:
    return all(_existing(bind, tables))


def _any_exist(bind: sa.Engine | sa.Connection, tables: Sequence[sa.Table]) -> bool:
    """Whether another process has begun making them (a failure with none made is not a race)."""
    return any(_existing(bind, tables))


# --- computing -----------------------------------------------------------------------------------


class Stored(NamedTuple):
    """A batch's points as MLflow stores them, column by column (NaN as value 0 with is_nan): what a writer inserted."""

    keys: Sequence[str]
    values: Sequence[float]
    timestamps: Sequence[int]
    steps: Sequence[int]
    is_nan: Sequence[bool]

    @classmethod
    def of_rows(cls, rows: Sequence[tuple]) -> Stored:
        """From (key, value, timestamp, step, is_nan) rows, as an INSERT ... RETURNING gives them."""
        return cls(*zip(*rows, strict=True)) if rows else cls((), (), (), (), ())

    @classmethod
    def of_dicts(cls, rows: Sequence[Mapping]) -> Stored:
        """From MLflow `metrics` rows as dicts, a column at a time (no tuple per row: a 20,000-point batch's
        allocations were a fold's largest cost, through the garbage collector)."""
        return cls(*(list(map(operator.itemgetter(c), rows)) for c in ("key", "value", "timestamp", "step", "is_nan")))

    @classmethod
    def of_points(cls, points: Iterable) -> Stored:
        """From radt Points (NaN as NaN)."""
        return cls.of_rows([(p.key, p.value, p.timestamp, p.step, False) for p in points])


def bucket_rows(run_id: str, key: str, timestamps, steps, values, resolutions: Sequence[int] = RESOLUTIONS) -> list[dict]:
    """The rollup rows of one series' points, one per (resolution, bucket) holding a point."""
    import numpy as np  # here, not at import: the recording process never loads numpy

    ts = np.asarray(timestamps, dtype=np.int64)
    return _bucket(run_id, [key], np.zeros(len(ts), dtype=np.int64), ts, steps, values, np.zeros(len(ts), dtype=bool), resolutions)


def bucket_stored(run_id: str, batch: Stored, resolutions: Sequence[int] = RESOLUTIONS) -> list[dict]:
    """The rollup rows of a batch of any keys, in one numpy pass per resolution (no per-key cost)."""
    import numpy as np

    names = sorted(dict.fromkeys(batch.keys))  # codes in name order: the rows come out sorted by key (np.unique on strings costs more)
    rank = {name: code for code, name in enumerate(names)}
    codes = np.fromiter((rank[k] for k in batch.keys), dtype=np.int64, count=len(batch.keys))
    return _bucket(run_id, names, codes, batch.timestamps, batch.steps, batch.values, batch.is_nan, resolutions)


def _bucket(run_id: str, names: Sequence[str], codes, timestamps, steps, values, is_nan, resolutions: Sequence[int]) -> list[dict]:
    """Rows of points of keys names[codes]: sorted once by (key, timestamp, step, value), cut where the key or the bucket changes."""
    import numpy as np

    ts = np.asarray(timestamps, dtype=np.int64)
    st = np.asarray(steps, dtype=np.int64)
    vs = np.asarray(values, dtype=np.float64)
    if not len(ts):
        return []
    keep = (np.abs(vs) < mlflowdb.MAX_FLOAT) & ~np.asarray(is_nan, dtype=bool)  # NaN and ±inf (±MAX_FLOAT as MLflow stores them) are no reading
    for code, name in enumerate(names):
        missing = catalogue.missing_values(name)
        if missing:
            keep &= ~((codes == code) & np.isin(vs, missing))
    gone_codes, gone = codes[~keep], ts[~keep]
    order = np.lexsort((vs[keep], st[keep], ts[keep], codes[keep]))  # by (key, timestamp, step, value), once: buckets follow time at every resolution
    c, t, s, v = codes[keep][order], ts[keep][order], st[keep][order], vs[keep][order]
    where = np.arange(len(t))
    found: dict[tuple, dict] = {}
    for resolution in resolutions:
        width = resolution * 1000
        if len(t):
            b = (t // width) * width
            starts = np.flatnonzero(np.r_[True, (b[1:] != b[:-1]) | (c[1:] != c[:-1])])
            ends = np.r_[starts[1:], len(b)] - 1  # a bucket ends with its last
            counts = np.diff(np.r_[starts, len(b)])
            sums = np.add.reduceat(v, starts)
            lows, highs = np.minimum.reduceat(v, starts), np.maximum.reduceat(v, starts)
            # the earliest point of the bucket holding its min (max): the first such index, points being in time order
            low_at = np.minimum.reduceat(np.where(v == np.repeat(lows, counts), where, len(t)), starts)
            high_at = np.minimum.reduceat(np.where(v == np.repeat(highs, counts), where, len(t)), starts)
            columns = (c[starts], b[starts], v[ends], t[ends], s[ends], sums, counts, lows, t[low_at], highs, t[high_at])
            for code, bucket_ms, last_value, last_ms, last_step, total, n, lo, lo_ms, hi, hi_ms in zip(*(x.tolist() for x in columns), strict=True):
                found[(code, resolution, bucket_ms)] = {
                    "run_uuid": run_id,
                    "key": names[code],
                    "resolution_s": resolution,
                    "bucket_ms": bucket_ms,
                    "min": lo,
                    "max": hi,
                    "sum": total,
                    "count": n,
                    "nans": 0,
                    "min_ms": lo_ms,
                    "max_ms": hi_ms,
                    "last_value": last_value,
                    "last_ms": last_ms,
                    "last_step": last_step,
                }
        if len(gone):
            pairs, counted = np.unique(np.stack([gone_codes, (gone // width) * width]), axis=1, return_counts=True)
            for code, bucket_ms, n in zip(pairs[0].tolist(), pairs[1].tolist(), counted.tolist(), strict=True):
                row = found.get((code, resolution, bucket_ms))
                if row is None:
                    row = found[(code, resolution, bucket_ms)] = {
                        "run_uuid": run_id,
                        "key": names[code],
                        "resolution_s": resolution,
                        "bucket_ms": bucket_ms,
                        "count": 0,
                        **_NO_READING,
                    }
                row["nans"] = n
    return [found[pk] for pk in sorted(found)]


def rows_of_points(run_id: str, points: Iterable, resolutions: Sequence[int] = RESOLUTIONS) -> list[dict]:
    """The rollup rows of a batch of radt Points (any keys, any order); each row's primary key once."""
    return rows_of_stored(run_id, Stored.of_points(points), resolutions)


def rows_of_stored(run_id: str, batch: Stored, resolutions: Sequence[int] = RESOLUTIONS) -> list[dict]:
    """The rollup rows of a batch as stored; each row's primary key once.

    From NUMPY_MIN_POINTS points on, numpy buckets every key at once (bucket_stored); a live writer's second of
    points goes through plain Python, the same rules, without numpy's per-call cost or its import in the
    recording process (bench/startup.py)."""
    if len(batch.keys) >= NUMPY_MIN_POINTS:
        return bucket_stored(run_id, batch, resolutions)
    return _few_rows(run_id, batch, resolutions)


def _few_rows(run_id: str, batch: Stored, resolutions: Sequence[int]) -> list[dict]:
    """bucket_stored in plain Python, for a few points."""
    found: dict[tuple, dict] = {}
    for key, value, ms, step, nan in zip(*batch, strict=True):
        missing = catalogue.missing_values(key)
        reading = not nan and abs(value) < mlflowdb.MAX_FLOAT and value not in missing  # False for NaN too
        for resolution in resolutions:
            width = resolution * 1000
            pk = (key, resolution, ms - ms % width)
            row = found.get(pk)
            if row is None:
                row = found[pk] = {"run_uuid": run_id, "key": key, "resolution_s": resolution, "bucket_ms": pk[2], "count": 0, "nans": 0, **_NO_READING}
            if not reading:
                row["nans"] += 1
                continue
            if not row["count"]:
                row.update(min=value, min_ms=ms, max=value, max_ms=ms, sum=value, last_value=value, last_ms=ms, last_step=step)
            else:
                if value < row["min"] or (value == row["min"] and ms < row["min_ms"]):
                    row["min"], row["min_ms"] = value, ms
                if value > row["max"] or (value == row["max"] and ms < row["max_ms"]):
                    row["max"], row["max_ms"] = value, ms
                row["sum"] += value
                if (ms, step, value) > (row["last_ms"], row["last_step"], row["last_value"]):
                    row["last_value"], row["last_ms"], row["last_step"] = value, ms, step
            row["count"] += 1
    return [found[pk] for pk in sorted(found)]


def _last_of(row: dict) -> tuple:
    return (row["last_ms"], row["last_step"], row["last_value"])


def _earliest(old: dict, new: dict, value: str, ms: str, better) -> tuple:
    """(value, ms) of the bucket's min (better=operator.lt) or max (operator.gt) over two rows, earliest on ties."""
    if old[value] is None or (new[value] is not None and better(new[value], old[value])):
        return new[value], new[ms]
    if new[value] is not None and new[value] == old[value]:
        return old[value], min(old[ms], new[ms])
    return old[value], old[ms]


def merge_row(old: dict, new: dict) -> dict:
    """One bucket's row from two rows of disjoint points of it (what upsert does in SQL)."""
    later = new if old["last_ms"] is None or (new["last_ms"] is not None and _last_of(new) > _last_of(old)) else old
    low, low_ms = _earliest(old, new, "min", "min_ms", operator.lt)
    high, high_ms = _earliest(old, new, "max", "max_ms", operator.gt)
    both = old["sum"] is not None and new["sum"] is not None
    return {
        **old,
        "min": low,
        "min_ms": low_ms,
        "max": high,
        "max_ms": high_ms,
        "sum": old["sum"] + new["sum"] if both else (new["sum"] if old["sum"] is None else old["sum"]),
        "count": old["count"] + new["count"],
        "nans": old["nans"] + new["nans"],
        "last_value": later["last_value"],
        "last_ms": later["last_ms"],
        "last_step": later["last_step"],
    }


# --- writing -------------------------------------------------------------------------------------


def _insert(dialect: str):
    insert = mlflowdb.dialect_insert(dialect, "rollups")
    if dialect == "postgresql":
        return insert, sa.func.least, sa.func.greatest
    return insert, sa.func.min, sa.func.max  # SQLite's scalar min()/max() of several arguments


def _first(old, new, old_ms, new_ms, better):
    """SQL for (value, ms) of a bucket's min or max over the stored and the new row, earliest on ties; NULL: no reading."""
    takes_new = sa.or_(old.is_(None), better(new, old))
    ms = sa.case((takes_new, new_ms), (new == old, sa.case((new_ms < old_ms, new_ms), else_=old_ms)), else_=old_ms)
    return sa.case((takes_new, new), else_=old), ms


@functools.cache
def _staged_upsert() -> sa.Insert:
    """The upsert from the COPY staging table (PostgreSQL), built once: building and keying it cost more than running it."""
    stage = sa.table(_STAGE, *(sa.column(c) for c in COLUMNS))
    order = [stage.c.run_uuid, stage.c.key, stage.c.resolution_s, stage.c.bucket_ms]
    return upsert_statement("postgresql", sa.select(*(stage.c[c] for c in COLUMNS)).order_by(*order))


@functools.cache
def _param_upsert(dialect: str) -> sa.Insert:
    return upsert_statement(dialect)


def upsert_statement(dialect: str, select=None):
    """INSERT ... ON CONFLICT DO UPDATE merging a new row of a bucket into the stored one (bound parameters only);
    `select`: the rows come from that SELECT (a staging table) instead of parameters."""
    insert, _least, _greatest = _insert(dialect)
    stmt = insert(rollups)
    if select is not None:
        stmt = stmt.from_select(list(COLUMNS), select)
    new, old = stmt.excluded, rollups.c
    newer = sa.or_(
        old.last_ms.is_(None),
        sa.and_(new.last_ms.is_not(None), sa.tuple_(new.last_ms, new.last_step, new.last_value) > sa.tuple_(old.last_ms, old.last_step, old.last_value)),
    )
    low, low_ms = _first(old["min"], new["min"], old.min_ms, new.min_ms, operator.lt)
    high, high_ms = _first(old["max"], new["max"], old.max_ms, new.max_ms, operator.gt)
    return stmt.on_conflict_do_update(
        index_elements=[old.run_uuid, old.key, old.resolution_s, old.bucket_ms],
        set_={
            "min": low,
            "min_ms": low_ms,
            "max": high,
            "max_ms": high_ms,
            "sum": sa.func.coalesce(old["sum"] + new["sum"], old["sum"], new["sum"]),
            "count": old["count"] + new["count"],
            "nans": old.nans + new.nans,
            "last_value": sa.case((newer, new.last_value), else_=old.last_value),
            "last_ms": sa.case((newer, new.last_ms), else_=old.last_ms),
            "last_step": sa.case((newer, new.last_step), else_=old.last_step),
        },
    )


_PRIMARY_KEY = operator.itemgetter("run_uuid", "key", "resolution_s", "bucket_ms")
_IN_COLUMNS = operator.itemgetter(*COLUMNS)
# COLUMNS' PostgreSQL types: COPY in binary costs the client a third of what text does (bench/ingest.py)
_COPY_TYPES = ["varchar", "varchar", "int4", "int8", "float8", "float8", "float8", "int8", "int8", "int8", "int8", "float8", "int8", "int8"]
_STAGE = "radt_rollups_stage"
STAGE_DDL = f"CREATE TEMP TABLE IF NOT EXISTS {_STAGE} (LIKE radt_rollups) ON COMMIT DELETE ROWS"  # constant text: a writer sends it with its own
SPLIT_FROM = 400  # rows from which upsert asks where each series' buckets end, to COPY the ones past that straight in


def upsert(conn: sa.Connection, rows: Sequence[dict], batch: int = UPSERT_BATCH) -> int:
    """Merge rows (each primary key once, as bucket_rows gives them) into the table, in sorted key order
    so concurrent writers lock rows in one order; the number of rows sent. The caller holds lock_run of the
    rows' runs, or is their only writer."""
    if not rows:
        return 0
    ordered = sorted(rows, key=_PRIMARY_KEY)
    if _copy_upsert(conn, ordered):
        return len(ordered)
    stmt = _param_upsert(conn.dialect.name)
    for start in range(0, len(ordered), batch):
        conn.execute(stmt, ordered[start : start + batch])
    return len(ordered)


def staged(conn: sa.Connection) -> None:
    """Note that the caller sent STAGE_DDL in this transaction (with its own statement: one round trip less), so the
    staging table exists and is empty."""
    conn.info[_STAGE] = (conn.get_transaction(), False)


def _copy_upsert(conn: sa.Connection, ordered: Sequence[dict]) -> bool:
    """PostgreSQL with psycopg 3: the buckets past a series' last stored one are COPYed straight into the table (nothing
    to merge: most of a catching-up batch); the rest (the bucket a batch continues, late points) is COPYed into a
    session-local staging table and merged by one INSERT ... SELECT ... ON CONFLICT DO UPDATE (psycopg sends a
    multi-row insert as one statement per row, several times slower)."""
    if conn.dialect.name != "postgresql" or conn.dialect.driver != "psycopg":
        return False
    fresh, merged = _split_new(conn, ordered) if len(ordered) >= SPLIT_FROM else ((), ordered)
    raw = conn.connection.driver_connection
    names = ", ".join(f'"{c}"' for c in COLUMNS)
    with raw.cursor() as cur:
        if fresh:
            with cur.copy(f"COPY radt_rollups ({names}) FROM STDIN (FORMAT BINARY)") as copy:
                copy.set_types(_COPY_TYPES)
                for row in map(_IN_COLUMNS, fresh):
                    copy.write_row(row)
        if merged:
            transaction = conn.get_transaction()
            made, holds_rows = conn.info.get(_STAGE, (None, False))  # what this transaction did to the staging table
            if made is not transaction:
                cur.execute(STAGE_DDL)
            elif holds_rows:  # an earlier upsert of this transaction staged rows
                cur.execute(f"TRUNCATE {_STAGE}")
            with cur.copy(f"COPY {_STAGE} ({names}) FROM STDIN (FORMAT BINARY)") as copy:
                copy.set_types(_COPY_TYPES)
                for row in map(_IN_COLUMNS, merged):
                    copy.write_row(row)
            conn.info[_STAGE] = (transaction, True)  # ON COMMIT DELETE ROWS empties it when this transaction ends
    if merged:
        conn.execute(_staged_upsert())
    return True


@functools.cache
def _frontier() -> sa.Select:
    """Per (run, key, resolution) given as arrays, the start of its last stored bucket (NULL: none); one index probe each."""
    from sqlalchemy.dialects.postgresql import ARRAY

    groups = (
        sa.func.unnest(
            sa.bindparam("runs", type_=ARRAY(sa.String)),
            sa.bindparam("keys", type_=ARRAY(sa.String)),
            sa.bindparam("levels", type_=ARRAY(sa.Integer)),
        )
        .table_valued("run_uuid", "key", "resolution_s")
        .render_derived(name="g")
    )
    r = rollups.c
    last = sa.select(sa.func.max(r.bucket_ms)).where(r.run_uuid == groups.c.run_uuid, r.key == groups.c.key, r.resolution_s == groups.c.resolution_s)
    return sa.select(groups.c.run_uuid, groups.c.key, groups.c.resolution_s, last.scalar_subquery())


def _split_new(conn: sa.Connection, ordered: Sequence[dict]) -> tuple[list[dict], list[dict]]:
    """(rows past their series' last stored bucket at their resolution, the rest). Exact while the caller holds
    lock_run: no other writer adds buckets between this read and the COPY."""
    groups = list(dict.fromkeys((r["run_uuid"], r["key"], r["resolution_s"]) for r in ordered))
    runs, keys, levels = (list(c) for c in zip(*groups, strict=True))
    last = {(run, key, level): ms for run, key, level, ms in conn.execute(_frontier(), {"runs": runs, "keys": keys, "levels": levels})}
    fresh, merged = [], []
    for row in ordered:
        edge = last.get((row["run_uuid"], row["key"], row["resolution_s"]))
        (fresh if edge is None or row["bucket_ms"] > edge else merged).append(row)
    return fresh, merged


def add_points(conn: sa.Connection, run_id: str, points: Iterable) -> int:
    """Fold a batch of a run's points (radt Points, any keys, any order) into its rollups; rows sent."""
    return upsert(conn, rows_of_points(run_id, points))


# --- freshness -----------------------------------------------------------------------------------

Latest = tuple  # (step, timestamp, value, is_nan): a latest_metrics row as MLflow stores it


def lock_run(conn: sa.Connection, run_id: str) -> None:
    """Serialise the writers of one run's rollups until the transaction ends: radt's writers (several nodes of a
    run) and rebuilds. PostgreSQL: a transaction advisory lock; SQLite: its one writer at a time does it
    (every caller writes before it reads)."""
    if conn.dialect.name == "postgresql":
        conn.execute(sa.select(sa.func.pg_advisory_xact_lock(sa.func.hashtextextended(sa.literal("radt_rollups:") + run_id, 0))))


def lock_runs(conn: sa.Connection, run_ids: Sequence[str]) -> None:
    """lock_run of several runs, always in the runs' sorted order: two callers never wait for each other in a circle."""
    for run_id in sorted(set(run_ids)):
        lock_run(conn, run_id)


def latest_rows(conn: sa.Connection, run_ids: Sequence[str], keys: Sequence[str] | None = None) -> dict[tuple[str, str], Latest]:
    """(run_id, key) -> MLflow's latest_metrics row of those runs (and keys)."""
    lm = mlflowdb.latest_metrics
    out: dict[tuple[str, str], Latest] = {}
    for part in chunks(list(run_ids)):
        query = sa.select(lm.c.run_uuid, lm.c.key, lm.c.step, lm.c.timestamp, lm.c.value, lm.c.is_nan).where(lm.c.run_uuid.in_(part))
        if keys is not None:
            query = query.where(lm.c.key.in_(list(keys)))
        for run_id, key, step, ms, value, is_nan in conn.execute(query):
            out[(run_id, key)] = (step, ms, value, bool(is_nan))
    return out


def covered_rows(conn: sa.Connection, run_ids: Sequence[str], keys: Sequence[str] | None = None) -> dict[tuple[str, str], Latest | None]:
    """(run_id, key) -> the latest_metrics row the series' rollups cover (None: never built), for series with a state row."""
    st = series_state.c
    out: dict[tuple[str, str], Latest | None] = {}
    for part in chunks(list(run_ids)):
        query = sa.select(st.run_uuid, st.key, st.latest_step, st.latest_ms, st.latest_value, st.latest_is_nan).where(st.run_uuid.in_(part))
        if keys is not None:
            query = query.where(st.key.in_(list(keys)))
        for run_id, key, step, ms, value, is_nan in conn.execute(query):
            out[(run_id, key)] = None if ms is None else (step, ms, value, bool(is_nan))
    return out


@functools.cache
def _latest_and_covered() -> sa.CompoundSelect:
    lm, st = mlflowdb.latest_metrics, series_state.c
    run, keys = sa.bindparam("run"), sa.bindparam("keys", expanding=True)
    latest = sa.select(sa.literal("l").label("kind"), lm.c.key, lm.c.step, lm.c.timestamp, lm.c.value, lm.c.is_nan).where(
        lm.c.run_uuid == run, lm.c.key.in_(keys)
    )
    covered = sa.select(sa.literal("c"), st.key, st.latest_step, st.latest_ms, st.latest_value, st.latest_is_nan).where(st.run_uuid == run, st.key.in_(keys))
    return sa.union_all(latest, covered)


def latest_and_covered(conn: sa.Connection, run_id: str, keys: Sequence[str]) -> tuple[dict[str, Latest], dict[tuple[str, str], Latest | None]]:
    """latest_rows and covered_rows of one run's keys in one statement (a writer's batch asks both: one round trip)."""
    before: dict[str, Latest] = {}
    state: dict[tuple[str, str], Latest | None] = {}
    for kind, key, step, ms, value, is_nan in conn.execute(_latest_and_covered(), {"run": run_id, "keys": list(keys)}):
        if kind == "l":
            before[key] = (step, ms, value, bool(is_nan))
        else:
            state[(run_id, key)] = None if ms is None else (step, ms, value, bool(is_nan))
    return before, state


def stale(conn: sa.Connection, run_ids: Sequence[str], key: str) -> list[str]:
    """The runs whose series `key` has points its rollups do not cover (in run_ids' order)."""
    latest = latest_rows(conn, run_ids, [key])
    covered = covered_rows(conn, run_ids, [key])
    return [r for r in dict.fromkeys(run_ids) if (r, key) in latest and covered.get((r, key)) != latest[(r, key)]]


@functools.cache
def _covered_upsert(dialect: str) -> sa.Insert:
    insert, _least, _greatest = _insert(dialect)
    stmt = insert(series_state)
    return stmt.on_conflict_do_update(
        index_elements=[series_state.c.run_uuid, series_state.c.key],
        set_={c: stmt.excluded[c] for c in ("latest_step", "latest_ms", "latest_value", "latest_is_nan")},
    )


def _set_covered(conn: sa.Connection, run_id: str, covered: Mapping[str, Latest]) -> None:
    """Record, per key, the latest_metrics row the run's rollups now cover (raw_from_ms kept)."""
    if not covered:
        return
    stmt = _covered_upsert(conn.dialect.name)
    rows = [
        {"run_uuid": run_id, "key": key, "latest_step": row[0], "latest_ms": row[1], "latest_value": row[2], "latest_is_nan": row[3]}
        for key, row in sorted(covered.items())
    ]
    conn.execute(stmt, rows)


def fold_batch(conn: sa.Connection, run_id: str, batch: Stored, before: Mapping[str, Latest], after: Mapping[str, Latest], covered: Mapping) -> int:
    """A writer's batch, in the transaction that stores its raw points: fold the points the store did not hold into
    the run's rollups and keep fresh series fresh (keep_fresh); rows sent. The caller holds lock_run first.
    `covered`: covered_rows of the batch's keys, where the caller read them with `before` (latest_and_covered)."""
    written = upsert(conn, rows_of_stored(run_id, batch))
    keep_fresh(conn, run_id, sorted(set(batch.keys)), before, after, covered)
    return written


def keep_fresh(conn: sa.Connection, run_id: str, keys: Sequence[str], before: Mapping[str, Latest], after: Mapping[str, Latest], covered: Mapping) -> None:
    """Mark the batch's series covered up to MLflow's new latest row. `before`/`after`: latest_metrics of the batch's
    keys before and after the batch. A series stays fresh when its rollups covered MLflow's latest row before the
    batch, or when it had no points at all; one that was stale stays stale (its next draw rebuilds it). `covered`:
    covered_rows of the keys, read with `before`."""
    fresh = {
        k: after[k]
        for k in keys
        if k in after and ((run_id, k) in covered and covered[(run_id, k)] == before.get(k) or (k not in before and (run_id, k) not in covered))
    }
    _set_covered(conn, run_id, fresh)


# --- building from MLflow's metrics table --------------------------------------------------------


def _rawchunks(conn: sa.Connection, run_id: str, chunk: int, key: str | None = None, since_ms: int | None = None) -> Iterator[list]:
    """A run's raw points (key, timestamp, step, value, is_nan) from MLflow's `metrics`, by key and time, `chunk` rows at a time."""
    m = mlflowdb.metrics
    query = sa.select(m.c.key, m.c.timestamp, m.c.step, m.c.value, m.c.is_nan).where(m.c.run_uuid == run_id)
    if key is not None:
        query = query.where(m.c.key == key)
    if since_ms is not None:
        query = query.where(m.c.timestamp >= since_ms)
    result = conn.execute(query.order_by(m.c.key, m.c.timestamp).execution_options(yield_per=chunk))
    while rows := result.fetchmany(chunk):
        yield rows


def _rebuild(conn: sa.Connection, run_id: str, key: str | None, since: Mapping[str, int], chunk: int) -> tuple[set[str], int]:
    """Fold the raw points (of one key, or all) into rollups already cleared; (keys seen, rows written)."""
    import numpy as np  # here, not at import: the recording process never loads numpy

    keys: set[str] = set()
    written = 0
    floor = min(since.values()) if since else None
    for part in _rawchunks(conn, run_id, chunk, key, floor):
        names = np.array([r[0] for r in part], dtype=object)
        ts = np.fromiter((r[1] for r in part), dtype=np.int64, count=len(part))
        st = np.fromiter((r[2] for r in part), dtype=np.int64, count=len(part))
        vs = np.fromiter((math.nan if r[4] else r[3] for r in part), dtype=np.float64, count=len(part))
        cuts = np.flatnonzero(np.r_[True, names[1:] != names[:-1], True])
        rows: list[dict] = []
        for lo, hi in zip(cuts[:-1], cuts[1:], strict=True):
            name = names[lo]
            keys.add(name)
            keep = slice(lo, hi)
            if name in since:  # raw points before raw_from were dropped; their rollups are kept
                first = lo + int(np.searchsorted(ts[lo:hi], since[name], side="left"))
                keep = slice(first, hi)
            rows.extend(bucket_rows(run_id, name, ts[keep], st[keep], vs[keep]))
        written += upsert(conn, rows)
    return keys, written


def _raw_from(conn: sa.Connection, run_id: str, key: str | None) -> dict[str, int]:
    """key -> raw_from_ms of the run's series that `radt retain` cut."""
    st = series_state.c
    query = sa.select(st.key, st.raw_from_ms).where(st.run_uuid == run_id, st.raw_from_ms.is_not(None))
    if key is not None:
        query = query.where(st.key == key)
    return dict(conn.execute(query).all())


def _clear(conn: sa.Connection, run_id: str, key: str | None, since: Mapping[str, int]) -> None:
    """Delete the rollups a rebuild replaces: all of the run's (or the key's), but those before raw_from_ms."""
    r = rollups.c
    where = [r.run_uuid == run_id] + ([r.key == key] if key is not None else [])
    kept = [sa.and_(r.key == k, r.bucket_ms < ms) for k, ms in since.items()]
    if kept:
        where.append(sa.not_(sa.or_(*kept)))
    conn.execute(sa.delete(rollups).where(*where))


def rebuild_series(conn: sa.Connection, run_id: str, key: str | None = None, chunk: int = READ_CHUNK) -> tuple[int, int]:
    """Replace a run's rollups (one key's, or all) by those of its raw points and mark them fresh; (series, rows).

    Idempotent; in the caller's transaction, which it locks for the run. MLflow's latest row is read before the
    raw points: a point another writer adds meanwhile leaves the series stale, never marked covered without it.
    Points are read in chunks; a series cut by a chunk boundary has its shared buckets merged by upsert."""
    lock_run(conn, run_id)
    since = _raw_from(conn, run_id, key)
    _clear(conn, run_id, key, since)
    latest = {k: row for (_r, k), row in latest_rows(conn, [run_id], None if key is None else [key]).items()}
    keys, written = _rebuild(conn, run_id, key, since, chunk)
    _set_covered(conn, run_id, latest)
    return len(keys | set(latest)), written


def rebuild_run(conn: sa.Connection, run_id: str, chunk: int = READ_CHUNK) -> tuple[int, int]:
    """Every series of a run: rebuild_series(conn, run_id)."""
    return rebuild_series(conn, run_id, None, chunk)


def ensure_fresh(engine: sa.Engine, run_ids: Sequence[str], key: str) -> list[str]:
    """Rebuild the stale series `key` of these runs (plain MLflow runs on their first draw), each in its own
    transaction; the runs rebuilt. Two dashboards rebuilding one series at once do it one after the other."""
    with engine.connect() as conn:
        if not _has_tables(conn):
            return []
        todo = stale(conn, run_ids, key)
    done = []
    for run_id in todo:
        with engine.begin() as conn:
            lock_run(conn, run_id)
            if stale(conn, [run_id], key):  # another process may have built it while this one waited
                refresh_series(conn, run_id, key)
                done.append(run_id)
    return done


def refresh_series(conn: sa.Connection, run_id: str, key: str) -> bool:
    """Bring one stale series up to date; True when only its recent part was rebuilt.

    A live run another writer logs to (MLflow's server, a script's mlflow.log_metric) goes stale at every point:
    rebuilding only from its last 20-minute bucket keeps each draw's cost off the run's length. Points that
    writer sent with older timestamps are caught by counting: the rollups must hold every raw point of the
    series once (count + nans against MLflow's rows), else the whole series is rebuilt."""
    lock_run(conn, run_id)
    coarsest = max(RESOLUTIONS)
    r = rollups.c
    mine = [r.run_uuid == run_id, r.key == key]
    since = _raw_from(conn, run_id, key)
    tail = conn.execute(sa.select(sa.func.max(r.bucket_ms)).where(*mine, r.resolution_s == coarsest)).scalar()
    if tail is None or key in since or not covered_rows(conn, [run_id], [key]):
        rebuild_series(conn, run_id, key)
        return False
    latest = {k: row for (_r, k), row in latest_rows(conn, [run_id], [key]).items()}
    conn.execute(sa.delete(rollups).where(*mine, r.bucket_ms >= tail))
    _rebuild(conn, run_id, key, {key: tail}, READ_CHUNK)
    m = mlflowdb.metrics.c
    held = conn.execute(sa.select(sa.func.count()).where(m.run_uuid == run_id, m.key == key)).scalar()
    counted = conn.execute(sa.select(sa.func.coalesce(sa.func.sum(r["count"] + r.nans), 0)).where(*mine, r.resolution_s == coarsest)).scalar()
    if int(counted) != int(held):  # a point landed before the tail: rebuild it all
        rebuild_series(conn, run_id, key)
        return False
    _set_covered(conn, run_id, latest)
    return True


def _has_tables(conn: sa.Connection) -> bool:
    return sa.inspect(conn).has_table(series_state.name)


def run_ids(conn: sa.Connection) -> list[str]:
    """Every run of the store (deleted ones too: their points are still drawn until MLflow's gc removes them)."""
    return list(conn.execute(sa.select(mlflowdb.runs.c.run_uuid).order_by(mlflowdb.runs.c.start_time, mlflowdb.runs.c.run_uuid)).scalars())


def chunks(items: Sequence, size: int = 500) -> Iterator[Sequence]:
    """Items `size` at a time: IN lists of run ids kept under the databases' parameter limits."""
    for start in range(0, len(items), size):
        yield items[start : start + size]


# --- reading -------------------------------------------------------------------------------------


class Buckets(NamedTuple):
    """One series' rollup rows at one resolution, by bucket, as numpy arrays (NaN where the bucket held no reading)."""

    bucket_ms: np.ndarray
    min: np.ndarray
    max: np.ndarray
    sum: np.ndarray
    count: np.ndarray
    nans: np.ndarray
    min_ms: np.ndarray
    max_ms: np.ndarray
    last_value: np.ndarray
    last_ms: np.ndarray

    def mean(self) -> np.ndarray:
        """Per bucket: sum / count, NaN where it held no reading."""
        import numpy as np

        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.count > 0, self.sum / np.maximum(self.count, 1), np.nan)


_READ = ("bucket_ms", "min", "max", "sum", "count", "nans", "min_ms", "max_ms", "last_value", "last_ms")


def read(conn: sa.Connection, run_ids: Sequence[str], key: str, resolution: int, lo: int | None = None, hi: int | None = None) -> dict[str, Buckets]:
    """run_id -> the series' buckets at `resolution` that overlap [lo, hi] ms (either open), sorted by time."""

    import numpy as np  # here, not at import: the recording process never loads numpy

    r = rollups.c
    width = resolution * 1000
    where = [r.key == key, r.resolution_s == resolution]
    if lo is not None:
        where.append(r.bucket_ms >= (int(lo) // width) * width)
    if hi is not None:
        where.append(r.bucket_ms <= int(hi))
    rows: dict[str, list] = {}
    for part in chunks(list(dict.fromkeys(run_ids))):
        query = sa.select(r.run_uuid, *(r[c] for c in _READ)).where(r.run_uuid.in_(part), *where).order_by(r.run_uuid, r.bucket_ms)
        for row in conn.execute(query):
            rows.setdefault(row[0], []).append(row[1:])
    out: dict[str, Buckets] = {}
    for run_id, found in rows.items():
        columns = list(zip(*found, strict=True))
        out[run_id] = Buckets(
            *(
                np.array([math.nan if v is None else v for v in column], dtype=np.int64 if name in ("bucket_ms", "count", "nans") else np.float64)
                for name, column in zip(_READ, columns, strict=True)
            )
        )
    return out


def resolution_for(span_ms: float, budget: int, per_bucket: int = 2) -> int | None:
    """The coarsest resolution whose buckets over `span_ms` still give `budget` points (`per_bucket` drawn per
    bucket: 2 for its min and max, 3 for an envelope's mean, low and high); None where even the finest gives
    fewer (the span is short: raw points are read)."""
    for resolution in sorted(RESOLUTIONS, reverse=True):
        if span_ms / (resolution * 1000) * per_bucket >= budget:
            return resolution
    return None
