"""The browser tests share one Chromium profile per process (its cache saves ~1 s of CPU a page); what one test's page
leaves (a cookie, localStorage such as the saved view, IndexedDB) must not reach the next test's page."""

from __future__ import annotations

from tests.support.browser import new_page

LEAVE = """async () => {
  document.cookie = "radt_test=left; path=/";
  localStorage.setItem("radt_test", "left");
  await new Promise((done) => { const r = indexedDB.open("radt_test"); r.onupgradeneeded = () => r.result.createObjectStore("s"); r.onsuccess = () => { r.result.close(); done(); }; });
}"""

FOUND = """async () => ({
  cookie: document.cookie,
  local: localStorage.getItem("radt_test"),
  idb: (await indexedDB.databases()).map((d) => d.name),
})"""


def test_a_page_sees_nothing_an_earlier_page_left(browser, served):
    with new_page(browser) as first:
        first.goto(served)
        first.evaluate(LEAVE)
        left = first.evaluate(FOUND)
    assert left == {"cookie": "radt_test=left", "local": "left", "idb": ["radt_test"]}, "the page could store what the next must not see"

    with new_page(browser) as second:
        second.goto(served)
        assert second.evaluate(FOUND) == {"cookie": "", "local": None, "idb": []}
