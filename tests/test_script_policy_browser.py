"""No script runs in the dashboard's pages but its own (CSP script-src): a shared dashboard shows what anyone who can
write to the store wrote (run names, params, tags, logs), so a way to get markup into a page must not also be a way to
run a script in every colleague's browser. Old dashboard: no script-src, so an inline script, an inline event handler
or an eval() that reached a page ran. Now: scripts from the dashboard's own origin, and of the inline ones only those
Dash wrote (its renderer's start and the pages' clientside callbacks), named by their hashes; no eval.

Every browser test checks the other half: tests/support/browser.new_page fails a test whose page Chromium refused
anything under the policy, so every page the suite draws needs nothing it forbids.
"""

from __future__ import annotations

import base64
import hashlib
import re

import requests
from mlflow import MlflowClient

from tests.support.browser import wait_for_chart

# markup that reached the page three ways a script could ride in with it: an inline <script>, an inline event handler,
# and a string given to setTimeout (compiled as eval() is); each violation Chromium reports is counted in the page
INJECT = """() => {
  window.refusals = [];
  document.addEventListener('securitypolicyviolation', (e) => window.refusals.push(e.violatedDirective));
  const s = document.createElement('script');
  s.textContent = 'window.pwned = "inline"';
  document.body.appendChild(s);
  const img = document.createElement('img');
  img.setAttribute('onerror', 'window.pwned = "handler"');
  img.src = 'data:,not-an-image';
  document.body.appendChild(img);
  setTimeout('window.pwned = "timer"', 0);
}"""
# an inline <script> Chromium runs: not a data block (type application/json) and not inside an HTML comment
INLINE = re.compile(r"<script(?![^>]*\bsrc=)(?![^>]*type=\"application/json\")[^>]*>(.*?)</script>", re.S)


def _executable_inline_scripts(html: str) -> list[str]:
    return INLINE.findall(re.sub(r"<!--.*?-->", "", html, flags=re.S))


def test_each_inline_script_of_the_page_is_named_and_nothing_else_may_run(served):
    page = requests.get(served, timeout=60)
    policy = dict(part.strip().split(" ", 1) for part in page.headers["Content-Security-Policy"].split(";"))
    sources = policy["script-src"].split()
    assert sources[0] == "'self'" and not [s for s in sources if "unsafe" in s or s in ("*", "data:", "http:", "https:")], sources
    scripts = _executable_inline_scripts(page.text)
    assert len(scripts) >= 2, "Dash's renderer start and the pages' clientside callbacks"
    hashes = {f"'sha256-{base64.b64encode(hashlib.sha256(s.encode()).digest()).decode()}'" for s in scripts}
    assert hashes <= set(sources[1:]), f"an inline script of the page is not named in script-src: {hashes - set(sources[1:])}"
    for path in ("live", "cluster", "assets/charts.js", "runs/nosuchrun/artifacts"):
        answer = requests.get(served + path, timeout=60)
        assert answer.headers["Content-Security-Policy"] == page.headers["Content-Security-Policy"], path


def test_a_script_that_reached_the_page_is_refused_and_the_charts_still_draw(page, served, filled_store):
    run_id = filled_store["five_gpus"]  # five GPUs' series from the real logs
    experiment = MlflowClient(filled_store["uri"]).get_run(run_id).info.experiment_id
    page.goto(f"{served}?exp={experiment}&runs={run_id}")
    wait_for_chart(page)
    page.evaluate(INJECT)
    page.wait_for_function("() => window.pwned !== undefined || window.refusals.length >= 3")
    assert page.evaluate("() => [window.pwned, window.refusals.sort()]") == [None, ["script-src", "script-src-attr", "script-src-elem"]]
    refused = list(page.refused)
    page.refused.clear()  # provoked here; any other test's page fails on one
    assert len(refused) == 3 and all("script-src" in line for line in refused), refused
