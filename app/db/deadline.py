"""One deadline per dashboard request: past it the store stops reading and the view answers with a message.

A link can ask for a view that takes minutes (a thousand runs, a pattern that matches everything). Under
gunicorn such a request would hold a worker until `--timeout` kills it, with nothing on the page. Each
request gets settings.REQUEST_TIMEOUT seconds: SQLite's progress handler interrupts a query past it,
PostgreSQL's statement_timeout is set to what is left of it on each checkout, and the drawing code asks
`check()` between series. The callback turns any of these into one line on the page (`message`).
A frozen PostgreSQL (it takes the query and never answers: statement_timeout is the server's own, so it never
fires) is cut on the client: every wait of a dashboard connection on its server ends GRACE_S past the deadline,
and that connection is closed (`bounded_connect`).
"""

from __future__ import annotations

import contextvars
import functools
import math
import sqlite3
import time

import flask
import sqlalchemy as sa

from radt import settings

_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar("radt_request_deadline", default=None)
SQLITE_STEPS = 20_000  # SQLite virtual-machine steps between two looks at the clock (~1 ms of work)
SQLITE_BUSY_S = 30  # how long a read waits on a locked SQLite file outside a request (an export, a script)


GRACE_S = 1.0  # past the deadline a live server has answered (its statement_timeout fired): a silent one is cut here
SILENT = "did not answer before the request's deadline"  # in the error of a connection cut for it (timed_out reads it)


class RequestTimeout(RuntimeError):
    """This request ran past its deadline."""


def start(seconds: float | None = None) -> None:
    """Give the current request (or block of work) `seconds` from now; 0 means no deadline."""
    seconds = settings.REQUEST_TIMEOUT.get() if seconds is None else seconds
    _deadline.set(time.monotonic() + seconds if seconds > 0 else None)


def clear() -> None:
    _deadline.set(None)


def remaining() -> float | None:
    """Seconds left to this request, None when it has no deadline."""
    deadline = _deadline.get()
    return None if deadline is None else deadline - time.monotonic()


def check() -> None:
    """Raise RequestTimeout once the deadline has passed (called between series)."""
    left = remaining()
    if left is not None and left <= 0:
        raise RequestTimeout(message())


def timed_out(exc: BaseException) -> bool:
    """True for the ways a store read ends at the deadline: ours, SQLite's interrupt, PostgreSQL's statement_timeout."""
    if isinstance(exc, RequestTimeout):
        return True
    driver = isinstance(exc, sqlite3.Error) or type(exc).__module__.startswith("psycopg")  # binary_rows reads on the driver's cursor
    if isinstance(exc, sa.exc.DBAPIError) or driver:
        text = _text(exc).lower()
        return any(sign in text for sign in ("interrupted", "statement timeout", "canceling statement", "database is locked", SILENT))
    return False


def silent(exc: BaseException) -> bool:
    """True when the store itself did not answer (the connection was cut at the deadline), not the view's own reads."""
    return SILENT in _text(exc)


def slow(exc: BaseException) -> bool:
    """True for a read stopped at the deadline while it ran (SQLite's progress handler, our own check), not while it
    waited on another connection's lock (SQLite's busy timeout says "database is locked")."""
    return isinstance(exc, RequestTimeout) or "interrupted" in _text(exc).lower()


def _text(exc: BaseException) -> str:
    """The driver's own words: SQLAlchemy's wrapper names the statement too."""
    return str(getattr(exc, "orig", None) or exc)


def message(exc: BaseException | None = None) -> str:
    """The one line a view past its deadline shows: what to change in the view, or, where the store did not answer, that."""
    seconds = settings.REQUEST_TIMEOUT.get()
    if exc is not None and silent(exc):
        return f"{store_message(exc)}; {RELOAD.lower()}"
    return (
        f"This view took longer than {seconds:g} s ({settings.REQUEST_TIMEOUT.name}) and was stopped: pick fewer runs or metrics, or zoom into a shorter window"
    )


RELOAD = "Reload the page once it answers (radt dashboard's -/ready says when)"  # what to do about a store that did not answer


def store_message(exc: BaseException) -> str:
    """Why a page's own read of the store (its experiments, its runs: no view to narrow yet) ended at the deadline: the
    store did not answer at all (down, frozen), the read itself ran that long (SQLite stopped it running: a first
    /cluster load after a large import was said to be locked), or another connection held the tables it reads (a
    migration, a vacuum; PostgreSQL's statement timeout cannot tell these two apart)."""
    seconds, name = settings.REQUEST_TIMEOUT.get(), settings.REQUEST_TIMEOUT.name
    if silent(exc):
        return f"The tracking store did not answer within {seconds:g} s ({name}): it is down, frozen or unreachable"
    if slow(exc):
        return (
            f"This page's read of the tracking store took longer than {seconds:g} s ({name}) and was stopped, with no lock in its "
            f"way: the store is this large or this machine this busy; raise {name}"
        )
    return (
        f"The tracking store was busy or locked for {seconds:g} s ({name}): another connection holds the tables this page "
        "reads (a migration, radt retain, a vacuum, a long write)"
    )


def sqlite_progress() -> int:
    """SQLite's progress handler: a non-zero answer interrupts the running query."""
    left = remaining()
    return 1 if left is not None and left <= 0 else 0


def on_sqlite_checkout(dbapi_connection) -> None:
    """Wait on a locked SQLite file no longer than the request has left (its busy timeout)."""
    left = remaining()
    wait_ms = SQLITE_BUSY_S * 1000 if left is None else max(1, int(left * 1000))
    dbapi_connection.execute(f"PRAGMA busy_timeout = {wait_ms}")


def on_postgres_checkout(dbapi_connection) -> None:
    """statement_timeout for this checkout: what the request has left (the pool's rollback on return resets it)."""
    left = remaining()
    if left is None:
        return
    with dbapi_connection.cursor() as cursor:
        cursor.execute(f"SET statement_timeout = {max(1, int(left * 1000))}")


def bounded_connect(_dialect, _record, cargs: list, cparams: dict):
    """SQLAlchemy's do_connect for the dashboard's PostgreSQL engine: a connection whose waits end at the request's
    deadline, and a connect bounded by what the request has left (a frozen server accepts and never answers)."""
    import psycopg

    left = remaining()
    if left is None:
        return _bounded_connection().connect(*cargs, **cparams)
    if left <= 0:  # a draw that lost its connection at the deadline asks for no other
        raise _silent_error()
    cparams = {**cparams, "connect_timeout": max(2, min(int(cparams.get("connect_timeout") or 5), math.ceil(left + GRACE_S)))}
    try:
        return _bounded_connection().connect(*cargs, **cparams)
    except psycopg.OperationalError as exc:
        if (remaining() or 0) > 0:
            raise
        raise _silent_error() from exc


def _silent_error() -> Exception:
    import psycopg

    return psycopg.OperationalError(f"the tracking store {SILENT} ({settings.REQUEST_TIMEOUT.name})")


@functools.cache
def _bounded_connection() -> type:
    import psycopg

    class BoundedConnection(psycopg.Connection):
        """psycopg's connection, with each wait on the server bounded by the request's deadline: past it the
        connection is closed (its query's fate is unknown) and the error says so; outside a request, as psycopg's."""

        def wait(self, gen, interval: float = 0.1, timeout: float | None = None):
            left = remaining()
            if left is None:
                return super().wait(gen, interval, timeout)
            bound = max(0.01, left + GRACE_S)
            try:
                return super().wait(gen, interval, bound if timeout is None else min(timeout, bound))
            except psycopg.OperationalError as exc:
                if type(exc).__name__ != "_WaitTimeout" or (timeout is not None and timeout <= bound):
                    raise
                self.pgconn.finish()  # closed: SQLAlchemy's pool drops it rather than reuse a connection mid-query
                raise _silent_error() from exc

    return BoundedConnection


def answer_timeout(exc: Exception):
    """A callback past its deadline (one the callback did not turn into a message itself): 503 with the one line, not a 500."""
    if not timed_out(exc):
        raise exc
    return flask.jsonify(error=message(exc)), 503


def install(server: flask.Flask) -> None:
    """Start each request's clock before anything else reads the store; a read stopped by it is a 503 with a message."""
    server.before_request(start)
    server.teardown_request(lambda _exc: clear())
    for kind in (RequestTimeout, sa.exc.DBAPIError, sqlite3.Error, *_psycopg_errors()):
        server.register_error_handler(kind, answer_timeout)


def _psycopg_errors() -> tuple[type[Exception], ...]:
    try:
        import psycopg
    except ImportError:  # a SQLite-only install
        return ()
    return (psycopg.Error,)
