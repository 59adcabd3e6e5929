"""Reading many runs in real headless Chromium against a real `python app.py` (conftest's filled_store and served):
a long run is a mean line in a light min-max envelope, raw again when zoomed in; window.radtCharts.highlight dims
every other run; hovering one chart shows every chart's value at that x; a grid of columns comes from the URL."""

from __future__ import annotations

import pytest
from mlflow import MlflowClient

from tests.support.browser import relayout_chart, screenshot, wait_for_traces
from tests.support.polling import wait_for
from tests.support.stores import RESNET

METRICS = "cat:sm_active,cat:sm_occupancy,cat:power_usage_watts"
GRAPH = "document.querySelector('#charts .js-plotly-plot')"


def _demo_runs(uri: str, count: int = 2) -> tuple[str, list[str], list[str]]:
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(RESNET).experiment_id
    runs = client.search_runs([experiment], filter_string="tags.`radt.role` = 'run'", order_by=["attributes.run_name ASC"])[:count]
    return experiment, [r.info.run_id for r in runs], [f"{r.info.run_name} · GPU 0" for r in runs]


def _open(page, served: str, uri: str, extra: str = "") -> tuple[list[str], list[str]]:
    experiment, run_ids, names = _demo_runs(uri)
    page.goto(f"{served}?exp={experiment}&runs={','.join(run_ids)}&metrics={METRICS}{extra}")
    wait_for_traces(page, set(names))
    page.wait_for_function("() => window.radtCharts && " + GRAPH + "._fullData.length >= 6")
    return run_ids, names


def test_a_long_run_is_a_mean_in_an_envelope_and_raw_when_zoomed(page, served, filled_store):
    run_id = filled_store["long_run"]
    experiment = MlflowClient(filled_store["uri"]).get_run(run_id).info.experiment_id
    page.goto(f"{served}?exp={experiment}&runs={run_id}&metrics=cat:sm_active")
    page.wait_for_function("() => { const g = " + GRAPH + "; return g && g._fullData && g._fullData.some(t => t.fill === 'toself'); }")
    drawn = page.evaluate(
        "() => "
        + GRAPH
        + "._fullData.map(t => ({fill: t.fill, n: t.x.length, max: Math.max(...t.y), run: t.meta && t.meta.run_id, band: !!(t.meta && t.meta.band)}))"
    )
    band = [t for t in drawn if t["band"]]
    lines = [t for t in drawn if not t["band"]]
    assert len(band) == 1 and len(lines) == 1 and band[0]["run"] == lines[0]["run"] == run_id, drawn
    assert lines[0]["n"] <= 2000 // 3 and band[0]["n"] == 2 * lines[0]["n"], "a mean per bucket, the envelope's two edges: within the point budget"
    assert band[0]["max"] == pytest.approx(0.99) and lines[0]["max"] < 0.9, "the one-second peak is in the envelope, not in the mean line"
    screenshot(page, f"charts-envelope-{filled_store['kind']}")

    relayout_chart(page, {"xaxis.range[0]": 60, "xaxis.range[1]": 70})
    page.wait_for_function("() => { const d = " + GRAPH + "._fullData; return d.length === 1 && d[0].fill !== 'toself' && d[0].x.length === 601; }")


def test_highlight_dims_every_other_run_in_every_chart(page, served, filled_store):
    run_ids, _names = _open(page, served, filled_store["uri"])
    page.evaluate("(id) => window.radtCharts.highlight(id)", run_ids[0])
    page.wait_for_function(
        "(id) => { const d = " + GRAPH + "._fullData; return d.every(t => t.meta.run_id === id ? t.opacity === 1 && t.line.width > 1.5 : t.opacity < 0.2); }",
        arg=run_ids[0],
    )
    styles = page.evaluate("() => " + GRAPH + "._fullData.map(t => [t.meta.run_id, t.yaxis, t.opacity])")
    assert {axis for run, axis, _o in styles if run == run_ids[1]} == {"y", "y2", "y3"}, "the other run is dimmed in all three charts"
    screenshot(page, f"charts-highlight-{filled_store['kind']}")

    page.evaluate("() => window.radtCharts.highlight(null)")
    page.wait_for_function("() => " + GRAPH + "._fullData.every(t => t.opacity === 1 && t.line.width === 1.5)")


def test_hovering_a_chart_shows_one_small_box_of_its_runs_values_at_that_x(page, served, filled_store):
    """One box for the chart under the cursor, the runs sorted by value with device, value, unit and x; the crosshair's
    spike lines in the other charts, not a box each (three charts of two runs opened six boxes with every parameter)."""
    _run_ids, names = _open(page, served, filled_store["uri"])
    moves = iter(range(10**6))

    def hovered() -> bool:
        """The mouse over the middle of the first chart (a little further each time: a new hover), and the box shown."""
        box = page.locator("#charts .draglayer .xy .nsewdrag").bounding_box()
        page.mouse.move(box["x"] + box["width"] * (0.4 + 0.01 * (next(moves) % 20)), box["y"] + box["height"] * 0.5)
        return page.evaluate(
            "() => { const t = document.querySelector('.radt-tip'); return !!t && getComputedStyle(t).display !== 'none' && t.querySelectorAll('.tip-row').length >= 2; }"
        )

    wait_for(hovered, timeout=30, what="the tooltip box", interval=0.2)
    tip = page.locator(".radt-tip").inner_text()
    assert page.locator("#charts .hoverlayer .hovertext").count() == 0, "Plotly draws no box of its own"
    assert tip.startswith("SMACT") and "min since start" in tip, tip
    for name in names:
        assert name in tip, (name, tip)
    values = [float(v) for v in page.locator(".radt-tip .tip-value").all_text_contents()]
    assert values == sorted(values, reverse=True), "highest first"
    screenshot(page, f"charts-tooltip-{filled_store['kind']}")


def test_two_columns_from_the_url_survive_a_reload(page, served, filled_store):
    _open(page, served, filled_store["uri"], "&cols=2")
    beside = (
        "() => { const l = " + GRAPH + "._fullLayout; return l.xaxis2 && l.xaxis2.domain[0] > 0.5 && l.xaxis.domain[1] < 0.5"
        " && l.xaxis3.domain[0] === l.xaxis.domain[0] && l.yaxis3.domain[1] < l.yaxis.domain[0]; }"
    )
    page.wait_for_function(beside)
    page.wait_for_function("location.search.includes('cols=2')")
    page.reload()
    page.wait_for_function("() => " + GRAPH + " && " + GRAPH + "._fullLayout && (" + beside + ")()")
    assert "cols=2" in page.url
