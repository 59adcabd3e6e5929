"""The dashboard behind a reverse proxy at a path (https://host/lab/radt/, RADT_URL_PREFIX or --url-prefix).

Before, radt could be served only at a host's root: its pages asked for /_dash-layout, /assets/..., /runs/<id>/artifacts
and linked to /live, so under nginx's `location /lab/radt/` every one of those went to whatever the host serves at /
(Grafana, another tool) or 404. Now every request a page makes, every link and the artifacts route stay under the path.
"""

from __future__ import annotations

import sqlite3
import urllib.error
import urllib.parse
import urllib.request

import pandas as pd
import pytest

from tests.support.browser import dashboard, new_page, wait_for_chart
from tests.support.radtproc import radt_env

PREFIX = "/lab/radt/"


def _experiment_of(uri: str, run_id: str) -> str:
    with sqlite3.connect(urllib.parse.urlparse(uri).path) as conn:
        return str(conn.execute("select experiment_id from runs where run_uuid = ?", (run_id,)).fetchone()[0])


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.mark.parametrize("filled_store", ["sqlite"], indirect=True)
def test_every_request_link_and_artifact_of_the_dashboard_stays_under_its_url_prefix(filled_store, browser):
    uri, run = filled_store["uri"], filled_store["five_gpus"]
    with dashboard(uri, radt_env(filled_store["home"]), "--url-prefix", PREFIX.strip("/"), path=PREFIX) as base:
        origin = base[: -len(PREFIX)]
        assert _status(origin + "/") == 404, "nothing of the dashboard answers outside its path"
        assert _status(origin + "/_dash-layout") == 404 and _status(origin + f"/runs/{run}/artifacts") == 404
        with new_page(browser, width=1440, height=900) as page:
            asked: list[str] = []
            failed: list[str] = []

            def seen(request) -> None:
                asked.append(request.url)

            def answered(response) -> None:
                if response.status >= 400:
                    failed.append(f"{response.status} {response.url}")

            context = page.context  # the logs open in a tab of their own: every tab's requests
            context.on("request", seen)
            context.on("response", answered)
            try:
                page.goto(f"{base}?exp={_experiment_of(uri, run)}&runs={run}")
                wait_for_chart(page)
                logs = page.locator('#summary td[data-dash-column="logs"] a').first
                logs.wait_for()
                assert logs.get_attribute("href") == f"{PREFIX}runs/{run}/artifacts"
                with context.expect_page() as opened:
                    logs.click()
                listing = opened.value
                try:
                    listing.wait_for_load_state()
                    assert listing.locator("link[rel=icon]").get_attribute("href") == PREFIX + "_favicon.ico", "not the browser's /favicon.ico"
                    assert listing.locator("body").inner_text().count("imported/") >= 3, "the run's three imported logs are listed"
                    listing.locator("a", has_text="mnist_nvidia_smi.csv").first.click()
                    listing.wait_for_function("() => document.body.innerText.includes('utilization.gpu')", polling=200)
                finally:
                    listing.close()

                page.goto(base)
                for name, path in (("Live", "live"), ("Cluster", "cluster"), ("Explore", "")):
                    link = page.locator("nav a.nav-link", has_text=name)
                    assert link.get_attribute("href") == PREFIX + path
                    link.click()
                    page.wait_for_function("(p) => window.location.pathname === p", arg=PREFIX + path)
                    page.wait_for_load_state("networkidle")
                # Live's "explore →" link, pointed by assets/page.js at the last explore view with its run added
                page.goto(base + "live")
                href = page.evaluate(
                    """(prefix) => { const a = document.createElement('a'); a.className = 'explore-link'; a.dataset.run = 'r2'; a.dataset.exp = '9';
                      a.href = prefix + '?exp=9&runs=r2'; document.body.appendChild(a);
                      a.dispatchEvent(new PointerEvent('pointerdown', {bubbles: true})); return a.getAttribute('href'); }""",
                    PREFIX,
                )
                runs = urllib.parse.parse_qs(urllib.parse.urlparse(href).query)["runs"][0].split(",")
                assert href.startswith(PREFIX + "?") and "r2" in runs, href
            finally:
                context.remove_listener("request", seen)
                context.remove_listener("response", answered)

        paths = {urllib.parse.urlparse(url).path for url in asked if url.startswith(origin)}
        assert paths and all(p.startswith(PREFIX) for p in paths), sorted(p for p in paths if not p.startswith(PREFIX))
        assert {p.rsplit("/", 1)[-1] for p in paths} >= {"_dash-layout", "_dash-dependencies", "_dash-update-component"}
        assert not failed, failed


def test_links_built_by_the_pages_carry_the_prefix(monkeypatch, tmp_path, empty_sqlite, radt_home):
    """The Cluster page's job and grouping links and the summary's logs cell: each a link under the path."""
    from radt.app.web.dashboard import create_app

    create_app(empty_sqlite(tmp_path / "store.db"), "simple")  # the pages register with an app
    from radt.pages import cluster
    from radt.pages.parts import summary_table

    monkeypatch.setenv("RADT_URL_PREFIX", "lab/radt")
    assert cluster._explore({"experiment_id": "3", "run_id": "abc"}) == "/lab/radt/?exp=3&runs=abc"
    assert cluster._here("account", {"user": "ada"}) == "/lab/radt/cluster?by=account&user=ada"
    (row,) = summary_table.table_rows(pd.DataFrame([{"run_id": "abc", "kind": "run", "run": "r", "command": "train.py"}]))
    assert row["logs"] == "[logs](/lab/radt/runs/abc/artifacts)"
    monkeypatch.delenv("RADT_URL_PREFIX")
    assert cluster._here("user", {}) == "/cluster"
