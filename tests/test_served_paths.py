"""What a scanner or a hostile colleague asks the dashboard for beyond its pages answers 404, never a 500.

Dash serves its bundles under /_dash-component-suites/PACKAGE/PATH and raises for any path it did not register: a
`../../../etc/passwd`, an unknown package, a fingerprint that is not the file's. Each was a 500 and, in the
dashboard's log, a traceback with the list of every bundle path, once per request. The real create_app on a real store.
"""

from __future__ import annotations

import logging

import pytest

HOSTILE = [
    "_dash-component-suites/dash/../../../etc/passwd",
    "_dash-component-suites/dash/..%2f..%2f..%2fetc%2fpasswd",
    "_dash-component-suites/nope/x.js",
    "_dash-component-suites/dash/deps/react@18.3.1.v9_9_9m1700000000.min.js",
    "_dash-component-suites/dash/dcc/no-such-file.js",
]


@pytest.fixture
def client(empty_sqlite, tmp_path, radt_home):
    from radt.app.web.dashboard import create_app

    return create_app(empty_sqlite(tmp_path / "store.db"), "simple").server.test_client()


@pytest.mark.parametrize("path", HOSTILE)
def test_a_bundle_path_dash_does_not_serve_is_404_with_nothing_in_the_log(client, path, caplog):
    with caplog.at_level(logging.ERROR):
        answer = client.get("/" + path)
    assert answer.status_code == 404, (path, answer.status_code, answer.text[:200])
    assert answer.text == "not found\n", "no list of the bundle paths, no file"
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [r.getMessage()[:200] for r in caplog.records]


def test_a_bundle_the_page_asks_for_is_still_served(client):
    page = client.get("/").text
    bundle = next(part.split('"')[0] for part in page.split('src="/')[1:] if part.startswith("_dash-component-suites/dash/deps/react@"))
    answer = client.get("/" + bundle)
    assert answer.status_code == 200 and b"React" in answer.data[:5000], bundle
