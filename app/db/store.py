"""The dashboard's read engine on MLflow's own tables (PostgreSQL and SQLite), and the row helpers every query shares.

Read-only by construction: the engine refuses writes (PostgreSQL sessions are read-only
transactions, SQLite connections are ``query_only``), every statement is a Core ``select()`` on
MLflow's table objects with bound parameters, and no SQL is ever built from user input. The one
exception: app/db/rollupseries.py builds radt's own rollup tables in read-write transactions of its own.
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Iterable, Sequence

import numpy as np
import sqlalchemy as sa

from radt import mlflowdb
from radt.app.db import deadline
from radt.errors import UserError

# MLflow's tables as radt's core spells them (the tracker writes the same objects)
EXPERIMENTS = mlflowdb.experiments
RUNS = mlflowdb.runs
TAGS = mlflowdb.tags
PARAMS = mlflowdb.params
METRICS = mlflowdb.metrics
LATEST = mlflowdb.latest_metrics

ACTIVE = mlflowdb.ACTIVE  # MLflow's lifecycle_stage of experiments and runs that are not deleted
LIVE_STATUSES = ("RUNNING", "SCHEDULED")  # a run with one of these statuses is still growing
CHUNK = 500  # ids per IN list (SQLite's old limit is 999 variables per statement)

Series = tuple[np.ndarray, np.ndarray]


class StoreUnreadable(UserError, RuntimeError):
    """The store cannot be read; the message is one line for the page."""


def make_read_engine(uri: str, *, pool_size: int = 5, statement_timeout_ms: int = 60_000) -> sa.Engine:
    """An engine for reading MLflow's tables that cannot write.

    PostgreSQL (``postgresql://`` uses psycopg 3 under SQLAlchemy 2.1): read-only transactions,
    a statement timeout, work_mem for the per-run aggregation, no JIT (it costs more than it saves
    on these short queries), pre-ping to survive a database restart. SQLite: the file must exist
    (``mode=rw`` never creates an empty store), connections are ``PRAGMA query_only`` and the
    journal mode is left to the writer (radt's writer puts it in WAL, so readers never block it).
    """
    if uri.startswith("postgres://"):
        uri = "postgresql://" + uri[len("postgres://") :]
    url = sa.engine.make_url(uri)
    backend = url.get_backend_name()
    if backend == "sqlite":
        connect_args: dict = {"timeout": deadline.SQLITE_BUSY_S}
        database = url.database
        if database and database != ":memory:" and not database.startswith("file:"):
            path = urllib.parse.quote(os.path.abspath(os.path.expanduser(database)))
            url = url.set(database=f"file:{path}", query={**url.query, "mode": "rw", "uri": "true"})
        engine = sa.create_engine(url, connect_args=connect_args)

        @sa.event.listens_for(engine, "connect")
        def _query_only(dbapi_connection, _record):
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA query_only = ON")
            cursor.close()
            dbapi_connection.set_progress_handler(deadline.sqlite_progress, deadline.SQLITE_STEPS)  # a request past its deadline stops here

        sa.event.listen(engine, "checkout", lambda dbapi_connection, _record, _proxy: deadline.on_sqlite_checkout(dbapi_connection))
        return engine
    if backend == "postgresql":
        options = f"-c default_transaction_read_only=on -c statement_timeout={int(statement_timeout_ms)} -c work_mem=32MB -c jit=off"
        engine = sa.create_engine(
            url,
            pool_pre_ping=True,
            pool_size=pool_size,
            max_overflow=pool_size,
            connect_args={"connect_timeout": 5, "options": options, "application_name": "radt-dashboard"},
        )
        if engine.dialect.driver == "psycopg":  # a frozen server costs a request its deadline, not its worker
            sa.event.listen(engine, "do_connect", deadline.bounded_connect)
        sa.event.listen(engine, "checkout", lambda dbapi_connection, _record, _proxy: deadline.on_postgres_checkout(dbapi_connection))
        return engine
    return sa.create_engine(url, pool_pre_ping=True)


def check_store(engine: sa.Engine) -> None:
    """Raise StoreUnreadable (one line: which store, why) unless MLflow's tables can be read."""
    where = _describe(engine.url)
    try:
        with engine.connect() as conn:
            conn.execute(sa.select(EXPERIMENTS.c.experiment_id).limit(1)).all()
            conn.execute(sa.select(METRICS.c.key).limit(1)).all()
    except sa.exc.SQLAlchemyError as exc:
        text = str(getattr(exc, "orig", None) or exc).strip()
        reason = text.splitlines()[0][:300] if text else type(exc).__name__
        if "no such table" in reason or ("does not exist" in reason and "relation" in reason):
            reason = f"not an MLflow tracking store ({reason})"
        raise StoreUnreadable(f"cannot read the tracking store {where}: {reason}") from exc


def _describe(url: sa.URL) -> str:
    """The store as the user wrote it, without its password."""
    if url.get_backend_name() == "sqlite" and (url.database or "").startswith("file:"):
        return "sqlite:///" + urllib.parse.unquote(url.database[len("file:") :])
    return url.render_as_string(hide_password=True)


# --- row helpers --------------------------------------------------------------------------------


def chunks(items: Sequence, size: int | None = None) -> Iterable[Sequence]:
    """``items`` in slices of ``size`` (default CHUNK): one IN list each, within every backend's limit on bound variables."""
    size = CHUNK if size is None else size
    for start in range(0, len(items), size):
        yield items[start : start + size]


def unique(ids: Iterable[str]) -> list[str]:
    """The ids as strings, in their first order, without duplicates or None."""
    return list(dict.fromkeys(str(i) for i in ids if i is not None))


def plain_rows(conn: sa.Connection, stmt) -> list[tuple]:
    """Plain DBAPI tuples: no SQLAlchemy Row object per row for results of many thousands of rows."""
    result = conn.execute(stmt)
    try:
        if result.returns_rows and result.cursor is not None:
            return result.cursor.fetchall()
        return []
    finally:
        result.close()


def binary_rows(conn: sa.Connection, stmt) -> list[tuple]:
    """Rows of a PostgreSQL select; with psycopg 3 in the binary protocol (bytea arrives as bytes, not hex)."""
    if conn.dialect.driver != "psycopg":
        return [tuple(row) for row in conn.execute(stmt)]
    compiled = stmt.compile(dialect=conn.dialect, compile_kwargs={"render_postcompile": True})
    cursor = conn.connection.driver_connection.cursor(binary=True)
    try:
        cursor.execute(compiled.string, compiled.params)
        return cursor.fetchall()
    finally:
        cursor.close()


def not_nan():
    """The condition that a metrics row holds a real value (MLflow stores NaN as 0 with is_nan)."""
    return METRICS.c.is_nan == sa.false()


def value_or_null(table: sa.Table = METRICS):
    """The value, NULL where MLflow stored a NaN (as 0 with is_nan); NULL reads back as NaN."""
    return sa.case((table.c.is_nan == sa.true(), sa.null()), else_=table.c.value)
