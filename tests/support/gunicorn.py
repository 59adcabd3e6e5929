"""The dashboard under gunicorn, as the README deploys it (`gunicorn -w 4 --timeout 30 -b ... 'radt.app:server'`), and the
requests a browser sends it: for the tests of hostile links (tests/test_hostile_requests.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

from tests.support.paths import REPO
from tests.support.polling import wait_http
from tests.support.ports import free_port

README_COMMAND = ("-w", "4", "--timeout", "30")  # the README's server command, but its address


@contextmanager
def gunicorn(env: dict[str, str], *options: str) -> Iterator[str]:
    """`gunicorn OPTIONS -b 127.0.0.1:PORT 'radt.app:server'` (the README's options by default); yields its base URL."""
    port = free_port()
    command = [sys.executable, "-m", "gunicorn", *(options or README_COMMAND), "-b", f"127.0.0.1:{port}", "radt.app:server"]
    base = f"http://127.0.0.1:{port}/"
    with tempfile.TemporaryFile("w+") as log:
        process = subprocess.Popen(command, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, text=True)
        try:
            wait_http(base, process)
            yield base
        finally:
            process.terminate()
            process.wait(timeout=30)


def page_body(search: str, pathname: str = "/") -> bytes:
    """The request Dash's pages callback sends for a URL's path and query string (the page's layout)."""
    outputs = [("_pages_content", "children"), ("_pages_store", "data")]
    body = {
        "output": ".." + "...".join(f"{i}.{p}" for i, p in outputs) + "..",
        "outputs": [{"id": i, "property": p} for i, p in outputs],
        "inputs": [{"id": "_pages_location", "property": "pathname", "value": pathname}, {"id": "_pages_location", "property": "search", "value": search}],
        "state": [],
        "changedPropIds": ["_pages_location.search"],
    }
    return json.dumps(body).encode()


def page(base: str, search: str, timeout: float) -> tuple[int, str]:
    """The explore page's layout for a query string, as the browser asks for it: (status, answer)."""
    return post(base + "_dash-update-component", page_body(search), timeout)


def post(url: str, body: bytes, timeout: float) -> tuple[int, str]:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    return fetch(request, timeout)


def fetch(request: urllib.request.Request | str, timeout: float) -> tuple[int, str]:
    """(status, text) of a request, an HTTP error's too."""
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


def timed_get(url: str, timeout: float) -> float:
    """Seconds until GET url answered 200."""
    began = time.monotonic()
    status, _ = fetch(url, timeout)
    assert status == 200, status
    return time.monotonic() - began
