"""The explore page's defaults at the issue's screens (1440 × 900, 1920 × 1080) in real headless Chromium against a
real `python app.py` on the real PostgreSQL, with 12 runs of two experiments ticked (issue 23, "page defaults that
fit a screen"): the summary table's default columns fit without sideways scrolling, never lie under the sticky
bar (issue 52: it stays over the charts only) nor paint over it, cut a long run name with an ellipsis and show it whole
on hover, write a ratio with three decimals; the run tree heads each experiment with its name; two charts per row on a
wide window, one on a narrower one; the metric picker never calls a host metric "every GPU". Unit tests: durations as
the tree and the table write them, the metric picker's labels.

The store is written here as radt writes it (tracking.create_run, the SQL metric writer); one store and one
dashboard for the module.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import dash
import pytest
from mlflow import MlflowClient

from radt.collectors.store import tracking
from radt.collectors.store.stores import SqlMetricStore
from radt.pages.parts.summary_table import COLUMN_PICKER
from radt.points import Point
from tests.support.browser import dashboard, new_page, screenshot
from tests.support.postgres import pg_url
from tests.support.radtproc import radt_env
from tests.support.runs import radt_run

BASE = 1_760_000_000_000
SECONDS = 60  # samples per run, one a second
EXPERIMENTS = ("layout: bert", "layout: resnet50")
LONG_NAME = "resnet50 batch 256 · lr 0.1 · cosine schedule · a name far too long for its column in the summary table"
SHORT_RUN = "bert quick check"  # its script ran 45 s
RATIO_RUN = "bert 1A"  # SMACT 0.31 at every sample: its mean is 0.31 whatever GPUs count, and reads 0.310
SMACT, SMOCC, POWER, MEMORY, CPU = (
    "system/gpu_0_sm_active",
    "system/gpu_0_sm_occupancy",
    "system/gpu_0_power_usage_watts",
    "system/gpu_0_memory_usage_megabytes",
    "system/cpu_utilization_percentage",
)
ARGS = ("--model", "resnet50", "--batch-size", "256", "--lr", "0.1")  # a command longer than its column: cut like a name
LONG_ARGS = (*ARGS[:-1], "0.2")  # the long-named run's: the summary names each command by its --lr, whole in the tooltip
SCREENS = [(1440, 900), (1920, 1080)]


@dataclass
class Store:
    uri: str
    base: str  # the dashboard's URL
    experiments: list[str]
    runs: dict[str, str]  # name -> run id

    def link(self, extra: str = "") -> str:
        """The explore page with every run of both experiments ticked."""
        return f"{self.base}?exp={','.join(self.experiments)}&runs={','.join(self.runs.values())}{extra}"


def _runs() -> list[tuple[str, str, str, float, int]]:
    """(experiment, workload, name, SMACT, script seconds): 12 runs, six per experiment, two workloads each."""
    out = []
    for e, model in enumerate(("bert", "resnet50")):
        for w in (1, 2):
            for letter in "ABC":
                name = f"{model} {w}{letter}"
                out.append((EXPERIMENTS[e], f"{model} workload {w}", name, 0.2 + 0.05 * len(out), 600 + 300 * len(out)))
    out[0] = (*out[0][:3], 0.31, out[0][4])
    out[1] = (out[1][0], out[1][1], SHORT_RUN, out[1][3], 45)
    out[-1] = (out[-1][0], out[-1][1], LONG_NAME, out[-1][3], 3 * 3600)
    return out


def _fill(uri: str) -> tuple[list[str], dict[str, str]]:
    client = MlflowClient(uri)
    experiments = {name: tracking.resolve_experiment(client, uri, name) for name in EXPERIMENTS}
    writer = SqlMetricStore(uri)
    runs = {}
    for i, (experiment, workload, name, smact, seconds) in enumerate(_runs()):
        start = BASE + i * 10_000_000
        letter = name[-1] if name[-1] in "ABC" else "A"
        args = LONG_ARGS if name == LONG_NAME else ARGS
        run_id = radt_run(client, experiments[experiment], name, start_time=start, workload=workload, letter=letter, script_args=args)
        points = []
        for s in range(SECONDS):
            ts = start + s * 1000
            points += [Point(SMACT, smact, ts, s), Point(SMOCC, smact / 2, ts, s), Point(POWER, 150.0 + i, ts, s), Point(MEMORY, 1234.5 * (i + 1), ts, s)]
            points += [Point(CPU, 25.0, ts, s), Point("loss", 1 / (s + 1), ts, s)]
        writer.write(run_id, points)
        client.set_terminated(run_id, "FINISHED", end_time=start + seconds * 1000)
        runs[name] = run_id
    writer.close()
    return [experiments[name] for name in EXPERIMENTS], runs


@pytest.fixture(scope="module")
def store(pg_pool, tmp_path_factory):
    """12 ended runs in two experiments on one PostgreSQL store, and one `python app.py` on it, for this module."""
    home = tmp_path_factory.mktemp("layout-home")
    database = pg_pool.take()
    uri = pg_url(database)
    try:
        experiments, runs = _fill(uri)
        with dashboard(uri, radt_env(home, uri)) as base:
            yield Store(uri, base, experiments, runs)
    finally:
        pg_pool.give_back(database)


# --- what the browser shows --------------------------------------------------------------------------

# every element of the table that scrolls sideways: [scrollWidth, clientWidth]
SCROLLERS_JS = """() => Array.from(document.querySelectorAll('#summary, #summary *'))
  .filter(e => ['auto', 'scroll'].includes(getComputedStyle(e).overflowX))
  .map(e => [e.scrollWidth, e.clientWidth])"""
CELL_JS = """([column, text]) => {
  const td = Array.from(document.querySelectorAll(`#summary td[data-dash-column="${column}"]`)).find(td => td.innerText.trim() === text);
  return td ? {scroll: td.scrollWidth, client: td.clientWidth, overflow: getComputedStyle(td).textOverflow} : null;
}"""
ROW_CELL_JS = """([run, column]) => {
  const row = Array.from(document.querySelectorAll('#summary tbody tr')).find(r => { const c = r.querySelector('td[data-dash-column="run"]'); return c && c.innerText.trim() === run; });
  const td = row && row.querySelector(`td[data-dash-column="${column}"]`);
  return td ? td.innerText.trim() : null;
}"""
RECT_JS = (
    "(selector) => { const r = document.querySelector(selector).getBoundingClientRect(); return {left: r.left, right: r.right, top: r.top, bottom: r.bottom}; }"
)
# over the sticky bar, what the browser paints on top at each point: the bar (or a descendant), else what covers it
OVER_BAR_JS = """() => {
  const bar = document.querySelector('.page-bar').getBoundingClientRect();
  const covering = [];
  for (let x = bar.left + 4; x < bar.right - 4; x += 16) {
    for (const y of [bar.top + 3, (bar.top + bar.bottom) / 2, bar.bottom - 3]) {
      const e = document.elementFromPoint(x, y);
      if (!e || !e.closest('.page-bar')) { covering.push([Math.round(x), Math.round(y), e ? e.tagName + '.' + e.className : null]); }
    }
  }
  return covering;
}"""

# over the summary table's header and first rows, what the browser paints: the table (or a descendant), else what covers it
OVER_TABLE_JS = """() => {
  const table = document.querySelector('#summary'), box = table.getBoundingClientRect();
  const covering = [];
  for (let x = box.left + 4; x < box.right - 4; x += 16) {
    for (let y = Math.max(box.top, 0) + 3; y < Math.min(box.bottom, 120); y += 12) {
      const e = document.elementFromPoint(x, y);
      if (!e || !table.contains(e)) { covering.push([Math.round(x), Math.round(y), e ? e.tagName + '.' + e.className : null]); }
    }
  }
  return covering;
}"""


CHARTS = "&metrics=cat:sm_active,cat:cpu_utilization_percentage"  # two charts: side by side or one above the other


def _drawn(page) -> None:
    """Until the charts (two) and the summary table (12 rows, its own request after the charts) are on the page."""
    page.wait_for_function("() => { const l = document.querySelector('#charts .js-plotly-plot')?._fullLayout; return l && l.xaxis2; }")
    page.wait_for_function(
        "() => new Set(Array.from(document.querySelectorAll('#summary td[data-dash-column=\"run\"]')).map(c => c.innerText.trim()).filter(Boolean)).size === 12"
    )


@pytest.fixture(scope="module", params=SCREENS, ids=[f"{w}x{h}" for w, h in SCREENS])
def shown(request, browser, store):
    """The explore page at one of the issue's screens with the 12 runs ticked, drawn: opened once for the tests that only
    look at it (a test that scrolls it puts the scroll back)."""
    width, height = request.param
    with new_page(browser, width=width, height=height) as page:
        page.goto(store.link(CHARTS))
        _drawn(page)
        yield page


def _shown_headers(page) -> list[str]:
    return [h.replace("\n", " ").strip() for h in page.locator("#summary th").all_inner_texts()]


def _x_domains(page) -> list[list[float]]:
    return page.evaluate("() => { const l = document.querySelector('#charts .js-plotly-plot')._fullLayout; return [l.xaxis.domain, l.xaxis2.domain]; }")


def test_the_summary_table_fits_the_screen_cuts_long_names_and_writes_ratios_with_three_decimals(shown):
    from radt.pages.parts.summary_table import COLUMNS

    page, width = shown, shown.viewport_size["width"]
    assert _shown_headers(page) == [c.header for c in COLUMNS if c.shown], "the default columns"
    scrollers = page.evaluate(SCROLLERS_JS)
    assert scrollers and all(scroll <= client for scroll, client in scrollers), f"the table scrolls sideways at {width} px: {scrollers}"

    cut = page.evaluate(CELL_JS, ["run", LONG_NAME])
    assert cut and cut["scroll"] > cut["client"] and cut["overflow"] == "ellipsis", f"the long name is cut with an ellipsis: {cut}"
    page.locator("#summary td[data-dash-column='run']", has_text=LONG_NAME[:20]).hover()
    page.locator(".dash-table-tooltip", has_text=LONG_NAME).wait_for()  # whole on hover

    # a command is what tells it apart from the others shown (was the script's path, cut: the same in every row), whole on hover
    assert (page.evaluate(ROW_CELL_JS, [LONG_NAME, "command"]), page.evaluate(ROW_CELL_JS, [RATIO_RUN, "command"])) == ("--lr 0.2", "--lr 0.1")
    page.locator("#summary tbody tr", has_text=RATIO_RUN).locator("td[data-dash-column='command']").hover()
    page.locator(".dash-table-tooltip", has_text=" ".join(ARGS)).wait_for()

    assert page.evaluate(ROW_CELL_JS, [RATIO_RUN, "smact_mean"]) == "0.310", "a ratio always has three decimals"
    assert page.evaluate(ROW_CELL_JS, [SHORT_RUN, "duration"]) == "45 s"
    screenshot(page, f"layout-table-{width}")


def test_the_sticky_bar_stays_over_the_charts_only_and_nothing_paints_over_it(shown):
    """The bar stayed over the whole page: the table's fixed column painted over it (issue 23), and scrolled to "Summary"
    it hid the heading, the header row and the first rows (issue 52). It stays over the charts, on top of them, and
    leaves with them."""
    page = shown
    charts = page.evaluate(RECT_JS, "#charts")
    page.evaluate("(dy) => window.scrollBy(0, dy)", charts["top"] + 40)  # the charts' first row slides under the bar
    try:
        page.wait_for_function(
            "() => { const e = document.querySelector('.page-bar'), b = e.getBoundingClientRect(); return Math.abs(b.top) <= 1 && b.bottom > 20"
            " && getComputedStyle(e).visibility === 'visible'; }"
        )
        assert page.evaluate(OVER_BAR_JS) == [], "every point over the bar shows the bar"
        screenshot(page, f"layout-charts-under-bar-{page.viewport_size['width']}")
        page.evaluate("() => document.querySelector('#summary').scrollIntoView()")  # as high as the page's end lets it
        bar, table = page.evaluate(RECT_JS, ".page-bar"), page.evaluate(RECT_JS, "#summary")
        assert bar["bottom"] <= table["top"] + 0.5, f"the bar left with the charts: {bar}, the table {table}"
        assert page.evaluate(OVER_TABLE_JS) == [], "every point of the table's first rows shows the table"
    finally:
        page.evaluate("() => window.scrollTo(0, 0)")


def test_the_run_tree_heads_each_experiment_and_writes_short_runs_in_seconds(shown, store):
    page = shown
    assert page.locator("#run-tree .experiment-heading").all_inner_texts() == list(EXPERIMENTS)
    order = page.evaluate(
        "() => Array.from(document.querySelectorAll('#run-tree > *')).map(e => [e.classList.contains('experiment-heading'), e.dataset.experiment])"
    )
    first, second = store.experiments
    assert order == [[True, first], [False, first], [False, first], [True, second], [False, second], [False, second]], "each heading above its workloads"
    assert page.locator(".wl-runs label", has_text=SHORT_RUN).inner_text().endswith("· 45 s")
    assert page.locator(".wl-runs label", has_text=LONG_NAME[:20]).inner_text().endswith("· 3.0 h")


def test_two_charts_per_row_on_a_wide_window_and_units_in_the_metric_picker(shown):
    page = shown
    first, second = _x_domains(page)
    assert second[0] > first[1], f"the second chart right of the first: {first} {second}"
    assert page.locator("#chart-columns input[value='2']").is_checked() and "cols=2" in page.url
    chips = page.locator("#metrics .dash-dropdown-value-item").all_inner_texts()
    assert chips == ["SMACT · 0–1 · every GPU", "CPU · % of all cores"], "CPU is the host's, in % of all cores, not 'every GPU'"


def test_one_chart_per_row_on_a_narrower_window(browser, store):
    with new_page(browser, width=1200, height=900) as page:
        page.goto(store.link(CHARTS))
        page.wait_for_function("() => { const l = document.querySelector('#charts .js-plotly-plot')?._fullLayout; return l && l.xaxis2; }")
        first, second = _x_domains(page)
        assert first == second, f"one chart above the other: {first} {second}"
        assert page.locator("#chart-columns input[value='1']").is_checked()


def test_the_columns_control_shows_a_hidden_column_and_keeps_it_for_the_session(browser, store):
    with new_page(browser, width=1440, height=900) as page:
        page.goto(store.link(CHARTS))
        _drawn(page)
        assert "SMOCC p95" not in _shown_headers(page)
        page.locator(".table-columns summary").click()
        page.locator(f"#{COLUMN_PICKER} label", has_text="SMOCC p95").locator("input").check()
        page.wait_for_function("() => Array.from(document.querySelectorAll('#summary th')).some(h => h.innerText.trim() === 'SMOCC p95')")
        assert page.evaluate(ROW_CELL_JS, [RATIO_RUN, "smocc_p95"]) == "0.155"
        page.reload()
        _drawn(page)
        assert "SMOCC p95" in _shown_headers(page), "kept for the tab's session"


# --- units and durations as written -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(1.5, "1.5 s"), (45, "45 s"), (59.4, "59 s"), (60, "1 min"), (12 * 60, "12 min"), (119 * 60, "119 min"), (2.5 * 3600, "2.5 h"), (None, "–")],
)
def test_durations_are_written_in_seconds_minutes_or_hours(seconds, text):
    from radt.pages.parts.summary_table import duration_text

    assert duration_text(seconds) == text


def test_the_metric_picker_names_units_and_calls_only_gpu_metrics_every_gpu(empty_sqlite, tmp_path):
    from radt.app.web.dashboard import create_app

    uri = empty_sqlite(tmp_path / "store.db")
    client = MlflowClient(uri)
    run_id = radt_run(client, tracking.resolve_experiment(client, uri, "units"), "run", start_time=BASE)
    keys = [SMACT, CPU, "system/process_cpu_utilization_percentage", "system/disk_read_bytes_per_second", "system/gpu_1_sm_active"]
    SqlMetricStore(uri).write(run_id, [Point(key, 1.0, BASE, 0) for key in keys])
    create_app(uri, "simple")
    explore = next(sys.modules[page["module"]] for page in dash.page_registry.values() if page["path"] == "/")

    labels = {o["value"]: o["label"] for o in explore.metric_options([run_id])}
    assert labels["cat:sm_active"] == "SMACT · 0–1 · every GPU"
    assert labels["cat:cpu_utilization_percentage"] == "CPU · % of all cores"
    assert labels["cat:process_cpu_utilization_percentage"] == "Run CPU · % of one core"
    assert labels["cat:disk_read_bytes_per_second"] == "Disk read · B/s"
    host = [label for spec, label in labels.items() if spec.startswith("cat:") and not explore.METRICS[spec[4:]].per_gpu]
    assert host and not any("GPU" in label for label in host), host
