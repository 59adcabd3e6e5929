"""The dashboard's health checks (app/web/health.py), on the real dashboard's Flask server: `-/healthy` while the process
answers, `-/ready` only while its store can be read, and why not in one line without the store's password.

Before, a load balancer or Kubernetes had only `/` to probe, which answers 200 with the page's shell whether or not
the store can be read: users were sent to a dashboard whose every chart said the database was away.
"""

from __future__ import annotations

import pytest

from tests.support.postgres import address
from tests.support.proxy import TcpProxy


def _app(uri: str, monkeypatch, prefix: str | None = None):
    from radt.app.web.dashboard import create_app

    if prefix is not None:
        monkeypatch.setenv("RADT_URL_PREFIX", prefix)
    return create_app(uri, "simple").server.test_client()


def test_ready_only_while_the_database_answers_and_never_says_the_password(pg_uri, monkeypatch):
    host, port, database = address(pg_uri)
    proxy = TcpProxy(host, port).start()
    uri = f"postgresql://postgres:s3cret-pw@127.0.0.1:{proxy.port}/{database}"  # trust auth: any password is taken
    try:
        client = _app(uri, monkeypatch)
        answer = client.get("/-/ready")
        assert answer.status_code == 200, answer.text
        assert answer.text.startswith("radt dashboard is ready: the store postgresql://postgres:***@127.0.0.1:")
        assert answer.headers["Cache-Control"] == "no-store" and answer.mimetype == "text/plain"

        proxy.stop()  # the database goes away under a running dashboard
        answer = client.get("/-/ready")
        assert answer.status_code == 503 and answer.text.startswith("radt dashboard is not ready: cannot read the tracking store postgresql://")
        assert "s3cret" not in answer.text and len(answer.text.strip().splitlines()) == 1, answer.text
        assert client.get("/-/healthy").status_code == 200, "the process still answers: no restart for a database away"

        proxy = TcpProxy(host, port, port=proxy.port).start()
        answer = client.get("/-/ready")
        assert answer.status_code == 200, answer.text
    finally:
        proxy.stop()


@pytest.mark.parametrize(("prefix", "under"), [(None, "/"), ("/lab/radt/", "/lab/radt/")])
def test_checks_answer_under_the_dashboards_path(prefix, under, tmp_path, empty_sqlite, radt_home, monkeypatch):
    client = _app(empty_sqlite(tmp_path / "store.db"), monkeypatch, prefix)
    assert client.get(under + "-/healthy").text == "radt dashboard is healthy.\n"
    assert client.get(under + "-/ready").status_code == 200
    if prefix:
        assert client.get("/-/ready").status_code == 404


def test_a_store_not_there_yet_is_not_ready_and_says_what_to_do(tmp_path, radt_home, monkeypatch):
    client = _app(f"sqlite:///{tmp_path / 'nothing.db'}", monkeypatch)
    answer = client.get("/-/ready")
    assert answer.status_code == 503
    assert (
        answer.text
        == f"radt dashboard is not ready: no store at {tmp_path / 'nothing.db'} yet: fill it with `radt demo`, or track a run with `radt train.py`\n"
    )
    assert client.get("/-/healthy").status_code == 200


def test_ready_answers_within_its_bound_while_the_database_hangs_and_keeps_one_check_in_flight(pg_uri, monkeypatch):
    """A database that takes the query and never answers (a frozen server: the proxy's blackhole) held every `-/ready`
    for good, each probe one more stuck request thread; a probe's timeout is a second or a few. It answers 503 within
    RADT_READY_TIMEOUT now, and the probes that come while one check hangs wait on that one, not on one each."""
    import threading
    import time

    from radt.app.web import health

    host, port, database = address(pg_uri)
    proxy = TcpProxy(host, port).start()
    monkeypatch.setenv("RADT_READY_TIMEOUT", "1")
    try:
        client = _app(f"postgresql://postgres@127.0.0.1:{proxy.port}/{database}", monkeypatch)
        assert client.get("/-/ready").status_code == 200
        proxy.blackhole()
        answers: list = []

        def probe() -> None:
            started = time.monotonic()
            answer = client.get("/-/ready")
            answers.append((answer.status_code, answer.text, time.monotonic() - started))

        probes = [threading.Thread(target=probe, daemon=True) for _ in range(3)]
        for thread in probes:
            thread.start()
        for thread in probes:
            thread.join(20)
        assert len(answers) == 3, "every probe was answered"
        for status, text, took in answers:
            assert status == 503 and took < 5, (status, text, took)
            assert (
                text == f"radt dashboard is not ready: the tracking store postgresql://postgres@127.0.0.1:{proxy.port}/{database} did not answer within 1 s\n"
            )
        assert health.checks_in_flight() == 1, "the probes shared the one check that hangs"
        proxy.resume()
        assert wait_ready(client) == 200, "ready again once the database answers"
    finally:
        proxy.stop()


def wait_ready(client, timeout: float = 20) -> int:
    """The status of the first `-/ready` that is 200, or the last one's after `timeout`."""
    from tests.support.polling import wait_for

    status: list[int] = []
    wait_for(lambda: status.append(client.get("/-/ready").status_code) or status[-1] == 200, timeout=timeout, what="-/ready to answer 200")
    return status[-1]
