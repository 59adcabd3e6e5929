"""The diagnosis in Chromium (issue #54): under Explore's charts a run's findings, each with a button that zooms the
charts to the span it covers (the view's own zoom: into the URL, the axis switched from steps to time since start), and
on the Live page a running run's findings over its last minutes, following the run as its series change."""

from __future__ import annotations

import time
from urllib.parse import urlencode

import pytest

from radt.catalogue import MetricName
from radt.collectors.store import tracking
from radt.collectors.store.stores import SqlMetricStore
from tests.support import state
from tests.support.browser import URL_VIEW_JS, dashboard, screenshot
from tests.support.diagnosed import MINUTE, views_store, write_series
from tests.support.radtproc import radt_env
from tests.support.runs import radt_run

START = 1_760_000_000_000
# the first chart's x range in the view's units (a short run's "since start" axis counts seconds: layout.meta.x_per_minute)
X_RANGE_JS = """() => {
  const g = document.querySelector('#charts .js-plotly-plot');
  if (!g || !g.layout || !g.layout.xaxis || !g.layout.xaxis.range) { return null; }
  const per = Number((g.layout.meta || {}).x_per_minute) || 1;
  return g.layout.xaxis.range.map(v => Number(v) / per);
}"""


@pytest.fixture(scope="module")
def findings_store(tmp_path_factory, sqlite_template):
    home = tmp_path_factory.mktemp("findings")
    with state.sqlite_home(home, sqlite_template) as uri:
        made = views_store(uri, START)
    with dashboard(uri, radt_env(home)) as base:
        yield base, uri, made


def test_a_findings_button_zooms_the_charts_to_the_span_it_covers(page, findings_store):
    base, _uri, made = findings_store
    pair = made["pair"]
    page.goto(base + "?" + urlencode({"exp": made["experiment"], "runs": pair, "x": "step"}))
    finding = page.locator(f".run-finding[data-run='{pair}'] .finding[data-code=throttled]")
    finding.locator("button.finding-zoom").wait_for()
    assert finding.text_content().startswith("throttled: clocks held down (GPU 0 by the power cap 33% of the time)")
    assert page.locator(f".run-finding[data-run='{pair}'] .finding").count() == 2 and page.locator(".run-finding .lacking").count() == 1
    assert "0.18 kWh" in page.locator(f".run-finding[data-run='{pair}'] .footprint").text_content()
    finding.locator("button.finding-zoom").click()
    # the power cap held GPU 0 in minutes 10-20: the step axis (no time on it) gives way to time since start, zoomed there
    page.wait_for_function(f"() => {{ const p = {URL_VIEW_JS}; return p.get('x') === 'relative' && p.get('xr') === '10,20'; }}")
    page.locator("#x-mode input[value=relative]:checked").wait_for(state="attached")
    page.wait_for_function(f"() => {{ const r = ({X_RANGE_JS})(); return r && Math.abs(r[0] - 10) < 0.01 && Math.abs(r[1] - 20) < 0.01; }}")
    screenshot(page, "findings-zoomed")


def test_a_running_runs_findings_follow_its_last_minutes_on_the_live_page(page, findings_store):
    base, uri, _made = findings_store
    now = int(time.time() * 1000)
    start = now - 8 * MINUTE
    client = tracking.connect(uri)
    run_id = radt_run(client, tracking.resolve_experiment(client, uri, "live findings"), "stalling", start_time=start)
    writer = SqlMetricStore(uri)
    try:
        write_series(writer, run_id, MetricName.SM_ACTIVE, 0, start, 8, lambda m: 0.8)
        write_series(writer, run_id, MetricName.SM_ACTIVE, 1, start, 8, lambda m: 0.0)  # GPU 1 idle all along
        page.goto(base + "live")
        findings = page.locator(f".live-run[data-run='{run_id}'] .live-findings")
        chip = findings.locator(".flag-finding[data-code=idle_gpus]")
        chip.wait_for()
        assert chip.text_content() == "idle gpus" and chip.get_attribute("title").startswith("1 of 2 GPUs idle")
        assert findings.locator(".where").text_content() == "last 5 min:"
        screenshot(page, "live-findings")
        # GPU 1's other readings arrive late, busy over the same minutes: no longer idle, but at half GPU 0's mean SMACT
        # (0.4 against 0.8) it is a straggler; the card follows within a rollup bucket
        write_series(writer, run_id, MetricName.SM_ACTIVE, 1, start, 8, lambda m: 0.8)
        findings.locator(".flag-finding[data-code=straggler]").wait_for()
        assert findings.locator(".flag-finding").count() == 1, "idle gpus is gone"
    finally:
        writer.close()
