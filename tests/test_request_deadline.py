"""Every dashboard request has a deadline (RADT_REQUEST_TIMEOUT): past it the view answers with a message.

A view whose reads cannot finish (a store locked by a migration or a vacuum, a selection that scans for
minutes) used to hold its worker until PostgreSQL's 60 s statement_timeout or gunicorn's --timeout,
with a 500 or nothing on the page. Against real PostgreSQL and SQLite, with the table really locked by
another connection, the draw callback answers at the deadline with one line, and the next request is
served as usual (the pool's connections are not left with the short timeout).
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time

import psycopg
import pytest
import sqlalchemy as sa
from mlflow import MlflowClient

from radt.app.db import deadline
from radt.app.db.store import make_read_engine
from radt.collectors.store import tracking
from radt.collectors.store.stores import SqlMetricStore
from radt.points import Point
from tests.support.drawrequest import draw_request
from tests.support.postgres import address
from tests.support.proxy import TcpProxy
from tests.support.runs import radt_run

START = 1_760_000_000_000
TIMEOUT_S = 1.0
NEVER_S = 20.0  # the old code waited 60 s (PostgreSQL) or 30 s (SQLite) here: the test gives up on it after this
# no cache: each draw reads the store
pytestmark = [pytest.mark.dialects, pytest.mark.filterwarnings("ignore:Flask-Caching. CACHE_TYPE is set to NullCache:UserWarning")]


def _fill(uri: str) -> tuple[str, str]:
    client = MlflowClient(uri)
    experiment = tracking.resolve_experiment(client, uri, "deadline")
    run_id = radt_run(client, experiment, "locked out", start_time=START)
    store = SqlMetricStore(uri)
    store.write(run_id, [Point("system/gpu_0_sm_active", 0.5, START + i * 1000, i) for i in range(120)])
    store.close()
    client.set_terminated(run_id, "FINISHED", end_time=START + 120_000)
    client._tracking_client.store.engine.dispose()  # MLflow's pool holds the file open; the SQLite case changes its journal below
    return experiment, run_id


def _post(client, body: bytes) -> tuple[int, dict, float]:
    began = time.monotonic()
    response = client.post("/_dash-update-component", data=body, content_type="application/json")
    return response.status_code, json.loads(response.data or b"{}"), time.monotonic() - began


def _post_within(client, body: bytes, limit: float) -> tuple[int, dict, float]:
    """The post on a thread: the old code would hang for a minute; the test fails after `limit` s instead."""
    box: list = []
    thread = threading.Thread(target=lambda: box.append(_post(client, body)), daemon=True)
    thread.start()
    thread.join(limit)
    assert box, f"the draw did not answer within {limit:g} s while the store was locked"
    return box[0]


@pytest.fixture
def app(store_uri, monkeypatch):
    monkeypatch.setenv("RADT_REQUEST_TIMEOUT", str(TIMEOUT_S))
    monkeypatch.setenv("RADT_RESPONSE_CACHE", "0")
    experiment, run_id = _fill(store_uri)
    if store_uri.startswith("sqlite"):  # a rollback journal: a writer's EXCLUSIVE lock keeps readers out, as on NFS where WAL cannot be used
        with sqlite3.connect(store_uri[len("sqlite:///") :]) as conn:
            conn.execute("PRAGMA journal_mode = DELETE")
    from radt.app.web.dashboard import create_app

    dash_app = create_app(store_uri, cache="null")
    yield dash_app.server.test_client(), draw_request(dash_app, experiment, [run_id], ["cat:sm_active"]), store_uri


def _lock(uri: str, tables: tuple[str, ...] = ("metrics",)):
    """Another connection's lock on MLflow's metrics table (or these tables), held until the returned function is called."""
    if uri.startswith("sqlite"):
        conn = sqlite3.connect(uri[len("sqlite:///") :], isolation_level=None)
        conn.execute("BEGIN EXCLUSIVE")
    else:
        conn = psycopg.connect(sa.engine.make_url(uri).set(drivername="postgresql").render_as_string(hide_password=False))
        conn.execute(f"LOCK TABLE {', '.join(tables)} IN ACCESS EXCLUSIVE MODE")

    def release() -> None:
        conn.rollback()
        conn.close()

    return release


def _annotations(answer: dict) -> str:
    figure = answer["response"]["charts"]["figure"]
    return " ".join(a.get("text", "") for a in figure.get("layout", {}).get("annotations", []))


def test_a_draw_on_a_locked_store_answers_at_its_deadline_and_the_next_one_is_served(app):
    client, body, uri = app
    status, answer, _ = _post(client, body)
    assert status == 200 and answer["response"]["charts"]["figure"]["data"], "the view draws before the store is locked"

    release = _lock(uri)
    try:
        status, answer, took = _post_within(client, body, NEVER_S)
    finally:
        release()
    assert status == 200, answer
    assert "RADT_REQUEST_TIMEOUT" in _annotations(answer) and "was stopped" in _annotations(answer)
    assert TIMEOUT_S * 0.9 <= took < TIMEOUT_S + 3, took

    status, answer, took = _post(client, body)  # the store is free again: nothing kept the short timeout
    assert status == 200 and answer["response"]["charts"]["figure"]["data"], answer
    assert took < TIMEOUT_S * 5


def test_a_long_sqlite_query_is_interrupted_at_the_deadline(tmp_path, sqlite_template):
    """SQLite's progress handler stops a query that computes past the deadline (no lock involved)."""
    path = tmp_path / "store.db"
    path.write_bytes(sqlite_template.read_bytes())
    engine = make_read_engine(f"sqlite:///{path}")
    endless = sa.text("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 1000000000) SELECT count(*) FROM n")
    deadline.start(0.3)
    began = time.monotonic()
    try:
        with pytest.raises(sa.exc.OperationalError) as caught, engine.connect() as conn:
            conn.execute(endless).scalar_one()
    finally:
        deadline.clear()
    assert deadline.timed_out(caught.value)
    assert time.monotonic() - began < 2
    with engine.connect() as conn:  # outside a request: no deadline
        assert conn.execute(sa.text("SELECT 1")).scalar_one() == 1
    engine.dispose()


def test_postgres_statement_timeout_is_what_the_request_has_left(pg_uri):
    engine = make_read_engine(pg_uri)
    deadline.start(0.5)
    try:
        with pytest.raises(sa.exc.OperationalError) as caught, engine.connect() as conn:
            conn.execute(sa.text("SELECT pg_sleep(5)"))
    finally:
        deadline.clear()
    assert deadline.timed_out(caught.value)
    with engine.connect() as conn:  # the pool's connection is back on the engine's own timeout
        assert conn.execute(sa.text("SHOW statement_timeout")).scalar_one() == "1min"
    engine.dispose()


def test_a_callback_that_does_not_catch_the_deadline_answers_503_with_the_line(app):
    """The summary table's callback reads the store on a request of its own: locked out past the deadline it answers
    503 with the message (old: the worker waited 60 s on PostgreSQL, 30 s on SQLite, then a 500)."""
    client, body, uri = app
    drawn = json.loads(body)
    view = {"exp": drawn["state"][0]["value"], "runs": drawn["inputs"][0][0]["value"], "metrics": ["cat:sm_active"]}
    table = {
        "output": "summary.data",
        "outputs": {"id": "summary", "property": "data"},
        "inputs": [{"id": "view", "property": "data", "value": view}],
        "changedPropIds": ["view.data"],
    }
    status, answer, _ = _post(client, json.dumps(table).encode())
    assert status == 200 and answer["response"]["summary"]["data"], answer

    # the summary of an ended run is stored (radt_summaries) once drawn: it reads the runs, not their points
    release = _lock(uri, ("metrics", "runs"))
    try:
        status, answer, took = _post_within(client, json.dumps(table).encode(), NEVER_S)
    finally:
        release()
    assert status == 503 and "RADT_REQUEST_TIMEOUT" in answer["error"], (status, answer)
    assert took < TIMEOUT_S + 3, took


def test_a_draw_while_postgres_is_frozen_answers_at_its_deadline_then_draws_again(pg_uri, monkeypatch):
    """A PostgreSQL that takes the query and never answers (the proxy's blackhole: a frozen server, a paused VM, a
    stalled pooler). statement_timeout is the server's own, so it never fired: the draw held its worker for as long as
    the database hung (gunicorn's --timeout, or for good under `python app.py`), with nothing on the page. Now the
    connection is cut at the deadline, the page says the store did not answer, and once it answers the view draws."""
    monkeypatch.setenv("RADT_REQUEST_TIMEOUT", str(TIMEOUT_S))
    monkeypatch.setenv("RADT_RESPONSE_CACHE", "0")
    experiment, run_id = _fill(pg_uri)
    host, port, database = address(pg_uri)
    proxy = TcpProxy(host, port).start()
    try:
        from radt.app.web.dashboard import create_app

        dash_app = create_app(f"postgresql://postgres@127.0.0.1:{proxy.port}/{database}", cache="null")
        client, body = dash_app.server.test_client(), draw_request(dash_app, experiment, [run_id], ["cat:sm_active"])
        status, answer, _ = _post(client, body)
        assert status == 200 and answer["response"]["charts"]["figure"]["data"], "the view draws before the store freezes"

        proxy.blackhole()
        try:
            status, answer, took = _post_within(client, body, NEVER_S)
        finally:
            proxy.resume()
        assert status == 200, answer
        assert "tracking store did not answer within 1 s (RADT_REQUEST_TIMEOUT)" in _annotations(answer), _annotations(answer)
        assert took < TIMEOUT_S + deadline.GRACE_S + 3, took

        status, answer, took = _post_within(client, body, NEVER_S)  # the cut connection is gone from the pool; the next one answers
        assert status == 200 and answer["response"]["charts"]["figure"]["data"], answer
    finally:
        proxy.stop()


@pytest.mark.filterwarnings("ignore::DeprecationWarning:dash.development.base_component")  # Dash's notice that DataTable moves out (the summary)
def test_each_page_loaded_while_postgres_is_frozen_says_so(pg_uri, monkeypatch):
    """Explore and Cluster read the store in their layout, Live in its cards: while PostgreSQL was frozen each answered
    with an HTTP 503 after the deadline, which the browser does not show, so the page stayed blank (Live: its cards as
    they were, or none). Now each says the store did not answer, and what to do."""
    monkeypatch.setenv("RADT_REQUEST_TIMEOUT", str(TIMEOUT_S))
    _fill(pg_uri)
    host, port, database = address(pg_uri)
    proxy = TcpProxy(host, port).start()
    try:
        from radt.app.web.dashboard import create_app

        client = create_app(f"postgresql://postgres@127.0.0.1:{proxy.port}/{database}", "simple").server.test_client()

        def load(path: str) -> tuple[int, str]:
            return _load_page(client, path)

        assert all(load(path)[0] == 200 and "store-error" not in load(path)[1] for path in ("/", "/live", "/cluster")), "each page loads"
        proxy.blackhole()
        try:
            frozen = {path: load(path) for path in ("/", "/live", "/cluster")}
        finally:
            proxy.resume()
        for path, (status, page) in frozen.items():
            assert status == 200 and "store-error" in page, (path, status, page[:300])
            assert "The tracking store did not answer within 1 s (RADT_REQUEST_TIMEOUT)" in page, (path, page[:500])
            assert "Start the database" not in page, (path, page[:500])  # it is running: it does not answer
            fix = "come back by themselves" if path == "/live" else "once it answers"  # Live's cards poll; a page is reloaded
            assert fix in page and page.lower().count("reload") == (path != "/live"), (path, page[:500])  # once, not twice
        assert load("/")[0] == 200 and "store-error" not in load("/")[1], "the page again once the database answers"
    finally:
        proxy.stop()


def _load_page(client, path: str) -> tuple[int, str]:
    """Explore's and Cluster's layout as the browser asks for it; Live's cards (its layout reads nothing)."""
    deps = json.loads(client.get("/_dash-dependencies").data)
    if path == "/live":
        live = next(d["output"] for d in deps if "live-runs.children" in d["output"])
        inputs = [{"id": "live-go", "property": "data", "value": 1}, {"id": "live-window", "property": "value", "value": 5}]
        outputs = [{"id": o.rsplit(".", 1)[0], "property": o.rsplit(".", 1)[1]} for o in live.strip(".").split("...")]
        body = {"output": live, "outputs": outputs, "inputs": inputs, "state": [{"id": "live-signature", "property": "data", "value": None}]}
    else:
        output = next(d["output"] for d in deps if "_pages_content.children" in d["output"])
        location = [{"id": "_pages_location", "property": "pathname", "value": path}, {"id": "_pages_location", "property": "search", "value": ""}]
        outputs = [{"id": "_pages_content", "property": "children"}, {"id": "_pages_store", "property": "data"}]
        body = {"output": output, "outputs": outputs, "inputs": location, "state": []}
    status, answer, _took = _post_within(client, json.dumps(body | {"changedPropIds": []}).encode(), NEVER_S)
    return status, json.dumps(answer)


@pytest.mark.filterwarnings("ignore::DeprecationWarning:dash.development.base_component")  # Dash's notice that DataTable moves out (the summary)
def test_a_page_loaded_while_another_connection_locks_the_store_says_it_is_busy_not_down(app):
    """A migration, a `radt retain` or a vacuum holding the tables: Explore's layout is stopped at the deadline. The page
    said "This view took longer ... pick fewer runs or metrics" (there is no view yet) and "Start the database (or fix
    the URI)" (it is running): two wrong fixes. Now it says the store is busy, and what to do."""
    client, _body, uri = app
    status, page = _load_page(client, "/")
    assert status == 200 and "store-error" not in page, "the page loads before the store is locked"
    release = _lock(uri, ("experiments", "runs", "metrics"))
    try:
        status, page = _load_page(client, "/")
    finally:
        release()
    assert status == 200 and "store-error" in page, page[:500]
    assert "Start the database" not in page and "pick fewer runs" not in page, page[:800]
    assert "busy or locked" in page and "RADT_REQUEST_TIMEOUT" in page and page.lower().count("reload") == 1, page[:800]
    assert "store-error" not in _load_page(client, "/")[1], "the page again once the lock is gone"
