"""Figures a researcher can publish as they are, measured in Chromium, not eyeballed: the 10 demo runs and the real
5-GPU run (tests/support/stores.fill_browser_store) on the explore page and in `radt export`'s SVG.

- every run is one legend entry (its GPU and host series used to be one each: 20 entries for 10 runs);
- the tooltip of a 10-run view is one small box (it was ~20 boxes with every parameter, a quarter to half the screen);
- an exported legend never overlaps a chart and is never cut, and the figure stays within a page.
"""

from __future__ import annotations

import pytest

from radt.app.export.exportoptions import ExportStyle
from radt.app.export.image import image_bytes
from radt.app.export.paper import figure_for
from radt.app.exportcli import _open_store
from radt.app.view.views import View, view_runs
from tests.support.browser import new_page, wait_for_chart

DEMO = ("demo: resnet50 collocation", "demo: bert fine-tuning")

pytestmark = pytest.mark.parametrize("filled_store", ["sqlite"], indirect=True)


def _experiments(uri: str) -> dict[str, str]:
    from radt.app.db.runs import list_experiments
    from radt.app.db.state import STATE

    _open_store(uri)
    return {str(e["name"]): str(e["experiment_id"]) for e in list_experiments(STATE.engine)}


def _all_runs(uri: str, names: tuple[str, ...], metrics: list[str]) -> View:
    """Every run of the experiments (a workload's parent run is not a run of its own)."""
    from radt.app.view import data

    experiments = _experiments(uri)
    ids = [experiments[n] for n in names]
    listed = data.runs(ids)
    return View(ids, list(listed["run_id"]), metrics)


SVG_GEOMETRY = """() => {
  const svg = document.querySelector('svg');
  const box = (el) => { const r = el.getBoundingClientRect(); return {l: r.left, t: r.top, r: r.right, b: r.bottom}; };
  const plots = Array.from(document.querySelectorAll('g.overplot > g[clip-path]')).map(g => {
    const id = (g.getAttribute('clip-path') || '').match(/#([^)]+)/);
    const rect = id && document.getElementById(id[1]).querySelector('rect');
    const m = g.getCTM();
    return {l: m.e, t: m.f, r: m.e + Number(rect.getAttribute('width')), b: m.f + Number(rect.getAttribute('height'))};
  });
  const legends = Array.from(document.querySelectorAll('g.legend, g.legend2')).map(g => ({cls: g.getAttribute('class'), box: box(g.querySelector('rect.bg')),
    names: Array.from(g.querySelectorAll('text.legendtext, text.legend2text')).map(t => t.textContent)}));
  return {width: Number(svg.getAttribute('width')), height: Number(svg.getAttribute('height')), plots, legends};
}"""


def _svg_page(svg: str) -> str:
    """An exported SVG alone on a page, at its origin: the body's 8 px margin put every box measured on the page 8 px
    right of and below the figure's own coordinates (where its plots, width and height are measured)."""
    return f'<body style="margin:0">{svg}</body>'


def _overlap(a: dict, b: dict) -> bool:
    return a["l"] < b["r"] and b["l"] < a["r"] and a["t"] < b["b"] and b["t"] < a["b"]


@pytest.mark.parametrize("size,page_in", [("single-column", 9.0), ("double-column", 9.5)])
def test_the_exported_legend_names_each_run_once_and_touches_no_chart(filled_store, browser, size, page_in):
    """11 runs (the demo's 10 and the real 5-GPU run), SMACT and CPU: the legend had 2 entries per run (5 for the 5-GPU
    run), the figure was cut at 9 in with the legend clipped at half of it and one run's entries gone."""
    view = _all_runs(filled_store["uri"], (*DEMO, "imported 5 GPUs"), ["cat:sm_active", "cat:cpu_utilization_percentage"])
    figure, _missing = figure_for(view, ExportStyle(size=size, legend="top"))
    svg = image_bytes(figure, "svg", 96).decode()
    with new_page(browser, width=1200, height=1200) as page:
        page.set_content(_svg_page(svg))
        shown = page.evaluate(SVG_GEOMETRY)
    names = sorted(view_runs(view)["run_name"].astype(str))
    runs_legend = next(lg for lg in shown["legends"] if lg["cls"] == "legend")
    assert sorted(runs_legend["names"]) == names, "every run in the legend exactly once"
    key = next(lg for lg in shown["legends"] if lg["cls"] == "legend2")
    keyed = {label for name in key["names"] for label in name.split(" / ")}
    assert {f"GPU {g}" for g in range(5)} <= keyed, ("the small key: which dash style is which GPU", key["names"])
    assert len(shown["plots"]) == 2
    for legend in (runs_legend, key):
        inside = (
            legend["box"]["l"] >= -0.5
            and legend["box"]["t"] >= -0.5
            and legend["box"]["r"] <= shown["width"] + 0.5
            and legend["box"]["b"] <= shown["height"] + 0.5
        )
        assert inside, ("the legend is inside the figure, not clipped", legend["box"], shown["width"], shown["height"])
        for plot in shown["plots"]:
            assert not _overlap(legend["box"], plot), ("a legend over a chart", legend, plot)
    assert shown["height"] / 96 <= page_in + 0.01, f"within a {size} page"
    assert shown["plots"][0]["b"] - shown["plots"][0]["t"] >= 1.2 * 96 * 0.8, "a chart keeps room to be read"


TABLE_LEGEND = """() => Array.from(document.querySelectorAll('.chart-legend .legend-table tr.legend-entry')).map(r => ({
  id: r.dataset.id, device: r.dataset.device || null, shown: getComputedStyle(r).display !== 'none',
  cells: Array.from(r.querySelectorAll('td.legend-num')).map(c => c.textContent)}))"""
TRACES = """() => document.querySelector('#charts .js-plotly-plot')._fullData.filter(t => t.meta && t.meta.run_id && !t.meta.band)
  .map(t => ({id: t.meta.run_id, device: t.meta.device, axis: t.yaxis || 'y', max: Math.max(...Array.from(t.y).filter(v => v !== null && isFinite(v)))}))"""
TIP = """() => {
  const tips = Array.from(document.querySelectorAll('.radt-tip, #charts .hoverlayer .hovertext')).filter(e => getComputedStyle(e).display !== 'none');
  const area = tips.reduce((sum, e) => { const r = e.getBoundingClientRect(); return sum + Math.max(0, Math.min(r.right, innerWidth) - Math.max(r.left, 0)) * Math.max(0, Math.min(r.bottom, innerHeight) - Math.max(r.top, 0)); }, 0);
  const rows = Array.from(document.querySelectorAll('.radt-tip .tip-row .tip-value')).map(v => Number(v.textContent));
  return {boxes: tips.length, share: area / (innerWidth * innerHeight), rows, plotly: document.querySelectorAll('#charts .hoverlayer .hovertext').length};
}"""


def _draw(page, base: str, view: View) -> None:
    page.goto(base + "?" + "&".join(f"{k}={v}" for k, v in view.to_dict().items()))
    wait_for_chart(page)
    page.locator(".chart-legend .legend-table").wait_for()


TIP_SHOWN = "() => { const t = document.querySelector('.radt-tip'); return t && getComputedStyle(t).display !== 'none'; }"
SCREENS = ((1440, 900), (1920, 1080))


def test_ten_runs_are_ten_legend_rows_and_one_small_sorted_tooltip(filled_store, served, browser):
    """At 1440 × 900, then the same page resized to 1920 × 1080 (the charts redraw at the new width, as a new page would
    draw them): one legend row per run, and one small tooltip of every run at the cursor, sorted."""
    view = _all_runs(filled_store["uri"], DEMO, ["cat:sm_active", "cat:sm_occupancy", "cat:gr_engine_active", "cat:cpu_utilization_percentage"])
    assert len(view.runs) == 10
    with new_page(browser, width=SCREENS[0][0], height=SCREENS[0][1]) as page:
        _draw(page, served, view)
        rows = page.evaluate(TABLE_LEGEND)
        runs = [r for r in rows if r["device"] is None]
        assert sorted(r["id"] for r in runs) == sorted(view.runs), "one legend row per run (there were 20 entries for 10 runs)"
        assert all(len(r["cells"]) == 12 for r in runs), "mean, max and last of each of the 4 charts"
        for width, height in SCREENS:
            if page.viewport_size["width"] != width:
                page.mouse.move(1, 1)  # off the charts: the tooltip goes
                page.wait_for_function(f"() => !({TIP_SHOWN})()")
                narrow = page.locator("#charts .nsewdrag").first.bounding_box()["width"]
                page.set_viewport_size({"width": width, "height": height})
                page.wait_for_function(
                    "([w, before]) => innerWidth === w && document.querySelector('#charts .nsewdrag').getBoundingClientRect().width > before + 1",
                    arg=[width, narrow],
                )
            plot = page.locator("#charts .nsewdrag").first.bounding_box()
            page.mouse.move(plot["x"] + plot["width"] * 0.1, plot["y"] + plot["height"] * 0.5)  # a minute in: every run trains
            page.wait_for_function(TIP_SHOWN)
            tip = page.evaluate(TIP)
            assert tip["plotly"] == 0 and tip["boxes"] == 1, (width, tip)
            assert tip["share"] < 0.25, f"at {width} px the tooltip covers {tip['share']:.0%} of the screen (it covered 15-25 % with ~20 boxes)"
            assert len(tip["rows"]) == 10 and tip["rows"] == sorted(tip["rows"], reverse=True), "every run at the cursor, highest first"
            assert "model=" not in page.locator(".radt-tip").inner_text(), "parameters only on demand"
        page.mouse.click(plot["x"] + plot["width"] * 0.1, plot["y"] + plot["height"] * 0.5)
        page.locator(".radt-details dt", has_text="model").wait_for()  # a click: the nearest run's parameters


def test_the_five_gpu_run_is_one_legend_row_with_each_gpus_figures_on_demand(filled_store, served, browser):
    view = _all_runs(filled_store["uri"], ("imported 5 GPUs",), ["cat:sm_active"])
    with new_page(browser, width=1440, height=900) as page:
        _draw(page, served, view)
        rows = page.evaluate(TABLE_LEGEND)
        assert [r["device"] for r in rows] == [None, "GPU 0", "GPU 1", "GPU 2", "GPU 3", "GPU 4"]
        assert not any(r["shown"] for r in rows[1:]), "a GPU's own row only on demand"
        page.locator(".legend-devices-toggle").click()
        page.wait_for_function("() => Array.from(document.querySelectorAll('tr.legend-device')).every(r => getComputedStyle(r).display !== 'none')")
        peaks = {t["device"]: t["max"] for t in page.evaluate(TRACES)}
        for row in page.evaluate(TABLE_LEGEND)[1:]:
            assert row["cells"][1] == f"{peaks[row['device']]:.3f}", ("each GPU's max, even one lying on the axis", row, peaks)
        low = page.evaluate("() => document.querySelector('#charts .js-plotly-plot')._fullLayout.yaxis.range[0]")
        assert low < 0, "an idle GPU's line is drawn above the axis line"


# an exported figure's text boxes by part, and its plot areas (as SVG_GEOMETRY), in the SVG's pixels
SVG_TEXTS = (
    """() => {
  const box = (el) => { const r = el.getBoundingClientRect(); return {l: r.left, t: r.top, r: r.right, b: r.bottom}; };
  const all = (selector) => Array.from(document.querySelectorAll(selector)).filter(e => e.textContent.trim()).map(box);
  return {yticks: all('.ytick text'), y2ticks: all('.y2tick text'), xticks: all('.xtick text'), y2title: all('.g-y2title text'),
          panels: all('.annotation-text-g text, .annotation text'), plots: ("""
    + SVG_GEOMETRY
    + """)().plots};
}"""
)


@pytest.mark.parametrize("size", ["single-column", "double-column"])
def test_the_exported_collocation_panels_keep_their_labels_apart(filled_store, browser, size):
    """The radT papers' figure at a paper's single column: the right panel's y-axis title "SMACT (0–1)" lay over its own
    "0.5" and against the left panel's plot, and the left panel's title ran over into the right panel's. Now the panels
    keep room between them for the right one's ticks and title, and a panel title wraps within its panel."""
    from radt.app.export.paper import comparison_figure

    view = _all_runs(filled_store["uri"], (DEMO[0],), ["cat:sm_active"])
    figure = comparison_figure(view, ExportStyle(size=size), "collocation")
    with new_page(browser, width=1400, height=1000) as page:
        page.set_content(_svg_page(image_bytes(figure, "svg", 96).decode()))
        shown = page.evaluate(SVG_TEXTS)
    left, right = sorted(shown["plots"], key=lambda p: p["l"])
    assert shown["y2title"] and shown["y2ticks"] and len(shown["panels"]) >= 2, shown
    for label in shown["y2title"] + shown["y2ticks"]:
        assert label["l"] >= left["r"] + 2 and not any(_overlap(label, x) for x in shown["xticks"]), (
            "the right panel's labels clear of the left panel",
            label,
            left,
        )
    for tick in shown["y2ticks"]:
        assert not _overlap(shown["y2title"][0], tick), ("the right axis title over its own tick label", shown["y2title"][0], tick)
    first, second = sorted(shown["panels"], key=lambda p: p["l"])[:2]
    assert first["r"] <= right["l"] and second["l"] >= left["r"], ("each panel's title over its own panel", first, second, left, right)


LEGEND_TEXTS = """() => Array.from(document.querySelectorAll('g.legend text.legendtext')).map(t => {
  const r = t.getBoundingClientRect(); return {text: t.textContent, r: r.right, l: r.left}; })"""


@pytest.mark.parametrize("legend", ["top", "right"])
def test_an_exported_cdf_of_four_experiments_shows_each_entry_whole_and_keeps_its_plot(filled_store, browser, legend):
    """The CDF by workload of the demo, the long run and the 5-GPU import at a single column: the legend was reserved one
    row per experiment (4) but drew a title and a row per workload (13), so the plot was squeezed to about an inch, and
    its entries' width was the experiments' names, so "workload 3 bert-large batch 64 (1)" was cut at "(". Now the
    legend is reserved as Plotly lays it out: each entry whole, the plot its row's height."""
    from radt.app.export.paper import comparison_figure

    view = _all_runs(filled_store["uri"], (*DEMO, "long runs", "imported 5 GPUs"), ["cat:sm_active"])
    figure = comparison_figure(view, ExportStyle(size="single-column", legend=legend), "cdf")
    with new_page(browser, width=1400, height=1400) as page:
        page.set_content(_svg_page(image_bytes(figure, "svg", 96).decode()))
        shown = page.evaluate(SVG_GEOMETRY)
        texts = page.evaluate(LEGEND_TEXTS)
    (runs_legend,) = [lg for lg in shown["legends"] if lg["cls"] == "legend"]
    whole = ["".join(name.split()) for name in runs_legend["names"]]  # a wrapped entry's lines are its text's tspans
    assert len(texts) == 13 and "workload3bert-largebatch64(1)" in whole, texts  # 9 entries, 4 titles
    for text in texts:
        assert text["r"] <= runs_legend["box"]["r"] + 0.5 and text["r"] <= shown["width"] + 0.5, ("an entry cut by its legend's edge", text, runs_legend["box"])
    (plot,) = shown["plots"]
    assert not _overlap(runs_legend["box"], plot), ("the legend over the plot", runs_legend["box"], plot)
    assert runs_legend["box"]["b"] <= shown["height"] + 0.5, ("the legend inside the figure", runs_legend["box"], shown["height"])
    assert plot["b"] - plot["t"] >= 1.5 * 96, ("the plot keeps room to be read", plot)


TICKS = """() => Array.from(document.querySelectorAll('.xtick text, .x2tick text')).filter(t => t.textContent.trim()).map(t => {
  const r = t.getBoundingClientRect(); return {text: t.textContent, l: r.left, t: r.top, r: r.right, b: r.bottom}; })"""


@pytest.mark.parametrize("kind", ["bar", "box"])
def test_an_exported_figure_by_workload_keeps_its_category_labels_apart(filled_store, browser, kind):
    """Eight workloads at a single column: their names, tilted 30°, lay over each other ("workload 2 same GPU" over
    "workload 3 MPS") and the last one pushed the plot into the left half of the figure. Now a name wraps at words
    where that fits its category, else it stands upright; none touches another, every one inside the figure."""
    from radt.app.export.paper import comparison_figure

    view = _all_runs(filled_store["uri"], (*DEMO, "long runs", "imported 5 GPUs"), ["cat:sm_active"])
    figure = comparison_figure(view, ExportStyle(size="single-column"), kind)
    with new_page(browser, width=1400, height=1400) as page:
        page.set_content(_svg_page(image_bytes(figure, "svg", 96).decode()))
        shown = page.evaluate(SVG_GEOMETRY)
        ticks = page.evaluate(TICKS)
    assert len(ticks) == 8, ticks
    for i, a in enumerate(ticks):
        assert a["l"] >= -0.5 and a["r"] <= shown["width"] + 0.5 and a["b"] <= shown["height"] + 0.5, ("a label outside the figure", a)
        for b in ticks[i + 1 :]:
            assert not _overlap(a, b), ("two labels over each other", a, b)
    (plot,) = shown["plots"]
    assert plot["r"] - plot["l"] >= 0.75 * (shown["width"] - 80), ("the plot keeps the figure's width", plot, shown["width"])
    assert plot["b"] - plot["t"] >= 1.5 * 96, ("the plot keeps room to be read", plot)


LEGEND_ITEMS = """() => Array.from(document.querySelectorAll('g.legend g.traces')).map(t => {
  const r = t.getBoundingClientRect(); return {l: r.left, t: r.top, r: r.right, b: r.bottom}; })"""


def test_an_exported_legend_of_wrapped_commands_lays_them_side_by_side(filled_store, browser):
    """The collocation figure of four experiments at double column: its six commands are wrapped to 30 characters a
    line, but their width was counted as one line (up to 90 characters), so the legend took one column, six entries
    tall, a third of the figure. Now the widest line counts: side by side, each inside the figure, none over a chart."""
    from radt.app.export.paper import comparison_figure

    view = _all_runs(filled_store["uri"], (*DEMO, "long runs", "imported 5 GPUs"), ["cat:sm_active"])
    figure = comparison_figure(view, ExportStyle(size="double-column", legend="top"), "collocation")
    with new_page(browser, width=1400, height=1400) as page:
        page.set_content(_svg_page(image_bytes(figure, "svg", 96).decode()))
        shown = page.evaluate(SVG_GEOMETRY)
        items = page.evaluate(LEGEND_ITEMS)
        texts = page.evaluate(LEGEND_TEXTS)
    assert len(items) == 6 and len({round(i["l"]) for i in items}) >= 2, ("the entries side by side", items)
    assert not any("<" in t["text"] for t in texts), ("an experiment's name in italics, not its markup as text", texts)
    top = min(p["t"] for p in shown["plots"])
    assert top - max(i["b"] for i in items) <= 60, ("the room reserved for the legend is the room it takes", items, top)
    for item in items:
        assert item["r"] <= shown["width"] + 0.5 and item["b"] <= shown["plots"][0]["t"], ("an entry outside the figure or over a chart", item, shown["plots"])
    for a_index, a in enumerate(items):
        for b in items[a_index + 1 :]:
            assert not _overlap(a, b), ("two entries over each other", a, b)


TITLES = """() => Array.from(document.querySelectorAll('g.annotation text, .gtitle')).map(t => {
  const r = t.getBoundingClientRect(); return {text: t.textContent, t: r.top, b: r.bottom}; })"""


@pytest.mark.parametrize("kind,legend", [("bar", "none"), ("bar", "top"), ("cdf", "top"), ("timeseries", "top"), ("timeseries", "none")])
def test_an_exported_figure_keeps_a_band_for_chart_titles_only_where_it_has_them(filled_store, browser, kind, legend):
    """A comparison figure has no chart titles (the paper's caption names it), yet its export kept the explore grid's band
    for them: 0.33 in of nothing above the plot of a 3.5 in figure. A figure of charts keeps the band, its titles inside."""
    from radt.app.export.paper import comparison_figure

    view = _all_runs(filled_store["uri"], DEMO, ["cat:sm_active", "cat:sm_occupancy"])
    style = ExportStyle(size="double-column", legend=legend)
    figure = figure_for(view, style)[0] if kind == "timeseries" else comparison_figure(view, style, kind)
    with new_page(browser, width=1400, height=1400) as page:
        page.set_content(_svg_page(image_bytes(figure, "svg", 96).decode()))
        shown = page.evaluate(SVG_GEOMETRY)
        titles = page.evaluate(TITLES)
    above = max([lg["box"]["b"] for lg in shown["legends"] if lg["cls"] == "legend"] or [0.0])  # the legend's foot, or the page's top
    top = min(plot["t"] for plot in shown["plots"])
    if kind == "timeseries":
        first = min((t for t in titles if t["text"] in ("SMACT", "SMOCC")), key=lambda t: t["t"])  # the top chart's title
        assert above - 0.5 <= first["t"] and first["t"] < top, ("the top chart's title between the legend and its chart", first, above, top)
        assert first["t"] - above <= 2.0 * style.font_size, ("an empty band above the chart titles", first, above)
    else:
        assert top - above <= 1.6 * style.font_size, ("an empty band above the plot", above, top)
