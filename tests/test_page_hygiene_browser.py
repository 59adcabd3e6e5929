"""What a new user saw on the demo after the README's first command (a walk in Chromium, 2026-11-26), each a test:

- a "Share chart..." button in every chart's modebar that uploads the chart's data to Plotly Cloud (plotly.js 4's default);
- the summary table's logs cell of a workload's "2 runs together" row read "undefined";
- a run of one sample drew nothing on its chart while the legend gave its mean;
- the run tree's open/closed markers were cut by the sidebar's edge.
"""

from __future__ import annotations

import pytest

from tests.support.browser import chart_titles, new_page, wait_for_chart

DEMO = "demo: resnet50 collocation"
FIVE_GPUS = "imported 5 GPUs"  # the real 5-GPU logs (tests/support/stores.import_five_gpus)

pytestmark = pytest.mark.parametrize("filled_store", ["sqlite"], indirect=True)


def _experiment(uri: str, name: str) -> tuple[str, list[str]]:
    from radt.app.db.runs import list_experiments
    from radt.app.db.state import STATE
    from radt.app.exportcli import _open_store
    from radt.app.view import data

    _open_store(uri)
    experiment = next(str(e["experiment_id"]) for e in list_experiments(STATE.engine) if e["name"] == name)
    return experiment, list(data.runs([experiment])["run_id"])


def test_no_chart_offers_to_upload_its_data_and_no_cell_reads_undefined(filled_store, served, browser):
    experiment, runs = _experiment(filled_store["uri"], DEMO)
    with new_page(browser, width=1440, height=900) as page:
        page.goto(f"{served}?exp={experiment}&runs={','.join(runs)}")
        wait_for_chart(page)
        page.locator("#charts").hover()
        page.locator("#charts .modebar-btn").first.wait_for()
        titles = page.evaluate("() => Array.from(document.querySelectorAll('.modebar-btn')).map(b => b.getAttribute('data-title'))")
        assert "Download plot" in " ".join(t or "" for t in titles), titles
        assert not any("Share" in (t or "") or "Cloud" in (t or "") or "Chart Studio" in (t or "") for t in titles), titles
        page.wait_for_function("() => document.querySelectorAll('#summary td').length > 0")
        page.wait_for_function("() => Array.from(document.querySelectorAll('#summary td')).some(td => td.textContent.includes('together'))")
        cells = page.evaluate("() => Array.from(document.querySelectorAll('#summary td')).map(td => td.textContent.trim())")
        assert "undefined" not in cells and not any("undefined" in c for c in cells), [c for c in cells if "undefined" in c]
        marker = page.evaluate(
            """() => { const s = document.querySelector('.workload summary'); const side = document.querySelector('.sidebar').getBoundingClientRect();
              const box = s.getBoundingClientRect(); const pad = parseFloat(getComputedStyle(s.parentElement).paddingLeft); return {left: box.left - side.left, pad}; }"""
        )
        assert marker["pad"] >= 12, ("the workload's open/closed marker, drawn left of its summary, has room inside the sidebar", marker)


ROWS_IN_VIEW = """() => { const box = document.querySelector('.chart-legend').getBoundingClientRect();
  return Array.from(document.querySelectorAll('.legend-table tr.legend-entry:not(.legend-device)')).map(r => {
    const b = r.getBoundingClientRect(); return {id: r.dataset.id, inside: b.top >= box.top - 0.5 && b.bottom <= box.bottom + 0.5}; }); }"""
BELOW_JS = "() => document.querySelector('.legend-below').textContent"


def _shown_or_counted(rows: list[dict], below: str) -> bool:
    """Every run's row in the legend's box, or the ones below its fold counted under it (the bar that stays over the charts
    is a fifth of the window at most, issue 52: at 1440 x 900 it holds 10 runs' rows, more scroll)."""
    hidden = sum(not r["inside"] for r in rows)
    shown_first = all(r["inside"] for r in rows[: len(rows) - hidden])
    return shown_first and (below == "" if hidden == 0 else below.startswith(f"\u2193 {hidden} more run"))


CUT_CELLS = """() => Array.from(document.querySelectorAll('#summary td')).filter(td => td.scrollWidth > td.clientWidth)
  .map(td => [td.dataset.dashColumn, td.textContent.trim()])"""


def test_the_legend_shows_each_of_ten_runs_without_scrolling_and_the_summary_fits_and_names_each_pair(filled_store, served, browser):
    """At 1440 x 900 with the 8 default charts, the table legend showed 9 of the demo's 10 runs: the 10th (the FAILED
    one) was below its scroll edge, and headless and overlay scrollbars give no sign of it. The summary table of the same
    view (2026-11-27 walk) scrolled sideways, 1,091 px in 1,064, its logs column cut at the window's edge; and its three
    rows of runs together (same GPU, MPS, MIG) each read "2 runs together (A+B)", cut to "2 runs together (A+…"; at 1920 px, with
    room to spare, the run column stayed 160 px and cut them to "workload 2 same GP…"."""
    first, runs = _experiment(filled_store["uri"], DEMO)
    second, more = _experiment(filled_store["uri"], "demo: bert fine-tuning")
    with new_page(browser, width=1440, height=900) as page:
        page.goto(f"{served}?exp={first},{second}&runs={','.join(runs + more)}")
        wait_for_chart(page)
        page.locator(".chart-legend .legend-table").wait_for()
        rows = page.evaluate(ROWS_IN_VIEW)
        page.wait_for_function("() => Array.from(document.querySelectorAll('#summary td')).filter(td => td.textContent.includes('together')).length >= 3")
        scrollers = page.evaluate(
            """() => Array.from(document.querySelectorAll('#summary, #summary *')).filter(e => ['auto', 'scroll'].includes(getComputedStyle(e).overflowX))
              .map(e => [e.scrollWidth, e.clientWidth])"""
        )
        pairs = page.evaluate(
            """() => Array.from(document.querySelectorAll('#summary td[data-dash-column="run"]')).map(td => td.textContent.trim())
              .filter(t => t.includes('together'))"""
        )
        # the tooltip of the GPU memory chart: each value as the legend and the table print it (it read 44,710 beside 44,708)
        memory = chart_titles(page).index("GPU memory (MB)") + 1
        drag = page.locator(f"#charts .draglayer .x{memory}y{memory} .nsewdrag")
        drag.evaluate("e => e.scrollIntoView({block: 'end'})")  # below the sticky bar, in the window
        box = drag.bounding_box()
        page.mouse.move(box["x"] + box["width"] * 0.5, box["y"] + box["height"] * 0.5)
        page.wait_for_function(
            "() => { const t = document.querySelector('.radt-tip'); return t && getComputedStyle(t).display !== 'none' && t.innerText.startsWith('GPU memory'); }"
        )
        shown = page.locator(".radt-tip .tip-value").all_text_contents()
        hovered = page.evaluate(
            "(axis) => document.querySelector('#charts .js-plotly-plot')._hoverdata.filter(p => (p.data.yaxis || 'y') === axis).map(p => p.y)", f"y{memory}"
        )
        visible = page.evaluate(  # the start of each pair's cell drawn inside it (the rest is cut with an ellipsis)
            """() => Array.from(document.querySelectorAll('#summary td[data-dash-column="run"]')).filter(td => td.textContent.includes('together'))
              .map(td => { const node = document.createTreeWalker(td, NodeFilter.SHOW_TEXT).nextNode(), r = document.createRange(), right = td.getBoundingClientRect().right;
                           let n = 0; r.setStart(node, 0);
                           while (n < node.length) { r.setEnd(node, n + 1); if (r.getBoundingClientRect().right > right - 4) break; n++; }
                           return node.textContent.slice(0, n); })"""
        )
        cut = page.evaluate(CUT_CELLS)
        # at 1920 px the run column has room for each pair's whole name (at 160 px it read "workload 2 same GP…" there too)
        page.set_viewport_size({"width": 1920, "height": 1080})
        page.wait_for_function("() => window.innerWidth === 1920")
        wide_cut = page.evaluate(CUT_CELLS)
        wide = page.evaluate(
            """() => Array.from(document.querySelectorAll('#summary td[data-dash-column="run"]')).filter(td => td.textContent.includes('together'))
              .map(td => [td.textContent.trim(), td.scrollWidth <= td.clientWidth])"""
        )
        wide_scrollers = page.evaluate(
            """() => Array.from(document.querySelectorAll('#summary, #summary *')).filter(e => ['auto', 'scroll'].includes(getComputedStyle(e).overflowX))
              .map(e => [e.scrollWidth, e.clientWidth])"""
        )
    assert len(rows) == len(runs + more) == 10
    assert all(r["inside"] for r in rows), [r["id"] for r in rows if not r["inside"]]
    assert scrollers and all(scroll <= client for scroll, client in scrollers), f"the summary table scrolls sideways at 1440 px: {scrollers}"
    workloads = ("workload 2 same GPU", "workload 3 MPS", "workload 4 MIG 3g.40gb")
    assert sorted(pairs) == [f"{w}: A+B together" for w in workloads], pairs
    expected = sorted((round(y) for y in hovered), reverse=True)[: len(shown)]  # the box lists the highest 12
    assert shown and [int(text.replace(",", "")) for text in shown] == expected, (shown, hovered)
    assert len(set(visible)) == 3 and all(len(text) >= len("workload 2 same") for text in visible), f"what each pair's cell shows: {visible}"
    assert len(wide) == 3 and all(whole for _, whole in wide), f"each pair's name whole at 1920 px: {wide}"
    assert wide_scrollers and all(scroll <= client for scroll, client in wide_scrollers), f"the summary table scrolls sideways at 1920 px: {wide_scrollers}"
    # the command cut the script itself at 1440 px ("train_imagene…", 118 px in 110), the colloc. "same G…"; at 1920 px the
    # bert sweep's arguments, what tells its runs apart, were past the cut with 480 px to spare
    assert not [c for c in cut if c[0] == "collocation" or c == ["command", "train_imagenet.py"]], cut
    assert not [c for c in wide_cut if c[0] in ("command", "collocation")], wide_cut


LEGEND_FIT = """() => { const box = document.querySelector('.chart-legend'), edge = box.getBoundingClientRect().right;
  const shown = e => getComputedStyle(e).display !== 'none';
  const heads = Array.from(box.querySelectorAll('.legend-table th.legend-num')).filter(shown);
  return {scroll: box.scrollWidth, client: box.clientWidth,
          charts: Array.from(box.querySelectorAll('th.legend-first .legend-chart')).map(d => {
            const r = document.createRange(); r.selectNodeContents(d); const lines = Array.from(r.getClientRects());
            return [d.textContent, Math.max(...lines.map(x => x.right)) <= edge + 0.5, new Set(lines.map(x => Math.round(x.top))).size]; }),
          head: box.querySelector('.legend-table thead').getBoundingClientRect().height,
          stats: heads.map(h => h.lastChild.textContent),
          pressed: Object.fromEntries(Array.from(box.querySelectorAll('.legend-stat-toggle')).map(b => [b.dataset.stat, b.getAttribute('aria-pressed')]))}; }"""


def test_the_legend_of_the_eight_default_charts_fits_1440_px_and_shows_max_and_last_on_demand(filled_store, served, browser):
    """At 1440 x 900 with the 8 default charts the table legend was 1,703 px wide in a 1,062 px box: it scrolled sideways
    (no scrollbar in sight on an overlay-scrollbar screen) and cut "Power (W)" mid-header, CPU and host memory out of view.
    Now the max and last columns show where the table fits (4 charts: all three), on demand where it does not, and the
    choice holds when the legend is drawn anew.

    With the demo's 10 runs and the 5-GPU run (11 rows) a chart's name wrapped inside its mean column while the max column
    beside it stood empty: "CPU (% of all cores)" on four lines, a 67 px header, and the 11th run below the legend's fold.
    Now a chart's name spans its shown columns: two lines at most, every run's row in view or, past the fifth of the
    window the legend may take (issue 52), counted under it."""
    first, runs = _experiment(filled_store["uri"], DEMO)
    second, more = _experiment(filled_store["uri"], "demo: bert fine-tuning")
    view = f"{served}?exp={first},{second},{_experiment(filled_store['uri'], FIVE_GPUS)[0]}&runs={','.join([*runs, *more, filled_store['five_gpus']])}"
    with new_page(browser, width=1440, height=900) as page:
        page.goto(view)
        wait_for_chart(page)
        page.locator(".chart-legend .legend-table").wait_for()
        fit = page.evaluate(LEGEND_FIT)
        assert len(fit["charts"]) == 8 and all(inside for _, inside, _lines in fit["charts"]), f"every chart's name in the legend's box: {fit['charts']}"
        assert fit["scroll"] <= fit["client"], f"the legend scrolls sideways at 1440 px: {fit['scroll']} px in {fit['client']}"
        assert all(lines <= 2 for _, _inside, lines in fit["charts"]), ("each chart's name on two lines at most", fit["charts"], fit["head"])
        rows, below = page.evaluate(ROWS_IN_VIEW), page.evaluate(BELOW_JS)
        assert len(rows) == 11 and _shown_or_counted(rows, below), ("every run's row in the legend's box, or counted under it", fit["head"], below, rows)
        assert "mean" in fit["stats"] and fit["stats"].count("mean") == 8, fit["stats"]
        hidden = [k for k in ("max", "last") if fit["pressed"][k] == "false"]
        assert hidden and all(k not in fit["stats"] for k in hidden), ("a column is hidden only as its toggle says", fit)
        page.locator(".legend-stat-toggle[data-stat=last]").click()
        page.wait_for_function(
            "() => document.querySelectorAll('.legend-table th.legend-last').length && getComputedStyle(document.querySelector('.legend-table th.legend-last')).display !== 'none'"
        )
        page.locator(f"input[value='{runs[0]}']").uncheck()  # one run fewer: the charts and their legend drawn anew
        page.wait_for_function("() => document.querySelectorAll('.legend-table tr.legend-entry:not(.legend-device)').length === 10")
        again = page.evaluate(LEGEND_FIT)
        assert again["stats"].count("last") == 8 and again["pressed"]["last"] == "true", ("the user's pick holds over a redraw", again)
    with new_page(browser, width=1440, height=900) as page:
        page.goto(view + "&metrics=cat:sm_active,cat:sm_occupancy,cat:gr_engine_active,cat:cpu_utilization_percentage")
        wait_for_chart(page)
        page.locator(".chart-legend .legend-table").wait_for()
        four = page.evaluate(LEGEND_FIT)
    assert four["scroll"] <= four["client"] and [four["stats"].count(k) for k in ("mean", "max", "last")] == [4, 4, 4], four
    assert four["pressed"] == {"max": "true", "last": "true"}, four
    # a laptop's 1280 x 720: the means alone were 931 px in 902 ("Host memory (MB)" cut); the chart names take two lines
    with new_page(browser, width=1280, height=720) as page:
        page.goto(view)
        wait_for_chart(page)
        page.locator(".chart-legend .legend-table").wait_for()
        laptop = page.evaluate(LEGEND_FIT)
        rows, below = page.evaluate(ROWS_IN_VIEW), page.evaluate(BELOW_JS)
    assert laptop["scroll"] <= laptop["client"] and all(inside for _, inside, _lines in laptop["charts"]), laptop
    assert len(rows) == 11 and _shown_or_counted(rows, below), ("every run's row in the legend's box, or counted under it", laptop["head"], below, rows)
