"""Real headless Chromium (Debian's /usr/bin/chromium, driven by Playwright) and a real dashboard
process (`python app.py`) for the browser tests. Every wait is for a condition, never a fixed sleep."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support.paths import ARTIFACTS, REPO
from tests.support.polling import wait_http
from tests.support.ports import free_port

CHROMIUM = os.environ.get("RADT_CHROMIUM", "/usr/bin/chromium")
POLL_MS = 50  # how often a page.wait_for_function predicate is evaluated
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update", "--disable-sync"]

# JavaScript helpers evaluated in the page: the traces Plotly drew on the explore charts, each named as its tooltip names
# it ("run · GPU 1", from the trace's meta: the legend names the run once).
TRACES_JS = """
(axis) => {
  const g = document.querySelector('#charts .js-plotly-plot');
  if (!g || !g._fullData) { return null; }
  return g._fullData.filter(t => (t.yaxis || 'y') === axis && t.visible !== false)
    .map(t => ({name: t.meta && t.meta.name !== undefined ? t.meta.name + (t.meta.device ? ' · ' + t.meta.device : '') : t.name,
                n: t.x ? t.x.length : 0, x: Array.from(t.x || []), showlegend: t.showlegend}));
}
"""


def chromium_path() -> str:
    """Debian's Chromium; under CI its absence fails the run (.ci/run installs it)."""
    path = shutil.which(CHROMIUM) or (CHROMIUM if os.path.exists(CHROMIUM) else None)
    if path is None:
        message = f"Chromium not found at {CHROMIUM}; apt-get install chromium (or set RADT_CHROMIUM)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path


@contextmanager
def chromium():
    """A Playwright browser on Debian's Chromium with the flags this machine needs."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@contextmanager
def chromium_with_cache() -> Iterator:
    """Chromium with one profile on disk for a whole test process: pages from `new_page` share its HTTP cache and the
    compiled scripts V8 keeps there (Dash, React and Plotly are ~1 s of Chromium's CPU a page when compiled afresh, as
    a new incognito context does), while `new_page` clears cookies and storage after each page, so no test sees
    another's state."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright, tempfile.TemporaryDirectory(prefix="radt-chromium-") as profile:
        context = playwright.chromium.launch_persistent_context(profile, executable_path=chromium_path(), args=CHROMIUM_ARGS, accept_downloads=True)
        # the tab the profile opens with stays open, blank, for the DevTools session that clears what each page left
        # (_forget): a fresh tab for it cost 0.18 s of Chromium's CPU per test page
        keeper = context.pages[0] if context.pages else context.new_page()
        context.radt_cdp = context.new_cdp_session(keeper)
        try:
            yield context
        finally:
            context.close()


@contextmanager
def dashboard(store: str, env: dict[str, str], *extra: str, path: str = "/") -> Iterator[str]:
    """`python app.py --store STORE` on a free port, as a user starts it; yields the base URL (its PATH: where a
    `--url-prefix` serves it).

    Its output goes to a file, not a pipe nobody reads (a pipe fills after some hundred requests' log lines and the server blocks)."""
    port = free_port()
    command = [sys.executable, str(REPO / "app.py"), "--store", store, "--port", str(port), *extra]
    with tempfile.TemporaryFile("w+") as log:
        process = subprocess.Popen(command, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, text=True)
        base = f"http://127.0.0.1:{port}{path}"
        try:
            wait_http(base, process, output=lambda: _read(log))
            yield base
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _read(log) -> str:
    log.seek(0)
    return log.read()


def screenshot(page, name: str) -> Path | None:
    """Keep what the browser showed as a test artifact (test-artifacts/NAME.png) when RADT_TEST_SCREENSHOTS=1: a
    full-page PNG costs Chromium ~0.7 s of CPU, and nothing asserts on them (they are for a person's review)."""
    if os.environ.get("RADT_TEST_SCREENSHOTS") != "1":
        return None
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


# what a page leaves behind in a profile that the next test's page must not see (the HTTP cache stays: it holds only
# what any dashboard serves alike, and Flask's assets are revalidated)
STATE_KINDS = "cookies,local_storage,indexeddb,websql,service_workers,cache_storage,file_systems,shared_storage,storage_buckets"


@contextmanager
def new_page(browser, width: int = 1400, height: int = 1000, **context) -> Iterator:
    """A page with no cookies, storage or downloads of another test's: in a context of its own on a `chromium()`
    browser, or a fresh tab of `chromium_with_cache()`'s profile, whose every origin's state is cleared when it closes."""
    from playwright.sync_api import BrowserContext

    shared = isinstance(browser, BrowserContext)
    if shared:
        if set(context) - {"accept_downloads"}:
            raise ValueError(f"a shared profile takes no context options: {sorted(context)}")
        # a page still open here (a module fixture's, read by several tests) stays open, and loses its origin's cookies
        # and storage when this one closes: harmless for a drawn page that is only read, and the next test starts clean
        ctx, opened = browser, set(browser.pages)
        page = ctx.new_page()
        page.set_viewport_size({"width": width, "height": height})
        origins: set[str] = set()

        def seen(request) -> None:
            origins.add(_origin(request.url))

        ctx.on("request", seen)
    else:
        ctx = browser.new_context(viewport={"width": width, "height": height}, **context)
        page = ctx.new_page()
    try:
        page.set_default_timeout(30_000)
        page.wait_for_function = functools.partial(_wait_for_function, page.wait_for_function)
        # what Chromium refused under the dashboard's Content-Security-Policy (an inline script it does not name, an
        # eval): every browser test fails on it, so no page of the dashboard needs what the policy forbids; a test that
        # provokes a refusal reads and empties the list
        page.refused = []
        page.on("console", lambda message: "Content Security Policy" in message.text and page.refused.append(message.text))
        yield page
        assert not page.refused, f"Chromium refused under the dashboard's Content-Security-Policy: {page.refused}"
    finally:
        if not shared:
            ctx.close()
        else:
            for other in [p for p in ctx.pages if p not in opened]:  # the test's page and any it opened
                other.close()
            ctx.remove_listener("request", seen)
            _forget(ctx, origins)


def _wait_for_function(wait, expression, arg=None, **options):
    """Playwright's wait_for_function, polled every POLL_MS, its predicate always a function.

    Polling: by default Playwright runs the predicate on every animation frame, which keeps headless Chromium drawing 60
    frames a second for the whole wait (a third of the browser tests' CPU). A function: a predicate written as an
    expression is given to the page's eval() again on every poll, which the dashboard's Content-Security-Policy refuses
    (no 'unsafe-eval'); a function is compiled once, by DevTools, and then only called. Both forms are wrapped alike."""
    if isinstance(expression, str):
        expression = "(arg) => { const v = (" + expression + "\n); return typeof v === 'function' ? v(arg) : v; }"
    return wait(expression, arg=arg, **{"polling": POLL_MS, **options})


def _origin(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}" if parts.scheme in ("http", "https") else ""


def _forget(ctx, origins: set[str]) -> None:
    """Cookies and every origin's storage gone from the shared profile, as a closed incognito context would leave it
    (Storage.clearDataForOrigin acts on the whole profile, whichever tab's session sends it)."""
    ctx.clear_cookies()
    for origin in filter(None, origins):
        ctx.radt_cdp.send("Storage.clearDataForOrigin", {"origin": origin, "storageTypes": STATE_KINDS})


# --- the explore page ------------------------------------------------------------------------------


# the page's view as assets/page.js keeps it: the query string, and a long view's keys after '#' over it
URL_VIEW_JS = (
    "(() => { const p = new URLSearchParams(location.search); if (/^#[^#]*=/.test(location.hash)) "
    "{ new URLSearchParams(location.hash.slice(1)).forEach((v, k) => p.set(k, v)); } return p; })()"
)
CHARTS_DRAWN_JS = "() => { const g = document.querySelector('#charts .js-plotly-plot'); return g && g._fullData && g._fullData.length > 2; }"


def wait_for_chart(page) -> None:
    """Until the explore page's charts hold more than the empty figure's traces (a view was drawn)."""
    page.wait_for_function(CHARTS_DRAWN_JS)


def drawn_traces(page, axis: str = "y") -> list[dict]:
    """The traces Plotly drew on the chart of `axis` (y = the first chart, SMACT)."""
    return page.evaluate(TRACES_JS, axis) or []


def wait_for_traces(page, names: set[str], axis: str = "y") -> list[dict]:
    """Until the chart on `axis` shows exactly these legend names; its traces."""
    page.wait_for_function(
        "([axis, names]) => { const t = (" + TRACES_JS + ")(axis); return t && JSON.stringify(t.map(x => x.name).sort()) === JSON.stringify(names); }",
        arg=[axis, sorted(names)],
    )
    return drawn_traces(page, axis)


def relayout_chart(page, update: dict) -> None:
    """What a drag or a double-click on the chart sends, once the chart listens for it (dcc.Graph
    binds its Plotly listeners again after a redraw that replaced the plot element, and a relayout sent while Plotly.react
    is still drawing a new figure, `dash-graph--pending`, can be undone by that figure)."""
    page.wait_for_function(
        "() => { const g = document.querySelector('#charts .js-plotly-plot');"
        " return g && g._ev && g._ev.listeners('plotly_relayout').length > 0 && !g.classList.contains('dash-graph--pending')"
        " && !document.querySelector('#charts .dash-spinner, .dash-loading'); }"
    )
    page.evaluate("(update) => Plotly.relayout(document.querySelector('#charts .js-plotly-plot'), update)", update)


def chart_titles(page) -> list[str]:
    return page.locator("#charts .annotation-text").all_text_contents()
