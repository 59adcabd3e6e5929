"""What a newcomer saw on the README's demo in Chromium at 1440 x 900 (issue 52), each a test on the demo's 10 runs and
the 8 default charts:

- the sticky top bar (metric picker, controls and the 10-row legend) was 337 px, 37 % of the window, and stayed over
  Summary and Comparison: scrolled to "Summary", its heading, its header row and its first 7 rows were under it (the bar
  is now the legend alone, a fifth of the window at most, and it leaves with the charts' end: it never hides their last row);
- the chart's tooltip box, centred on the cursor, covered the title of the chart it described.
"""

from __future__ import annotations

import pytest

from tests.support.browser import new_page, screenshot, wait_for_chart

DEMO = ("demo: resnet50 collocation", "demo: bert fine-tuning")
STICKY_SHARE = 0.20  # of the window's height: the most the bar that stays in view may take (issue 52)

pytestmark = pytest.mark.parametrize("filled_store", ["sqlite"], indirect=True)

# what stays at the top of the window: every sticky or fixed element stuck there (the sidebar is a column, not a bar),
# the lowest bottom of them in px; 0 when none
STUCK_BOTTOM_JS = """() => {
  let bottom = 0;
  for (const e of document.querySelectorAll('body *')) {
    const position = getComputedStyle(e).position;
    if ((position !== 'sticky' && position !== 'fixed') || e.closest('.sidebar') || e.closest('.radt-tip, .radt-details')) { continue; }
    const r = e.getBoundingClientRect();
    if (r.height > 0 && r.top <= 1 && r.bottom > 0) { bottom = Math.max(bottom, r.bottom); }
  }
  return bottom;
}"""
# the 'Summary' heading and the summary table's header row, in the window
SUMMARY_JS = """() => {
  const heading = Array.from(document.querySelectorAll('h3')).find(h => h.textContent.trim() === 'Summary');
  const header = document.querySelector('#summary th');
  const box = e => { const r = e.getBoundingClientRect(); return {top: r.top, bottom: r.bottom}; };
  return {heading: box(heading), header: box(header)};
}"""
# whether what the browser paints at the middle of the heading and of the header row's first cell is theirs (not a bar's)
PAINTED_JS = """() => {
  const heading = Array.from(document.querySelectorAll('h3')).find(h => h.textContent.trim() === 'Summary');
  const header = document.querySelector('#summary th');
  const mine = t => { const r = t.getBoundingClientRect(), e = document.elementFromPoint(r.left + Math.min(20, r.width / 2), (r.top + r.bottom) / 2);
                      return e !== null && (t.contains(e) || e.contains(t)); };
  return {heading: mine(heading), header: mine(header)};
}"""
# the charts' bottom and whether what is painted 10 px above it, halfway across, is the charts' (not the legend's bar)
LAST_ROW_JS = """() => {
  const charts = document.querySelector('#charts'), r = charts.getBoundingClientRect();
  const e = document.elementFromPoint(r.left + r.width / 2, r.bottom - 10);
  return {bottom: r.bottom, mine: e !== null && charts.contains(e)};
}"""
ROWS_IN_VIEW = """() => { const box = document.querySelector('.chart-legend').getBoundingClientRect();
  return Array.from(document.querySelectorAll('.legend-table tr.legend-entry:not(.legend-device)')).map(r => {
    const b = r.getBoundingClientRect(); return b.top >= box.top - 0.5 && b.bottom <= box.bottom + 0.5; }); }"""


def _demo_view(uri: str, served: str) -> str:
    """The explore link of the demo's two experiments with all 10 runs ticked, as a newcomer ticks them."""
    from radt.app.db.runs import list_experiments
    from radt.app.db.state import STATE
    from radt.app.exportcli import _open_store
    from radt.app.view import data

    _open_store(uri)
    experiments = [str(e["experiment_id"]) for e in list_experiments(STATE.engine) if e["name"] in DEMO]
    runs = list(data.runs(experiments)["run_id"])
    assert len(experiments) == 2 and len(runs) == 10, (experiments, runs)
    return f"{served}?exp={','.join(experiments)}&runs={','.join(runs)}"


def test_the_sticky_bar_takes_a_fifth_of_the_window_at_most_and_never_covers_the_summary(filled_store, served, browser):
    with new_page(browser, width=1440, height=900) as page:
        page.goto(_demo_view(filled_store["uri"], served))
        wait_for_chart(page)
        page.wait_for_function("() => document.querySelectorAll('.legend-table tr.legend-entry:not(.legend-device)').length === 10")
        page.wait_for_function("() => document.querySelectorAll('#summary th').length > 0")
        # into the charts: what stays at the top while they scroll
        page.evaluate("() => window.scrollTo(0, document.querySelector('#charts').getBoundingClientRect().top + window.scrollY + 400)")
        page.wait_for_function("() => window.scrollY > 400")
        stuck = page.evaluate(STUCK_BOTTOM_JS)
        rows = page.evaluate(ROWS_IN_VIEW)
        screenshot(page, "newcomer-sticky-charts")
        # the charts' end 120 px below the window's top: their last row is what shows there, not the bar that stayed
        # (scrolled again while the page settles: the bar leaving, a late row of the legend or scroll anchoring move the charts)
        page.wait_for_function(
            f"() => {{ const v = ({LAST_ROW_JS})(); if (Math.abs(v.bottom - 120) >= 2) {{ window.scrollBy(0, v.bottom - 120); return false; }} return v.mine; }}",
            timeout=10_000,
        )
        # a jump to the Summary section: its heading and header row in view, under nothing
        page.evaluate("() => Array.from(document.querySelectorAll('h3')).find(h => h.textContent.trim() === 'Summary').scrollIntoView()")
        page.wait_for_function(
            "() => Math.abs(Array.from(document.querySelectorAll('h3')).find(h => h.textContent.trim() === 'Summary').getBoundingClientRect().top) < 2"
        )
        over_summary = page.evaluate(STUCK_BOTTOM_JS)
        summary = page.evaluate(SUMMARY_JS)
        painted = page.evaluate(PAINTED_JS)
        screenshot(page, "newcomer-sticky-summary")
    assert 0 < stuck <= STICKY_SHARE * 900, f"the bar that stays over the charts is {stuck:.0f} px of 900 (at most {STICKY_SHARE * 900:.0f})"
    assert len(rows) == 10 and all(rows), ("each of the 10 runs' rows in the legend's box", rows)
    for part in ("heading", "header"):
        assert summary[part]["top"] >= over_summary - 0.5, (f"the summary's {part} is under the sticky bar", summary, over_summary)
        assert painted[part], f"something else is painted over the summary's {part}"


# the tooltip box and the hovered chart's title, in the window
TIP_AND_TITLE_JS = """(title) => {
  const tip = document.querySelector('.radt-tip');
  const head = Array.from(document.querySelectorAll('#charts .annotation-text')).find(t => t.textContent === title);
  if (!tip || getComputedStyle(tip).display === 'none' || !head) { return null; }
  const a = tip.getBoundingClientRect(), b = head.getBoundingClientRect();
  return {tip: [a.left, a.top, a.right, a.bottom], title: [b.left, b.top, b.right, b.bottom], head: tip.querySelector('.tip-head').textContent};
}"""


def _overlap(a: list[float], b: list[float]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def test_the_tooltip_box_never_covers_the_title_of_its_chart(filled_store, served, browser):
    """The box of the 10 runs' values, centred on the cursor, lay over the chart's title when the cursor was near the top
    of the plot (issue 52); it now starts at the plot's top edge at the highest."""
    with new_page(browser, width=1440, height=900) as page:
        page.goto(_demo_view(filled_store["uri"], served))
        wait_for_chart(page)
        page.wait_for_function("() => window.radtCharts && document.querySelectorAll('.legend-table tr.legend-entry').length >= 10")
        seen = {}
        for axis, title in (("xy", "SMACT"), ("x3y3", "GRACT")):  # the first chart, and one in the second row
            plot = page.locator(f"#charts .draglayer .{axis} .nsewdrag")
            plot.scroll_into_view_if_needed()
            page.evaluate("() => window.scrollBy(0, -300)")  # the chart and its title below the bar that stays
            box = plot.bounding_box()
            page.mouse.move(box["x"] + box["width"] * 0.4, box["y"] + 6)  # near the plot's top edge, under its title
            page.wait_for_function(f"() => {{ const v = ({TIP_AND_TITLE_JS})('{title}'); return v && v.head.startsWith('{title}'); }}")
            seen[title] = page.evaluate(TIP_AND_TITLE_JS, title)
            screenshot(page, f"newcomer-tip-{title}")
            page.mouse.move(2, 890)
    for title, shown in seen.items():
        assert not _overlap(shown["tip"], shown["title"]), (f"the tooltip box covers the title of {title}", shown)
