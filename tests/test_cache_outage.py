"""A Redis cache (RADT_CACHE=redis://..., the README's multi-user set-up) is a shortcut, never a dependency.

Old dashboard: Redis down (restarted, unreachable) made every view an HTTP 500 at once; Redis frozen (it takes the
command and never answers) a 500 after 5 s. Against the real Redis behind tests/support/proxy.py and the real store,
the draw callback answers with its chart in both cases, a frozen Redis costs one RADT_CACHE_TIMEOUT and not one per
cache call, the log says so once, and once Redis answers again the views use it.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import urllib.parse

import pytest

from tests.support.drawrequest import draw_request
from tests.support.paths import REDIS
from tests.support.ports import free_port
from tests.support.proxy import TcpProxy
from tests.test_request_deadline import _fill

pytestmark = pytest.mark.parametrize("store_uri", ["sqlite"], indirect=True)  # the cache, not the store's dialect
OWN = urllib.parse.urlsplit(REDIS)._replace(path="/7").geturl()  # a Redis database of this test's own: emptied at will


def _redis_or_skip():
    redis = pytest.importorskip("redis")
    try:
        redis.Redis.from_url(OWN, socket_connect_timeout=2).ping()
    except redis.exceptions.ConnectionError as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"Redis at {REDIS} is unreachable under CI: {exc}")
        pytest.skip(f"Redis unreachable ({exc})")
    return redis


def _draw(client, body: bytes, limit: float = 20.0) -> tuple[int, dict, float]:
    """The draw callback, on a thread: the test fails after `limit` s instead of hanging."""
    box: list = []
    began = time.monotonic()

    def post() -> None:
        answer = client.post("/_dash-update-component", data=body, content_type="application/json")
        box.append((answer.status_code, json.loads(answer.data) if answer.is_json else {"text": answer.text[:300]}))

    thread = threading.Thread(target=post, daemon=True)
    thread.start()
    thread.join(limit)
    assert box, f"the draw did not answer within {limit:g} s"
    return (*box[0], time.monotonic() - began)


def _drawn(answer: dict) -> bool:
    return bool(answer.get("response", {}).get("charts", {}).get("figure", {}).get("data"))


def test_views_are_drawn_while_redis_is_down_or_frozen_and_use_it_again_after(store_uri, monkeypatch, caplog):
    redis = _redis_or_skip()
    from radt import settings

    monkeypatch.setenv("RADT_CACHE_TIMEOUT", "0.5")
    monkeypatch.setattr(settings, "CACHE_RETRY_S", 0.5)  # Redis tried again sooner than 5 s: the test waits for it
    monkeypatch.setenv("RADT_RESPONSE_CACHE", "0")  # each draw asks the cache for its series
    experiment, run_id = _fill(store_uri)
    client = redis.Redis.from_url(OWN)
    client.flushdb()
    from radt.app.web.dashboard import create_app

    down = create_app(store_uri, f"redis://127.0.0.1:{free_port()}/0")  # nothing listens there
    body = draw_request(down, experiment, [run_id], ["cat:sm_active"])
    with caplog.at_level(logging.WARNING, logger="radt.app.view.cache"):
        status, answer, took = _draw(down.server.test_client(), body)
    assert status == 200 and _drawn(answer), (status, answer)
    said = [r.getMessage() for r in caplog.records if r.name == "radt.app.view.cache"]
    assert len(said) == 1 and said[0].startswith("the Redis cache does not answer (") and "tried again every 0.5 s" in said[0], said

    target = urllib.parse.urlsplit(OWN)
    proxy = TcpProxy(target.hostname, target.port or 6379).start()
    database = target._replace(netloc=f"127.0.0.1:{proxy.port}").geturl()
    try:
        shared = create_app(store_uri, database)
        body = draw_request(shared, experiment, [run_id], ["cat:sm_active", "cat:cpu_utilization_percentage"])
        status, answer, _ = _draw(shared.server.test_client(), body)
        assert status == 200 and _drawn(answer), "drawn through the cache while Redis answers"
        proxy.blackhole()
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="radt.app.view.cache"):
            first = _draw(shared.server.test_client(), body)
            second = _draw(shared.server.test_client(), body)
        assert first[0] == 200 and _drawn(first[1]) and second[0] == 200 and _drawn(second[1]), (first, second)
        assert first[2] < 0.5 + 3, f"a frozen Redis costs one wait of RADT_CACHE_TIMEOUT, not one per cache call: {first[2]:.1f} s"
        assert second[2] < 0.5 + 1, f"then it is left alone: {second[2]:.1f} s"
        assert len([r for r in caplog.records if r.name == "radt.app.view.cache"]) == 1, "said once, not per call"
        proxy.resume()
        with caplog.at_level(logging.WARNING, logger="radt.app.view.cache"):
            until = time.monotonic() + 15
            while not any("answers again" in r.getMessage() for r in caplog.records) and time.monotonic() < until:
                assert _draw(shared.server.test_client(), body)[0] == 200
        assert any(r.getMessage() == "the Redis cache answers again: views use it" for r in caplog.records), "said when it is back"
    finally:
        proxy.resume()
        proxy.stop()

    assert client.dbsize(), "the draw before the freeze went through Redis"
    client.flushdb()
    back = create_app(store_uri, OWN)  # Redis answers: the views use it (a fresh app: no spell of its own to wait out)
    status, answer, _ = _draw(back.server.test_client(), draw_request(back, experiment, [run_id], ["cat:sm_active"]))
    assert status == 200 and _drawn(answer) and client.dbsize(), "once Redis answers, the series go into it again"
    client.flushdb()
