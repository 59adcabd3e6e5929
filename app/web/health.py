"""The dashboard's health checks for a load balancer or Kubernetes, named as Prometheus names its own.

`-/healthy` says the process answers (a liveness probe: restart it when this fails); `-/ready` says it can read its
store now (a readiness probe: send it no users while this fails), and why not in one line, without the password.
Both under the dashboard's path (RADT_URL_PREFIX), both plain text and never cached. `-/ready` answers within
RADT_READY_TIMEOUT even when the database takes the query and never answers, with one check in flight at a time.
"""

from __future__ import annotations

import concurrent.futures
import threading

import flask

from radt import settings
from radt.app.db.state import STATE, store_error
from radt.app.db.store import StoreUnreadable, check_store
from radt.settings import display_uri

HEALTHY, READY = "-/healthy", "-/ready"


def _text(body: str, status: int) -> flask.Response:
    response = flask.Response(body + "\n", status=status, mimetype="text/plain")
    response.headers["Cache-Control"] = "no-store"
    return response


def healthy() -> flask.Response:
    return _text("radt dashboard is healthy.", 200)


def ready() -> flask.Response:
    """200 when the store's tables can be read now (a query of each, as at start); 503 and the reason otherwise."""
    wait = settings.READY_TIMEOUT.get()
    try:
        problem = _shared_check().result(timeout=wait)
    except concurrent.futures.TimeoutError:
        problem = f"the tracking store {display_uri(STATE.store_uri)} did not answer within {wait:g} s"
    if problem is not None:
        return _text(f"radt dashboard is not ready: {problem}", 503)
    return _text(f"radt dashboard is ready: the store {display_uri(STATE.store_uri)} can be read.", 200)


def _problem() -> str | None:
    """Why the store cannot be read now, or None."""
    problem = store_error()  # a store that could not be read is tried again here, at most every few seconds
    if problem is None and STATE.engine is not None:
        try:
            check_store(STATE.engine)  # the database may have gone away since it was last read
        except StoreUnreadable as exc:
            problem = str(exc)
    return problem


_lock = threading.Lock()
_running: concurrent.futures.Future | None = None


def _shared_check() -> concurrent.futures.Future:
    """The check in flight, or a new one on a thread of its own: a hung database holds one thread, not one per probe."""
    global _running
    with _lock:
        if _running is None or _running.done():
            _running = concurrent.futures.Future()
            threading.Thread(target=_run, args=(_running,), name="radt-ready", daemon=True).start()
        return _running


def _run(future: concurrent.futures.Future) -> None:
    try:
        future.set_result(_problem())
    except BaseException as exc:  # an unexpected error is the probe's 500, as before, not a thread's traceback
        future.set_exception(exc)


def checks_in_flight() -> int:
    """Checks started and not yet answered by the store (the tests count them)."""
    return sum(t.name == "radt-ready" and t.is_alive() for t in threading.enumerate())


def install(server: flask.Flask, prefix: str = "/") -> None:
    """The two checks on the dashboard's Flask server, under the path it is served at."""
    server.add_url_rule(prefix + HEALTHY, "radt_healthy", healthy)
    server.add_url_rule(prefix + READY, "radt_ready", ready)
