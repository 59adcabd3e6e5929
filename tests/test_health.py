"""The dashboard's health checks (app/health.py), on the real dashboard's Flask server: `-/healthy` while the process
answers, `-/ready` only while its store can be read, and why not in one line without the store's password.

Before, a load balancer or Kubernetes had only `/` to probe, which answers 200 with the page's shell whether or not
the store can be read: users were sent to a dashboard whose every chart said the database was away.
"""

from __future__ import annotations

import pytest

from tests.support.postgres import address
from tests.support.proxy import TcpProxy


def _app(uri: str, monkeypatch, prefix: str | None = None):
    from radt.app.dashboard import create_app

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
