"""One process at a time creates or migrates a store's schema: radts started together on a new store (a Slurm array,
a CSV's first runs) would otherwise run MLflow's migrations side by side, and all but one fail ("duplicate column name:
step", "Online migration expected to match one row").

SQLite: flock on `<file>.lock` beside the database, so every process that can write the file takes the same lock,
whatever its RADT_HOME or host. PostgreSQL: a transaction-level advisory lock on a fixed key in the store's own
database (held in one open transaction, so it works through PgBouncer's transaction pooling too). Another database:
no lock (MLflow's own creation). A holder that dies releases it: the kernel closes its file, PostgreSQL ends its session.
"""

from __future__ import annotations

import contextlib
import fcntl
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import sqlalchemy as sa

# PostgreSQL advisory lock key of a store's creation: b"radtmake" as a bigint (advisory keys are per database)
ADVISORY_KEY = int.from_bytes(b"radtmake", "big")
POLL_S = 0.05  # a waiter's look at the lock; the holder runs MLflow's migrations for seconds


@contextlib.contextmanager
def creating(engine: sa.Engine, timeout: float) -> Iterator[bool]:
    """Held while this process creates or migrates the store; yields False where another held it past `timeout` seconds
    (the caller looks at the store again instead of creating it)."""
    if engine.dialect.name == "sqlite":
        with _file_lock(lock_path(engine), timeout) as held:
            yield held
    elif engine.dialect.name == "postgresql":
        with _advisory_lock(engine, timeout) as held:
            yield held
    else:
        yield True


def lock_path(engine: sa.Engine) -> Path | None:
    """The lock file beside a SQLite store's file; None for an in-memory or URI-named database (no file to share)."""
    database = engine.url.database
    if not database or database == ":memory:" or database.startswith("file:"):
        return None
    return Path(database).expanduser().with_name(Path(database).name + ".lock")


@contextlib.contextmanager
def _file_lock(path: Path | None, timeout: float) -> Iterator[bool]:
    """flock on `path`, waited for up to `timeout` seconds; a folder where it cannot be made is not locked (nor can the store be made there)."""
    if path is None:
        yield True
        return
    try:
        handle = open(path, "a")  # noqa: SIM115 - held open for the lock's lifetime
    except OSError:
        yield True
        return
    with handle:
        held = _wait(lambda: _try_flock(handle), timeout)
        try:
            yield held
        finally:
            if held:
                fcntl.flock(handle, fcntl.LOCK_UN)


def _try_flock(handle) -> bool:
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


@contextlib.contextmanager
def _advisory_lock(engine: sa.Engine, timeout: float) -> Iterator[bool]:
    """pg_try_advisory_xact_lock on ADVISORY_KEY in one transaction kept open while the caller works; its end releases it."""
    with engine.connect() as conn, conn.begin():
        try_lock = sa.text("SELECT pg_try_advisory_xact_lock(:key)").bindparams(key=ADVISORY_KEY)
        yield _wait(lambda: bool(conn.execute(try_lock).scalar()), timeout)


def _wait(attempt: Callable[[], bool], timeout: float) -> bool:
    """`attempt()` until it succeeds (True) or `timeout` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while not attempt():
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_S)
    return True
