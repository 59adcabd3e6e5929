"""Stored run summaries: one row per ended run in radt's own table beside MLflow's, written once, read after.

A run's summary (app/summary/summaries.py run_summary) reads every raw point of its GPU series; an ended run's points do not
change, so the dashboard computes it once and keeps it here (app/summary/summarystore.py). A row counts while its `version`
is the summaries' definition and its `fingerprint` what the run looks like now (status, end, latest_metrics, the
tags the summary reads): a point another writer adds (MLflow's client, an `mlflow server`) changes the fingerprint.

A point radt itself adds can leave latest_metrics as it was (a late batch `radt sync` uploads after the run ended):
its writer calls `invalidate` in the transaction that stores the points, which drops the run's row. A dashboard
claims a row (a pending row: no summary yet) before it reads the raw points and fills it after, only where the row
is still its claim: a write that lands meanwhile drops the claim, and the summary, computed without it, is not kept.

No foreign key, its own metadata: MLflow's tables and alembic_version are never touched.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import sqlalchemy as sa

from radt import mlflowdb, rollups

metadata = sa.MetaData()

summaries = sa.Table(
    "radt_summaries",
    metadata,
    sa.Column("run_uuid", sa.String(32), nullable=False),
    sa.Column("version", sa.Integer, nullable=False),  # app.summary.summaries.SUMMARY_VERSION the row was computed under
    sa.Column("fingerprint", sa.Text, nullable=False),  # the run as it was when its points were read
    sa.Column("claim", sa.String(32), nullable=False),  # the computation that wrote the row (a pending row is filled by it alone)
    sa.Column("computed_ms", sa.BigInteger, nullable=True),  # NULL: pending, being computed
    sa.Column("summary", sa.Text, nullable=True),  # the run_summary row as JSON (NaN kept); NULL: pending
    sa.PrimaryKeyConstraint("run_uuid", name="radt_summaries_pk"),
)

CHUNK = 250  # run ids per IN list


class Stored(NamedTuple):
    """A run's stored row: the summary (None while pending) and what it was computed from."""

    version: int
    fingerprint: str
    summary: dict | None


_OWN = rollups.OwnTable(summaries)


def ensure_table(engine: sa.Engine) -> None:
    """Create radt_summaries where it is missing; two processes may race to create it: the loser finds it made."""
    _OWN.ensure(engine)


def has_table(conn: sa.Connection) -> bool:
    """Whether the store holds radt_summaries (remembered per engine once it does: the table is never dropped)."""
    return _OWN.held(conn)


def invalidate(conn: sa.Connection, run_id: str) -> None:
    """Drop a run's stored summary, in the caller's transaction (a writer's, beside the points it adds).

    The table is created here where it is missing, in a savepoint: a dashboard that creates it meanwhile waits for
    this transaction, so it never claims a row before these points are visible to it."""
    if conn.engine not in _OWN.made:
        try:
            with conn.begin_nested():
                metadata.create_all(conn, tables=[summaries], checkfirst=True)
        except sa.exc.DBAPIError:
            pass  # another writer made it meanwhile (SQLite: "already exists"), or this user may not create tables: the savepoint is undone
        if not has_table(conn):
            return  # no table: no summary stored to drop
    conn.execute(sa.delete(summaries).where(summaries.c.run_uuid == run_id))


def read(conn: sa.Connection, run_ids: Sequence[str]) -> dict[str, Stored]:
    """run_id -> its stored row, for the runs that have one."""
    s = summaries.c
    out = {}
    if not has_table(conn):
        return out
    for part in rollups.chunks(run_ids, CHUNK):
        for run_id, version, fingerprint, summary in conn.execute(sa.select(s.run_uuid, s.version, s.fingerprint, s.summary).where(s.run_uuid.in_(part))):
            out[run_id] = Stored(version, fingerprint, None if summary is None else json.loads(summary))
    return out


def frozen(conn: sa.Connection, run_ids: Sequence[str]) -> set[str]:
    """The runs whose older raw points `radt retain` dropped (a series with raw_from_ms): their summary cannot be computed again."""
    st = rollups.series_state.c
    out: set[str] = set()
    if not run_ids or not sa.inspect(conn).has_table(rollups.series_state.name):
        return out
    for part in rollups.chunks(run_ids, CHUNK):
        out.update(conn.execute(sa.select(st.run_uuid).where(st.run_uuid.in_(part), st.raw_from_ms.is_not(None)).distinct()).scalars())
    return out


def claim(conn: sa.Connection, fingerprints: Mapping[str, str], version: int, token: str) -> None:
    """Put a pending row (this computation's `token`, no summary) for each run, replacing what was stored."""
    if not fingerprints:
        return
    insert = mlflowdb.dialect_insert(conn.dialect.name, "stored summaries")(summaries)
    stmt = insert.on_conflict_do_update(
        index_elements=[summaries.c.run_uuid], set_={c: insert.excluded[c] for c in ("version", "fingerprint", "claim", "computed_ms", "summary")}
    )
    rows = [
        {"run_uuid": r, "version": version, "fingerprint": f, "claim": token, "computed_ms": None, "summary": None} for r, f in sorted(fingerprints.items())
    ]
    conn.execute(stmt, rows)


def fill(conn: sa.Connection, rows: Mapping[str, Mapping], token: str) -> None:
    """Store each run's summary row in its pending row, where that is still this computation's claim."""
    s = summaries.c
    stmt = (
        sa.update(summaries)
        .where(s.run_uuid == sa.bindparam("r"), s.claim == token, s.summary.is_(None))
        .values(summary=sa.bindparam("s"), computed_ms=sa.bindparam("ms"))
    )
    now = int(time.time() * 1000)
    if rows:
        conn.execute(stmt, [{"r": r, "s": encode(row), "ms": now} for r, row in sorted(rows.items())])


def encode(row: Mapping) -> str:
    """A summary row as JSON: NaN and infinities as JSON's NaN / Infinity (json reads them back), numpy scalars as Python's."""
    return json.dumps(dict(row), default=_plain, allow_nan=True)


def _plain(value):
    if hasattr(value, "item"):  # a numpy scalar
        return value.item()
    raise TypeError(f"a summary holds {type(value).__name__}, which JSON does not")
