"""The "GPU share" chart in Chromium (issue #55): two runs that shared node-a's GPU 0, drawn with their own SM share,
stack in Explore as two runs' areas and the GPU's idle remainder in one chart, each run in its legend colour."""

from __future__ import annotations

from urllib.parse import urlencode

import pytest

from radt.catalogue import MetricName
from tests.support import state
from tests.support.browser import dashboard, screenshot
from tests.support.radtproc import radt_env
from tests.support.shared_gpu import shared_store

pytestmark = pytest.mark.browser

START = 1_760_000_000_000
# the stacked traces of the GPU share chart: [run id or "idle", fill colour, that run's line colour in its other chart]
STACK_JS = """() => {
  const g = document.querySelector('#charts .js-plotly-plot');
  if (!g || !Array.isArray(g.data)) { return null; }
  const line = id => (g.data.find(t => !t.stackgroup && t.meta && t.meta.run_id === id) || {line: {}}).line.color || null;
  const stack = g.data.filter(t => t.stackgroup && t.meta && (t.meta.share || t.meta.idle));
  return stack.length ? stack.map(t => [t.meta.idle ? 'idle' : t.meta.run_id, t.fillcolor, t.meta.idle ? null : line(t.meta.run_id)]) : null;
}"""


@pytest.fixture(scope="module")
def share_dashboard(tmp_path_factory, sqlite_template):
    home = tmp_path_factory.mktemp("gpu-share")
    with state.sqlite_home(home, sqlite_template) as uri:
        made = shared_store(uri, START)
    with dashboard(uri, radt_env(home)) as base:
        yield base, made


def test_two_runs_that_shared_a_gpu_are_stacked_with_the_idle_remainder(page, share_dashboard):
    base, made = share_dashboard
    runs = f"{made['left']},{made['right']}"
    page.goto(base + "?" + urlencode({"exp": made["experiment"], "runs": runs, "metrics": f"cat:{MetricName.RUN_SM_UTILIZATION_PERCENTAGE}"}))
    page.wait_for_function(f"() => ({STACK_JS})() !== null")
    stack = page.evaluate(STACK_JS)
    assert [owner for owner, _fill, _line in stack] == [made["left"], made["right"], "idle"], "two runs' shares, then the idle remainder"
    assert all(fill == line for _owner, fill, line in stack[:2]) and stack[0][1] != stack[1][1], "each run in its own Explore colour"
    page.locator("#charts .annotation-text", has_text="GPU share · node-a · GPU 0").wait_for()
    for name in ("left", "right"):
        page.locator(f"#chart-legend .legend-entry[data-id='{made[name]}']").first.wait_for()
    screenshot(page, "gpu-share")
