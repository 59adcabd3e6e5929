"""Rollups: min / max / sum / count / last of every series per time bucket, in radt's own table beside MLflow's.

A chart draws a run from the coarsest resolution that still gives it its point budget, so its cost depends
on runs × budget, not on run length; min and max keep every dip and spike exact at every resolution.

Rules, the same in numpy (`bucket_rows`), in Python (`merge_row`) and in SQL (`upsert`):
- a bucket is [bucket_ms, bucket_ms + resolution_s * 1000) of the point's timestamp (ms since the epoch);
- NaN values are skipped, as MLflow's charts skip them: a bucket of NaNs only has no row (MLflow stores NaN
  as 0 with is_nan, so rows read from its `metrics` table with is_nan are skipped too); so are infinities,
  which MLflow stores as ±1.797e308 (±MAX_FLOAT): a sum or mean holding them means nothing, and
  PostgreSQL refuses the overflowing sum of two;
- last is the value at the greatest (timestamp, step, value): the value breaks ties as MLflow's
  latest_metrics does, so the result does not depend on the order batches arrive in;
- merging is min of mins, max of maxes, sum + sum, count + count, the later last: late and out-of-order
  batches give the rows one computation over all points gives (sums up to float rounding).

The table has no foreign key and is created with its own metadata: MLflow's tables and alembic_version
are never touched, and MLflow (which checks its schema revision only) opens the store as before.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import sqlalchemy as sa

from radt import mlflowdb

RESOLUTIONS = (10, 60, 600)  # seconds per bucket, finest first
UPSERT_BATCH = 5000  # rows per upsert statement batch
READ_CHUNK = 200_000  # raw points read at a time by rebuild_run: memory stays bounded on any run length

metadata = sa.MetaData()

rollups = sa.Table(
    "radt_rollups",
    metadata,
    sa.Column("run_uuid", sa.String(32), nullable=False),
    sa.Column("key", sa.String(250), nullable=False),
    sa.Column("resolution_s", sa.Integer, nullable=False),
    sa.Column("bucket_ms", sa.BigInteger, nullable=False),
    sa.Column("min", sa.Float(precision=53), nullable=False),
    sa.Column("max", sa.Float(precision=53), nullable=False),
    sa.Column("sum", sa.Float(precision=53), nullable=False),
    sa.Column("count", sa.BigInteger, nullable=False),
    sa.Column("last_value", sa.Float(precision=53), nullable=False),
    sa.Column("last_ms", sa.BigInteger, nullable=False),
    sa.Column("last_step", sa.BigInteger, nullable=False),
    sa.PrimaryKeyConstraint("run_uuid", "key", "resolution_s", "bucket_ms", name="radt_rollups_pk"),
)

COLUMNS = tuple(c.name for c in rollups.columns)
VALUE_COLUMNS = ("min", "max", "sum", "count", "last_value", "last_ms", "last_step")


def ensure_table(engine: sa.Engine) -> None:
    """Create radt's rollup table where it is missing; nothing else in the store is created or changed."""
    metadata.create_all(engine, tables=[rollups], checkfirst=True)


# --- computing -----------------------------------------------------------------------------------


def bucket_rows(run_id: str, key: str, timestamps, steps, values, resolutions: Sequence[int] = RESOLUTIONS) -> list[dict]:
    """The rollup rows of one series' points, one per (resolution, bucket) holding a finite value."""
    ts = np.asarray(timestamps, dtype=np.int64)
    st = np.asarray(steps, dtype=np.int64)
    vs = np.asarray(values, dtype=np.float64)
    keep = np.abs(vs) < mlflowdb.MAX_FLOAT  # NaN and ±inf (±MAX_FLOAT as MLflow stores them) are left out
    ts, st, vs = ts[keep], st[keep], vs[keep]
    rows: list[dict] = []
    if not len(ts):
        return rows
    for resolution in resolutions:
        width = resolution * 1000
        bucket = (ts // width) * width
        order = np.lexsort((vs, st, ts, bucket))  # by bucket, then (timestamp, step, value): a bucket ends with its last
        b, t, s, v = bucket[order], ts[order], st[order], vs[order]
        starts = np.flatnonzero(np.r_[True, b[1:] != b[:-1]])
        ends = np.r_[starts[1:], len(b)] - 1
        mins, maxs, sums = np.minimum.reduceat(v, starts), np.maximum.reduceat(v, starts), np.add.reduceat(v, starts)
        counts = np.diff(np.r_[starts, len(b)])
        columns = (b[starts], mins, maxs, sums, counts, v[ends], t[ends], s[ends])
        rows.extend(
            {
                "run_uuid": run_id,
                "key": key,
                "resolution_s": resolution,
                "bucket_ms": bucket_ms,
                "min": lo,
                "max": hi,
                "sum": total,
                "count": n,
                "last_value": last_value,
                "last_ms": last_ms,
                "last_step": last_step,
            }
            for bucket_ms, lo, hi, total, n, last_value, last_ms, last_step in zip(*(c.tolist() for c in columns), strict=True)
        )
    return rows


def rows_of_points(run_id: str, points: Iterable, resolutions: Sequence[int] = RESOLUTIONS) -> list[dict]:
    """The rollup rows of a batch of radt Points (any keys); each row's primary key once."""
    by_key: dict[str, list] = {}
    for p in points:
        by_key.setdefault(p.key, []).append((p.timestamp, p.step, p.value))
    rows: list[dict] = []
    for key in sorted(by_key):
        ts, st, vs = zip(*by_key[key], strict=True)
        rows.extend(bucket_rows(run_id, key, ts, st, vs, resolutions))
    return rows


def _last_of(row: dict) -> tuple:
    return (row["last_ms"], row["last_step"], row["last_value"])


def merge_row(old: dict, new: dict) -> dict:
    """One bucket's row from two rows of disjoint points of it (what upsert does in SQL)."""
    later = new if _last_of(new) > _last_of(old) else old
    return {
        **old,
        "min": min(old["min"], new["min"]),
        "max": max(old["max"], new["max"]),
        "sum": old["sum"] + new["sum"],
        "count": old["count"] + new["count"],
        "last_value": later["last_value"],
        "last_ms": later["last_ms"],
        "last_step": later["last_step"],
    }


# --- writing -------------------------------------------------------------------------------------


def _insert(dialect: str):
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert

        return insert, sa.func.least, sa.func.greatest
    if dialect == "sqlite":
        from sqlalchemy.dialects.sqlite import insert

        return insert, sa.func.min, sa.func.max  # SQLite's scalar min()/max() of several arguments
    raise ValueError(f"rollups support PostgreSQL and SQLite stores, not {dialect}")


def upsert_statement(dialect: str):
    """INSERT ... ON CONFLICT DO UPDATE merging a new row of a bucket into the stored one (bound parameters only)."""
    insert, least, greatest = _insert(dialect)
    stmt = insert(rollups)
    new, old = stmt.excluded, rollups.c
    newer = sa.tuple_(new.last_ms, new.last_step, new.last_value) > sa.tuple_(old.last_ms, old.last_step, old.last_value)
    return stmt.on_conflict_do_update(
        index_elements=[old.run_uuid, old.key, old.resolution_s, old.bucket_ms],
        set_={
            "min": least(old["min"], new["min"]),
            "max": greatest(old["max"], new["max"]),
            "sum": old["sum"] + new["sum"],
            "count": old["count"] + new["count"],
            "last_value": sa.case((newer, new.last_value), else_=old.last_value),
            "last_ms": sa.case((newer, new.last_ms), else_=old.last_ms),
            "last_step": sa.case((newer, new.last_step), else_=old.last_step),
        },
    )


_PRIMARY_KEY = operator.itemgetter("run_uuid", "key", "resolution_s", "bucket_ms")


def upsert(conn: sa.Connection, rows: Sequence[dict], batch: int = UPSERT_BATCH) -> int:
    """Merge rows (each primary key once, as bucket_rows gives them) into the table, in sorted key order
    so concurrent writers lock rows in one order; the number of rows sent."""
    if not rows:
        return 0
    stmt = upsert_statement(conn.dialect.name)
    ordered = sorted(rows, key=_PRIMARY_KEY)
    for start in range(0, len(ordered), batch):
        conn.execute(stmt, ordered[start : start + batch])
    return len(ordered)


def add_points(conn: sa.Connection, run_id: str, points: Iterable) -> int:
    """Fold a batch of a run's points (radt Points, any keys, any order) into its rollups; rows sent."""
    return upsert(conn, rows_of_points(run_id, points))


# --- building from MLflow's metrics table --------------------------------------------------------


def _raw_chunks(conn: sa.Connection, run_id: str, chunk: int) -> Iterator[list]:
    """A run's raw points from MLflow's `metrics`, NaNs left out (bucket_rows leaves out infinities), by key and time, `chunk` rows at a time."""
    m = mlflowdb.metrics
    query = (
        sa.select(m.c.key, m.c.timestamp, m.c.step, m.c.value)
        .where(m.c.run_uuid == run_id, m.c.is_nan == sa.false())
        .order_by(m.c.key, m.c.timestamp)
        .execution_options(yield_per=chunk)
    )
    result = conn.execute(query)
    while rows := result.fetchmany(chunk):
        yield rows


def rebuild_run(conn: sa.Connection, run_id: str, chunk: int = READ_CHUNK) -> tuple[int, int]:
    """Replace a run's rollups by those of its raw points (idempotent); (series, rows written).

    Points are read in chunks; a series cut by a chunk boundary has its shared buckets merged by upsert."""
    conn.execute(sa.delete(rollups).where(rollups.c.run_uuid == run_id))
    keys: set[str] = set()
    written = 0
    for part in _raw_chunks(conn, run_id, chunk):
        names = np.array([r[0] for r in part], dtype=object)
        ts = np.fromiter((r[1] for r in part), dtype=np.int64, count=len(part))
        st = np.fromiter((r[2] for r in part), dtype=np.int64, count=len(part))
        vs = np.fromiter((r[3] for r in part), dtype=np.float64, count=len(part))
        cuts = np.flatnonzero(np.r_[True, names[1:] != names[:-1], True])
        rows: list[dict] = []
        for lo, hi in zip(cuts[:-1], cuts[1:], strict=True):
            keys.add(names[lo])
            rows.extend(bucket_rows(run_id, names[lo], ts[lo:hi], st[lo:hi], vs[lo:hi]))
        written += upsert(conn, rows)
    return len(keys), written


def run_ids(conn: sa.Connection) -> list[str]:
    """Every run of the store (deleted ones too: their points are still drawn until MLflow's gc removes them)."""
    return list(conn.execute(sa.select(mlflowdb.runs.c.run_uuid).order_by(mlflowdb.runs.c.start_time, mlflowdb.runs.c.run_uuid)).scalars())
