"""The explore chart's kept responses and the dashboard's compression (app/web/responses.py), on SQLite and PostgreSQL.

A Flask test client of the real dashboard (create_app on a real store) posts the draw callback's request as a
browser does: a view of ended runs is answered from the kept gzip bytes the second time, and drawn again once a
run of its experiment starts or ends; a view with a running run is never kept, and its new points show within
the poll interval; responses are gzip-compressed for a client that accepts gzip, and only then.
"""

from __future__ import annotations

import base64
import gzip
import json

import numpy as np
import pytest
from mlflow import MlflowClient

from radt.app.view.cache import RUNNING_TIMEOUT
from radt.app.web.responses import HIT_HEADER
from radt.collectors.store import tracking
from radt.collectors.store.stores import SqlMetricStore
from radt.points import Point
from tests.support.drawrequest import draw_request
from tests.support.polling import wait_for
from tests.support.runs import radt_run

pytestmark = pytest.mark.dialects  # the SQL radt issues differs per dialect: SQLite and the real PostgreSQL

START = 1_700_000_000_000  # long ended: every cache may keep these runs
POINTS = 120
GZIP = {"Content-Type": "application/json", "Accept-Encoding": "gzip, deflate"}


def _write(uri: str, run_id: str, start: int, first: int, count: int) -> None:
    values = 0.5 + 0.3 * np.sin(np.arange(first, first + count) / 7.0)
    store = SqlMetricStore(uri)
    store.write(run_id, [Point("system/gpu_0_sm_active", float(v), start + (first + i) * 1000, first + i) for i, v in enumerate(values)])
    store.close()


def _store(uri: str, running: bool = False) -> dict:
    """An experiment with two ended runs (A, B) of SMACT and, when `running`, a third (C) still running."""
    client = MlflowClient(uri)
    experiment = tracking.resolve_experiment(client, uri, "kept responses")
    runs = {}
    for name in ("A", "B") + (("C",) if running else ()):
        start = START if name != "C" else START + 10_000_000
        runs[name] = radt_run(client, experiment, f"run {name}", start_time=start)
        _write(uri, runs[name], start, 0, POINTS)
        if name != "C":
            client.set_terminated(runs[name], "FINISHED", end_time=START + POINTS * 1000)
    return {"client": client, "experiment": str(experiment), "runs": runs}


def draw_body(app, experiment: str, run_ids: list[str]) -> bytes:
    """The draw callback's request, from the dashboard's own callback list: the runs ticked, SMACT, defaults elsewhere."""
    return draw_request(app, experiment, run_ids, ["cat:sm_active"])


def _post(client, body: bytes, headers=GZIP):
    response = client.post("/_dash-update-component", data=body, headers=headers)
    assert response.status_code == 200, response.data[:300]
    return response


def _payload(response) -> dict:
    data = gzip.decompress(response.data) if response.headers.get("Content-Encoding") == "gzip" else response.data
    return json.loads(data)


def _points(payload: dict) -> int:
    """Points drawn in the chart: every trace's y values (plain lists or Plotly's typed arrays)."""
    total = 0
    for trace in payload["response"]["charts"]["figure"]["data"]:
        y = trace.get("y")
        if isinstance(y, dict) and "bdata" in y:
            total += len(np.frombuffer(base64.b64decode(y["bdata"]), dtype=np.dtype(y["dtype"])))
        elif isinstance(y, list):
            total += len(y)
    return total


@pytest.fixture
def dashboard_app(store_uri):
    """create_app on the test's store with the in-process cache (called after the store is filled and the settings set)."""
    from radt.app.web.dashboard import create_app

    return lambda: create_app(store_uri, "simple")


def test_a_view_of_ended_runs_is_kept_until_its_experiment_changes(store_uri, dashboard_app):
    store = _store(store_uri, running=True)  # C runs on beside the view (not drawn): its end changes the experiment
    app = dashboard_app()
    client = app.server.test_client()
    body = draw_body(app, store["experiment"], [store["runs"]["A"], store["runs"]["B"]])
    first = _post(client, body)
    assert first.headers[HIT_HEADER] == "miss"
    second = _post(client, body)
    assert second.headers[HIT_HEADER] == "hit", "the same view of ended runs is served from the kept response"
    assert _payload(second) == _payload(first)
    assert _points(_payload(second)) == 2 * POINTS

    store["client"].set_terminated(store["runs"]["C"], "FINISHED", end_time=START + 10_000_000 + POINTS * 1000)  # a run of the experiment ends
    wait_for(lambda: _post(client, body).headers[HIT_HEADER] == "miss", timeout=10, what="a fresh draw after a run of the experiment ended")
    assert _post(client, body).headers[HIT_HEADER] == "hit", "kept again for the experiment as it is now"


def test_a_view_with_a_running_run_is_never_kept_and_shows_new_points(store_uri, dashboard_app):
    store = _store(store_uri, running=True)
    app = dashboard_app()
    client = app.server.test_client()
    body = draw_body(app, store["experiment"], [store["runs"]["A"], store["runs"]["C"]])
    for _ in range(3):
        response = _post(client, body)
        assert response.headers.get(HIT_HEADER) is None, "a view with a running run is drawn every time"
    assert _points(_payload(response)) == 2 * POINTS
    _write(store_uri, store["runs"]["C"], START + 10_000_000, POINTS, 30)  # the running run logs 30 more samples
    wait_for(
        lambda: _points(_payload(_post(client, body))) == 2 * POINTS + 30,
        timeout=RUNNING_TIMEOUT + 8,  # the series cache keeps a running run for one poll interval, the run list a few seconds
        what="the running run's new points in the chart",
    )


def test_responses_are_gzipped_for_clients_that_accept_gzip(store_uri, dashboard_app):
    store = _store(store_uri)
    app = dashboard_app()
    client = app.server.test_client()
    body = draw_body(app, store["experiment"], list(store["runs"].values()))
    for _ in range(2):  # drawn, then kept
        response = _post(client, body)
        assert response.headers["Content-Encoding"] == "gzip" and "Accept-Encoding" in response.headers["Vary"]
        assert _points(json.loads(gzip.decompress(response.data))) == 2 * POINTS
    plain = _post(client, body, headers={"Content-Type": "application/json"})
    assert plain.headers.get(HIT_HEADER) == "hit" and "Content-Encoding" not in plain.headers
    assert json.loads(plain.data) == json.loads(gzip.decompress(response.data)), "the kept bytes, unpacked for a client without gzip"
    layout = client.get("/_dash-layout", headers={"Accept-Encoding": "gzip"})
    assert layout.headers["Content-Encoding"] == "gzip" and json.loads(gzip.decompress(layout.data))


def test_radts_assets_are_gzipped_once_whatever_query_a_client_adds(store_uri, dashboard_app):
    """plotly-radt.min.js (1.5 MB) is sent gzipped with a weak validator that still answers 304; a client that varies the
    query string (?m=1, ?m=2, ...) to fill the server's memory of compressed files gets the one entry, not one each."""
    from radt.app.web import responses

    app = dashboard_app()
    client = app.server.test_client()
    gz = {"Accept-Encoding": "gzip"}
    first = client.get("/assets/plotly-radt.min.js", headers=gz)
    assert first.status_code == 200 and first.headers["Content-Encoding"] == "gzip" and "Accept-Ranges" not in first.headers
    assert gzip.decompress(first.data).startswith(b"/* plotly.js ")
    tag = first.headers["ETag"]
    assert tag.startswith('W/"'), tag
    assert client.get("/assets/plotly-radt.min.js", headers=gz | {"If-None-Match": tag}).status_code == 304
    held = len(responses._static)
    for n in range(50):
        assert client.get(f"/assets/plotly-radt.min.js?m={n}", headers=gz).data == first.data
    assert len(responses._static) == held, "one compressed copy per file, not per query string"


def test_the_baseline_switches_turn_both_off(store_uri, dashboard_app, monkeypatch):
    monkeypatch.setenv("RADT_RESPONSE_CACHE", "0")
    monkeypatch.setenv("RADT_COMPRESS", "0")
    store = _store(store_uri)
    app = dashboard_app()
    client = app.server.test_client()
    body = draw_body(app, store["experiment"], list(store["runs"].values()))
    for _ in range(2):
        response = _post(client, body)
        assert response.headers.get(HIT_HEADER) is None and "Content-Encoding" not in response.headers
