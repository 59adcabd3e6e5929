"""What the dashboard's header shows of its store: where it is, never its password. Every viewer of a shared dashboard
gets the header: `--store 'postgresql://radt@db:5432/x?password=...'` showed `db:5432/x?password=...` to all of them
(the header cut the URI at its last '@', which hides `user:password@` only)."""

from __future__ import annotations

import json

import pytest

SECRET = "s3cret-Pw"


@pytest.mark.filterwarnings("ignore:Flask-Caching")  # cache="null": no cache in a test of the layout
@pytest.mark.parametrize("form", ["query", "userinfo"])
def test_the_header_names_the_store_without_its_password(pg_uri, form, monkeypatch):
    from radt.app.web.dashboard import create_app

    monkeypatch.setenv("RADT_RESPONSE_CACHE", "0")
    host_and_db = pg_uri.split("@", 1)[1]  # trust authentication: the server takes the connection whatever the password
    uri = f"{pg_uri}?password={SECRET}" if form == "query" else pg_uri.replace("postgres@", f"postgres:{SECRET}@", 1)
    client = create_app(uri, cache="null").server.test_client()
    layout = client.get("/_dash-layout")
    assert layout.status_code == 200
    text = json.dumps(layout.get_json())  # the layout as JSON escapes '/'
    assert SECRET not in text, "the store's password reached the page"
    assert host_and_db in text, "the header still says which store this is"
