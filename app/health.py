"""The dashboard's health checks for a load balancer or Kubernetes, named as Prometheus names its own.

`-/healthy` says the process answers (a liveness probe: restart it when this fails); `-/ready` says it can read its
store now (a readiness probe: send it no users while this fails), and why not in one line, without the password.
Both under the dashboard's path (RADT_URL_PREFIX), both plain text and never cached.
"""

from __future__ import annotations

import flask

from radt.app.state import STATE, store_error
from radt.app.store import StoreUnreadable, check_store
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
    problem = store_error()  # a store that could not be read is tried again here, at most every few seconds
    if problem is None and STATE.engine is not None:
        try:
            check_store(STATE.engine)  # the database may have gone away since it was last read
        except StoreUnreadable as exc:
            problem = str(exc)
    if problem is not None:
        return _text(f"radt dashboard is not ready: {problem}", 503)
    return _text(f"radt dashboard is ready: the store {display_uri(STATE.store_uri)} can be read.", 200)


def install(server: flask.Flask, prefix: str = "/") -> None:
    """The two checks on the dashboard's Flask server, under the path it is served at."""
    server.add_url_rule(prefix + HEALTHY, "radt_healthy", healthy)
    server.add_url_rule(prefix + READY, "radt_ready", ready)
