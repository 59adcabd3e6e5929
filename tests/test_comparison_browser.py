"""The summary table and the comparison figures in real headless Chromium against a real `python app.py` (conftest.py's
filled_store: `radt demo`'s ResNet-50 alone, time-sliced, under MPS and MIG). The bars are checked against the store's
own comparison table; a row click highlights its run in the charts; the table's key columns fit a 1440 px screen."""

from __future__ import annotations

import pytest
from mlflow import MlflowClient

from radt.app.export import comparison_table
from radt.app.exportcli import _open_store
from radt.app.views import View
from tests.support.browser import new_page, screenshot, wait_for_traces
from tests.support.stores import RESNET

FIGURE_JS = """
() => {
  const g = document.querySelector('#compare-figure .js-plotly-plot');
  if (!g || !g.data || !g.data.length || g.data[0].type !== 'bar') { return null; }
  return {x: Array.from(g.data[0].x), y: Array.from(g.data[0].y), title: g.layout.title && g.layout.title.text};
}
"""
OPACITY_JS = """
() => {
  const g = document.querySelector('#charts .js-plotly-plot');
  return g ? g.data.filter(t => t.meta && t.meta.run_id && !t.meta.band).map(t => [t.meta.run_id, t.opacity === undefined ? 1 : t.opacity]) : null;
}
"""


def _runs(uri: str) -> tuple[str, dict[str, str]]:
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(RESNET).experiment_id
    runs = client.search_runs([experiment], filter_string="tags.`radt.role` = 'run'")
    return experiment, {r.info.run_name: r.info.run_id for r in runs}


def _open(page, served, experiment, run_ids):
    page.goto(f"{served}?exp={experiment}&runs={','.join(run_ids)}&metrics=cat:sm_active&x=relative&mode=runs&smooth=0&log=0")
    page.wait_for_function("(n) => document.querySelectorAll('#summary tbody tr td[data-dash-column=run]').length >= n", arg=len(run_ids))


def test_bars_per_workload_and_collocation_are_the_stores(browser, served, filled_store):
    experiment, runs = _runs(filled_store["uri"])
    _open_store(filled_store["uri"])
    table = comparison_table(View([experiment], list(runs.values())))
    table = table[table["kind"] == "run"]
    with new_page(browser, width=1440, height=900) as page:
        _open(page, served, experiment, list(runs.values()))
        page.wait_for_function(FIGURE_JS)
        drawn = page.evaluate(FIGURE_JS)
        expected = table.groupby("workload")["smact_mean"].mean()
        assert drawn["x"] == sorted(expected.index), drawn
        assert drawn["y"] == pytest.approx([expected[w] for w in drawn["x"]], abs=1e-3), "a bar per workload: the mean SMACT of its runs"
        screenshot(page, f"comparison-bars-{filled_store['kind']}")

        page.locator("#compare-by label", has_text="collocation").locator("input").check()
        page.wait_for_function("() => { const f = (" + FIGURE_JS + ")(); return f && f.x.includes('MPS'); }")
        drawn = page.evaluate(FIGURE_JS)
        expected = table.groupby("collocation")["smact_mean"].mean()
        assert drawn["x"] == ["alone", "same GPU", "MPS", "MIG"]
        assert drawn["y"] == pytest.approx([expected[m] for m in drawn["x"]], abs=1e-3)

        page.locator("#compare-kind label", has_text="GRACT vs SMACT").locator("input").check()
        page.wait_for_function(
            "() => { const g = document.querySelector('#compare-figure .js-plotly-plot');"
            " return g && g.data.length >= 3 && g.data.every(t => t.type === 'scatter') && g.data[0].name.startsWith('GRACT'); }"
        )


def test_the_tables_key_columns_come_first_and_a_row_click_highlights_its_run(browser, served, filled_store):
    experiment, runs = _runs(filled_store["uri"])
    with new_page(browser, width=1440, height=900) as page:
        _open(page, served, experiment, list(runs.values()))
        wait_for_traces(page, {f"{name} · GPU 0" for name in runs})
        headers = page.locator("#summary th .column-header-name").all_inner_texts()
        assert headers[:5] == ["run", "steps/h", "normalised", "SMACT", "J/step"], headers
        for name in headers[:5]:
            box = page.locator("#summary th", has_text=name).first.bounding_box()
            assert box and box["x"] + box["width"] <= 1440, f"{name} is on screen at 1440 px"
        durations = [d for d in page.locator("#summary td[data-dash-column=duration]").all_inner_texts() if d.strip()]
        assert len(durations) >= len(runs) and all(d.endswith((" min", " h")) for d in durations), durations

        # a click on a row: its run at full opacity in the charts, every other run dimmed
        chosen = runs["resnet50 3A"]
        page.locator("#summary td[data-dash-column=run]:visible", has_text="resnet50 3A").first.click()
        page.wait_for_function(
            "(id) => { const t = (" + OPACITY_JS + ")(); return t && t.length > 1 && t.every(([r, o]) => (r === id) === (o === 1)); }", arg=chosen
        )
        assert page.evaluate("() => window.radtCharts.current()") == chosen
        screenshot(page, f"summary-highlight-{filled_store['kind']}")

        # sorted on the number behind the text, longest first
        page.locator("#summary th[data-dash-column=duration] .column-header--sort").click()
        page.locator("#summary th[data-dash-column=duration] .column-header--sort").click()
        page.wait_for_function(
            "() => { const r = document.querySelectorAll('#summary td[data-dash-column=run]'); return r.length && r[0].innerText.includes('runs together'); }"
        )
        shown = [_minutes(d) for d in page.locator("#summary td[data-dash-column=duration]").all_inner_texts() if d.strip()]
        assert shown == sorted(shown, reverse=True), shown


def _minutes(text: str) -> float:
    number, unit = text.split()
    return float(number) * (60 if unit == "h" else 1)
