"""Another site's page cannot show the dashboard in a frame (clickjacking): a shared dashboard's users are logged in to
nothing, but a page framing it transparently could still lay its own buttons over the dashboard's and take their clicks
(tick runs, export, open a run's logs). Old dashboard: no frame-ancestors and no X-Frame-Options, so Chromium drew it
inside any page. RADT_FRAME_ANCESTORS names the sites that may (a group's portal); the dashboard's own pages always may.
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from radt import settings
from radt.app.web.responses import frame_headers

DASH_APP = "#react-entry-point"  # where Dash draws the page


def _framing_page(src: str) -> str:
    return f'<!doctype html><title>framing</title><iframe id="victim" src="{src}" width="1200" height="800" onload="window.framed = true"></iframe>'


@contextmanager
def _other_site(body: str) -> Iterator[str]:
    """A real server on another port of 127.0.0.1 (another origin in the same address space, so only the dashboard's
    headers decide; a page that Playwright answers for from a made-up host is refused by Chromium's private-network
    rules whatever the headers say) answering `body` to every GET; its address."""

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            data = body.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/"
    finally:
        server.shutdown()
        server.server_close()


def test_another_sites_page_cannot_frame_the_dashboard_and_its_own_pages_can(page, served):
    with _other_site(_framing_page(served)) as attacker:
        page.goto(attacker)
        page.wait_for_function("() => window.framed === true")  # the frame has loaded whatever Chromium let it show
        victim = page.frames[1]
        assert victim.url.startswith("chrome-error://"), f"Chromium showed {victim.url} inside another site's page"
        assert page.frame_locator("#victim").locator(DASH_APP).count() == 0, "nothing of the dashboard inside the other site's page"
        refused = list(page.refused)
        page.refused.clear()  # provoked here: the one refusal this test wants
        assert len(refused) == 1 and "frame-ancestors 'self'" in refused[0], refused

    own = served + "framed-by-itself"  # a page of the dashboard's own origin ('self')
    page.route(own, lambda route: route.fulfill(status=200, content_type="text/html", body=_framing_page(served)))
    page.goto(own)
    page.frame_locator("#victim").locator(DASH_APP).wait_for()
    shown = page.frames[1].url  # the dashboard then writes its view into the query string (?exp=&runs=...)
    assert shown.split("?", 1)[0] == served, f"the frame shows {shown}, not the dashboard"


@pytest.mark.parametrize(
    ("value", "csp", "xfo"),
    [
        ("'self'", "frame-ancestors 'self'; object-src 'none'; base-uri 'self'", "SAMEORIGIN"),
        ("'none'", "frame-ancestors 'none'; object-src 'none'; base-uri 'self'", "DENY"),
        ("'self'  https://portal.example.org", "frame-ancestors 'self' https://portal.example.org; object-src 'none'; base-uri 'self'", None),
        ("https://*.example.org:8443", "frame-ancestors https://*.example.org:8443; object-src 'none'; base-uri 'self'", None),
    ],
)
def test_the_frame_ancestors_setting_becomes_the_headers(value, csp, xfo):
    """X-Frame-Options can only say 'self' or nobody: with another origin allowed it is left out (else old browsers refuse the portal)."""
    assert settings.is_frame_ancestors(value)
    headers = frame_headers(value)
    assert headers["Content-Security-Policy"] == csp
    assert headers.get("X-Frame-Options") == xfo


@pytest.mark.parametrize(
    "value",
    ["https://a.org; script-src *", "'none' 'self'", "https://a.org, https://b.org", "javascript:alert(1)", "*", "'unsafe-inline'", "https://a.org/\nX: y"],
)
def test_a_frame_ancestors_value_that_would_say_more_is_refused(value):
    assert not settings.is_frame_ancestors(value)
