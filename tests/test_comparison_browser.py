"""The summary table and the comparison figures in real headless Chromium against a real `python app.py` (conftest.py's
filled_store: `radt demo`'s ResNet-50 alone, time-sliced, under MPS and MIG, and its BERT runs). The bars are checked
against the store's own comparison table; a row click highlights its run in the charts; the table's key columns fit a
1440 px screen; every comparison figure lays out its title, legend and axis titles apart from each other and from its
plots at 1440 and 1920 px, and a run's point has the colour of its line on the charts."""

from __future__ import annotations

import pytest
from mlflow import MlflowClient

from radt.app.export.paper import comparison_table
from radt.app.exportcli import _open_store
from radt.app.view.views import View
from radt.collectors import demo
from radt.pages.parts.summary_table import present
from tests.support.browser import new_page, screenshot, wait_for_traces
from tests.support.stores import RESNET

BERT = "demo: bert fine-tuning"
SLICES = {f"resnet50 {w.name.split()[0]}{r.letter}": r.mig for w in demo.EXPERIMENTS[0].workloads for r in w.runs}  # a MIG run's GPU instance
# the boxes of the comparison figure's parts, in page pixels: its title, legend, axis and panel titles, plot areas
LAYOUT_JS = """
() => {
  const g = document.querySelector('#compare-figure .js-plotly-plot');
  if (!g || !g._fullLayout) { return null; }
  const boxes = (selector) => Array.from(g.querySelectorAll(selector)).map(e => e.getBoundingClientRect())
    .filter(r => r.width > 0 && r.height > 0).map(r => ({x: r.x, y: r.y, w: r.width, h: r.height}));
  return {
    title: boxes('.gtitle'), legend: boxes('.legend > .bg'), panels: boxes('.annotation'),
    axes: boxes('.xtitle, .ytitle, .x2title, .y2title'), plots: boxes('.draglayer .nsewdrag'),
    kind: g.data.map(t => t.type).join(','), axesCount: Object.keys(g._fullLayout._plots).length,
  };
}
"""
# a run's colour: its points on the box plot (its own, or its box's where the figure has a legend), its lines on the
# explore charts (by the run id in each trace's meta), the box plot's legend
COLOURS_JS = """
() => {
  const box = document.querySelector('#compare-figure .js-plotly-plot');
  const charts = document.querySelector('#charts .js-plotly-plot');
  const points = box && box._fullData.find(t => t.meta && t.meta.points === 'runs');
  if (!points || !charts || !charts._fullData) { return null; }
  const lines = {};
  charts._fullData.filter(t => t.meta && t.meta.run_id && t.line).forEach(t => { (lines[t.meta.run_id] = lines[t.meta.run_id] || []).push(t.line.color); });
  const legend = box._fullData.filter(t => t.type === 'box' && t.showlegend !== false).map(t => t.line.color);
  return {points: points.customdata.map((c, i) => [c[0], points.marker.color[i]]), lines, by: points.meta.colour, legend};
}
"""

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


MESSAGE_JS = """
() => {
  const g = document.querySelector('#compare-figure .js-plotly-plot');
  const note = g && g.querySelector('.annotation');
  if (!note || !note.textContent.includes('ran together')) { return null; }
  const box = (e) => { const r = e.getBoundingClientRect(); return {left: r.left, right: r.right, top: r.top, bottom: r.bottom}; };
  return {figure: box(g), note: box(note), lines: note.querySelectorAll('tspan.line').length};
}
"""


def test_a_figure_that_cannot_be_drawn_says_why_inside_its_box(browser, served, filled_store):
    """The BERT runs all ran alone, so the collocation figure cannot be drawn and says why. Its 170 characters stood on
    one line of the 1,064 px figure at 1440 px: both ends cut, "none of" and "of their command" gone. Now wrapped."""
    client = MlflowClient(filled_store["uri"])
    experiment = client.get_experiment_by_name(BERT).experiment_id
    runs = [r.info.run_id for r in client.search_runs([experiment], filter_string="tags.`radt.role` = 'run'")]
    with new_page(browser, width=1440, height=900) as page:
        _open(page, served, experiment, runs)
        page.locator("#compare-kind label", has_text="collocation").locator("input").check()
        page.wait_for_function(MESSAGE_JS)
        drawn = page.evaluate(MESSAGE_JS)
    figure, note = drawn["figure"], drawn["note"]
    assert figure["left"] <= note["left"] and note["right"] <= figure["right"], drawn
    assert figure["top"] <= note["top"] and note["bottom"] <= figure["bottom"] and drawn["lines"] >= 2, drawn


def test_the_tables_key_columns_come_first_and_a_row_click_highlights_its_run(browser, served, filled_store):
    experiment, runs = _runs(filled_store["uri"])
    with new_page(browser, width=1440, height=900) as page:
        _open(page, served, experiment, list(runs.values()))
        wait_for_traces(page, {f"{name} · GPU 0" + (f" · MIG {SLICES[name]}" if SLICES.get(name) else "") for name in runs})
        headers = page.locator("#summary th .column-header-name").all_inner_texts()
        assert headers[:5] == [c.header for c in present() if c.shown][:5] and headers[0] == "run", headers  # the page's default set, in its order
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
            "() => { const r = document.querySelectorAll('#summary td[data-dash-column=run]'); return r.length && r[0].innerText.includes(' together'); }"
        )
        shown = [_minutes(d) for d in page.locator("#summary td[data-dash-column=duration]").all_inner_texts() if d.strip()]
        assert shown == sorted(shown, reverse=True), shown


def _minutes(text: str) -> float:
    number, unit = text.split()
    return float(number) * (60 if unit == "h" else 1)


def _overlap(a: dict, b: dict) -> float:
    """The area two boxes share (px²); touching edges share none."""
    return max(0.0, min(a["x"] + a["w"], b["x"] + b["w"]) - max(a["x"], b["x"])) * max(0.0, min(a["y"] + a["h"], b["y"] + b["h"]) - max(a["y"], b["y"]))


def _collisions(layout: dict) -> list[str]:
    """Which of the figure's texts (title, legend, axis titles, panel titles) cover another or a plot area."""
    parts = [(name, box) for name in ("title", "legend", "panels", "axes") for box in layout[name]]
    found = [f"{a} × {b}" for i, (a, x) in enumerate(parts) for b, y in parts[i + 1 :] if _overlap(x, y) > 1]
    return found + [f"{name} × plot" for name, box in parts for plot in layout["plots"] if _overlap(box, plot) > 1]


def test_comparison_figures_lay_out_apart_and_keep_each_runs_colour(browser, served, filled_store):
    """The bug: the legend covered the title, a y-axis title ran into the chart title, the bar chart's plot was ~80 px
    tall; a run had another colour on Comparison than on Explore."""
    client = MlflowClient(filled_store["uri"])
    experiments = [client.get_experiment_by_name(name).experiment_id for name in (RESNET, BERT)]
    runs = [r.info.run_id for r in client.search_runs(experiments, filter_string="tags.`radt.role` = 'run'")]
    with new_page(browser, width=1440, height=900) as page:  # then resized to 1920 × 1080: each figure is drawn again at that width
        page.goto(f"{served}?exp={','.join(experiments)}&runs={','.join(runs)}&metrics=cat:sm_active&x=relative&mode=runs&smooth=0&log=0")
        page.wait_for_function(FIGURE_JS)
        page.locator("#compare-by label", has_text="collocation").locator("input").check()
        for width, height in ((1440, 900), (1920, 1080)):
            page.set_viewport_size({"width": width, "height": height})
            page.wait_for_function("(w) => innerWidth === w", arg=width)
            for kind, label, drawn in (("bar", "bars", "bar"), ("box", "box plots", "box"), ("cdf", "CDFs", "scatter"), ("collocation", "collocation", "bar")):
                page.locator("#compare-kind label", has_text=label).locator("input").check()
                want = 2 if kind == "collocation" else 1  # the collocation figure's two panels
                page.wait_for_function(
                    "([kind, want]) => { const l = (" + LAYOUT_JS + ")(); return l && l.kind.split(',')[0] === kind && l.axesCount === want"
                    " && l.legend.length === 1 && l.plots.length === want; }",
                    arg=[drawn, want],
                )
                layout = page.evaluate(LAYOUT_JS)
                assert layout["title"] and len(layout["axes"]) == 2 * want, (width, kind, layout)
                assert not _collisions(layout), (width, kind, _collisions(layout))
                assert min(p["h"] for p in layout["plots"]) >= 250, (width, kind, layout["plots"])
                if kind == "box":
                    page.wait_for_function("(n) => { const c = (" + COLOURS_JS + ")(); return c && c.points.length === n"
                                           " && c.points.every(([r, _c]) => c.lines[r]); }", arg=len(runs))  # fmt: skip
                    colours = page.evaluate(COLOURS_JS)
                    for run_id, colour in colours["points"]:  # by collocation the figure's legend names the commands (issue 52)
                        if colours["by"] == "run":
                            assert set(colours["lines"][run_id]) == {colour}, f"{run_id}: its point {colour}, its lines {colours['lines'][run_id]}"
                        else:
                            assert colour in colours["legend"], f"{run_id}: its point {colour}, the legend's colours {colours['legend']}"
            screenshot(page, f"comparison-collocation-{width}-{filled_store['kind']}")


# each drawn bar against its category's tick, in page pixels: [trace, category, bar centre, tick, bar width, category width]
BARS_JS = """
() => {
  const g = document.querySelector('#compare-figure .js-plotly-plot');
  if (!g || !g._fullLayout || !g._fullData.length || g._fullData[0].type !== 'bar') { return null; }
  const xa = g._fullLayout.xaxis, left = g.getBoundingClientRect().left + xa._offset, step = xa.l2p(1) - xa.l2p(0);
  const out = [];
  g.querySelectorAll('.barlayer .trace').forEach((trace, j) => trace.querySelectorAll('.point path').forEach((bar, i) => {
    const b = bar.getBoundingClientRect(), category = g._fullData[j].x[i];
    out.push([j, category, b.left + b.width / 2, left + xa.l2p(xa._categories.indexOf(category)), b.width, step]);
  }));
  return out;
}
"""


# a comparison figure's legend: its entries' boxes against its own box (a clipped entry still has its box), and its scrollbar
LEGEND_JS = """
() => {
  const g = document.querySelector('#compare-figure .js-plotly-plot');
  const bg = g && g.querySelector('.legend > .bg');
  if (!bg) { return null; }
  const bar = g.querySelector('.legend .scrollbar'), box = bg.getBoundingClientRect();
  return {bottom: box.bottom, items: Array.from(g.querySelectorAll('.legend .traces')).map(t => [t.getBoundingClientRect().top, t.getBoundingClientRect().bottom]),
          scrolls: !!bar && bar.getBoundingClientRect().height > 0, figure: g.getBoundingClientRect().height, kind: g._fullData[0].type};
}
"""


def test_a_bar_stands_on_its_own_category_when_the_others_hold_other_experiments(browser, served, filled_store):
    """Bars by workload of four experiments: only "ungrouped" holds two (the three-hour run's and the imported one's).
    Plotly's group mode kept a slot for every experiment in every category: each workload's bar a quarter wide, at the
    left of its tick, three empty slots beside it. Now a category's bars share it, centred on its tick. And the figure
    is as tall as its legend needs."""
    client = MlflowClient(filled_store["uri"])
    experiments = [e.experiment_id for e in client.search_experiments() if e.name != "Default"]
    runs = [r.info.run_id for r in client.search_runs(experiments)]
    with new_page(browser, width=1440, height=900) as page:
        page.goto(f"{served}?exp={','.join(experiments)}&runs={','.join(runs)}&metrics=cat:sm_active")
        page.wait_for_function("() => { const b = (" + BARS_JS + ")(); return b && b.length >= 8; }")
        bars = page.evaluate(BARS_JS)
        # by collocation, six commands of up to four lines each: the legend ran past the figure's 460 px and scrolled,
        # the sixth command's entry (and which bars were its) out of sight
        legends = {}
        for label, kind, entries in (("collocation", "bar", 6), ("CDFs", "scatter", 9), ("box plots", "box", 4), ("bars", "bar", 4)):
            page.locator("#compare-kind label", has_text=label).locator("input").check()
            page.wait_for_function(
                "([kind, n]) => { const l = (" + LEGEND_JS + ")(); return l && l.kind === kind && l.items.length >= n; }", arg=[kind, entries]
            )
            legends[label] = page.evaluate(LEGEND_JS)
    for label, legend in legends.items():
        assert all(bottom <= legend["bottom"] + 0.5 for _top, bottom in legend["items"]), (label, "every entry inside the legend's box", legend)
        assert not legend["scrolls"], (label, legend)
    per_category: dict[str, list] = {}
    for bar in bars:
        per_category.setdefault(bar[1], []).append(bar)
    assert len(per_category) >= 8 and any(len(b) == 2 for b in per_category.values()), per_category
    for category, found in per_category.items():
        tick, step = found[0][3], found[0][5]
        middle = sum(b[2] for b in found) / len(found)
        assert abs(middle - tick) <= 1.5, f"{category}: its bars centred at {middle:.1f} px, its tick at {tick:.1f}"
        assert sum(b[4] for b in found) >= 0.6 * step, f"{category}: {len(found)} bars {[round(b[4]) for b in found]} px wide in {step:.0f}"
