"""Issue #52 in real headless Chromium against a real `python app.py`, read from what Plotly drew and what the screen shows:

- a run's colour is its place in the view: the same three runs are the same colours in a 3-run view, in a 10-run view
  that begins with them, and after a fourth run is ticked in the picker (it comes last in the link and takes the next
  colour); the legend table's swatches are the charts' colours;
- the demo's bert-base 1A (SMACT 0 <-> 0.7 every few seconds for 30 minutes) no longer hides the other nine runs: counted
  in a screenshot of the SMACT chart, each keeps most of the pixels of its colour that it shows without bert-base 1A.
"""

from __future__ import annotations

import io
import urllib.parse

import numpy as np
from mlflow import MlflowClient
from PIL import Image

from radt.app.figures.palette import PALETTE
from tests.support.browser import dashboard, new_page, screenshot
from tests.support.radtproc import radt_env
from tests.support.stores import write_default_demo

DEMO = ("demo: resnet50 collocation", "demo: bert fine-tuning")
GRAPH = "document.querySelector('#charts .js-plotly-plot')"
# run_id -> the colour of its lines as drawn (its envelope left out), on the first chart
LINE_COLOURS_JS = (
    "() => Object.fromEntries(" + GRAPH + "._fullData.filter(t => (t.yaxis || 'y') === 'y' && t.meta && t.meta.run_id && !t.meta.band)"
    ".map(t => [t.meta.run_id, t.line.color]))"
)
# data-id -> the legend table's swatch colour, in the table's order
LEGEND_JS = """() => Array.from(document.querySelectorAll('.chart-legend .legend-entry:not(.legend-device)'))
  .map(e => [e.dataset.id, getComputedStyle(e.querySelector('span[style]')).backgroundColor])"""
DRAWN_JS = (
    "(n) => { const g = "
    + GRAPH
    + "; return g && g._fullData && new Set(g._fullData.map(t => t.meta && t.meta.run_id)).size === n && !g.classList.contains('dash-graph--pending'); }"
)


def _demo(uri: str) -> tuple[list[str], list[tuple[str, str]]]:
    """The demo's experiment ids and its runs (id, name), newest first: an order no hash or start time gives."""
    client = MlflowClient(uri)
    experiments = [client.get_experiment_by_name(name).experiment_id for name in DEMO]
    runs = client.search_runs(experiments, filter_string="tags.`radt.role` = 'run'", order_by=["attributes.start_time DESC"])
    return experiments, [(r.info.run_id, r.info.run_name) for r in runs]


def _rgb(colour: str) -> str:
    return "rgb({}, {}, {})".format(*(int(colour[i : i + 2], 16) for i in (1, 3, 5)))


def _open(page, base: str, experiments: list[str], run_ids: list[str], metrics: str = "cat:sm_active") -> None:
    page.goto(base + "?" + urllib.parse.urlencode({"exp": ",".join(experiments), "runs": ",".join(run_ids), "metrics": metrics, "cols": "1"}))
    page.wait_for_function(DRAWN_JS, arg=len(run_ids))


def test_a_runs_colour_is_its_place_in_the_view_and_adding_runs_never_changes_it(page, served, filled_store):
    experiments, runs = _demo(filled_store["uri"])
    ids = [run_id for run_id, _name in runs]
    _open(page, served, experiments, ids[:3])
    three = page.evaluate(LINE_COLOURS_JS)
    assert three == {run_id: PALETTE[i] for i, run_id in enumerate(ids[:3])}, "the view's first run is the palette's first colour, and so on"
    assert page.evaluate(LEGEND_JS) == [[run_id, _rgb(PALETTE[i])] for i, run_id in enumerate(ids[:3])], (
        "the legend table: the same colours, in the view's order"
    )

    _open(page, served, experiments, ids)
    ten = page.evaluate(LINE_COLOURS_JS)
    assert {run_id: ten[run_id] for run_id in ids[:3]} == three, "a 10-run view that begins with the same three runs"
    assert ten == {run_id: PALETTE[i] for i, run_id in enumerate(ids)}
    screenshot(page, "run-colours-ten")

    # ticking a fourth run in the picker: it comes last in the link, whatever its place in the tree, and takes the next colour
    _open(page, served, experiments, ids[:3])
    added_id, added_name = next((run_id, name) for run_id, name in runs[3:] if name.startswith("resnet50 1"))
    page.locator(".wl-runs label", has_text=added_name).locator("input").check()
    page.wait_for_function(DRAWN_JS, arg=4)
    page.wait_for_function("(id) => new URLSearchParams(location.search).get('runs').endsWith(id)", arg=added_id)
    assert urllib.parse.parse_qs(urllib.parse.urlsplit(page.url).query)["runs"] == [",".join([*ids[:3], added_id])]
    assert page.evaluate(LINE_COLOURS_JS) == {**three, added_id: PALETTE[3]}


# the first chart's plot area in page coordinates
PLOT_AREA_JS = (
    """() => { const g = """
    + GRAPH
    + """, r = g.getBoundingClientRect(), l = g._fullLayout;
  return {x: r.left + window.scrollX + l.xaxis._offset, y: r.top + window.scrollY + l.yaxis._offset, width: l.xaxis._length, height: l.yaxis._length}; }"""
)
HIDE_JS = "(id) => { const g = " + GRAPH + "; const i = g._fullData.filter(t => t.meta && t.meta.run_id === id).map(t => t.index);" \
          " return Plotly.restyle(g, {visible: false}, i).then(() => true); }"  # fmt: skip
NEAR = 50  # RGB distance of a pixel to a run's colour that still counts as the run's (antialiasing; the light envelope over it moves olive by 43)
KEPT = 0.75  # each other run keeps at least this share of the pixels it shows without the dense run


def _pixels(page, colours: dict[str, str]) -> dict[str, int]:
    """run_id -> pixels of its line colour in a screenshot of the first chart's plot area."""
    image = np.asarray(Image.open(io.BytesIO(page.screenshot(clip=page.evaluate(PLOT_AREA_JS), full_page=True))).convert("RGB"), dtype=np.int32)
    out = {}
    for run_id, colour in colours.items():
        rgb = np.array([int(colour[i : i + 2], 16) for i in (1, 3, 5)])
        out[run_id] = int((np.sqrt(((image - rgb) ** 2).sum(axis=2)) <= NEAR).sum())
    return out


def test_a_series_swinging_faster_than_its_chart_shows_leaves_the_other_runs_visible(browser, snapshots, empty_sqlite, radt_home, tmp_path):
    uri = empty_sqlite(tmp_path / "demo.db")
    snapshots.restore(write_default_demo, uri)
    experiments, runs = _demo(uri)
    ids = [run_id for run_id, _name in runs]
    dense = next(run_id for run_id, name in runs if name == "bert-base 1A")
    with dashboard(uri, radt_env(radt_home)) as base:
        for width, height in ((1440, 900), (1920, 1080)):
            with new_page(browser, width, height) as page:
                _open(page, base, experiments, ids)
                colours = page.evaluate(LINE_COLOURS_JS)
                shown = _pixels(page, colours)
                screenshot(page, f"dense-series-{width}")
                page.evaluate(HIDE_JS, dense)
                page.wait_for_function("(id) => " + GRAPH + "._fullData.filter(t => t.meta && t.meta.run_id === id).every(t => t.visible === false)", arg=dense)
                alone = _pixels(page, {r: c for r, c in colours.items() if r != dense})
                kept = {r: shown[r] / alone[r] for r in alone if alone[r] >= 200}
                assert len(kept) >= 6, (alone, width)
                assert min(kept.values()) >= KEPT, f"at {width} px the dense run hides the others: {kept} ({shown[dense]} px of its own colour)"
                assert shown[dense] >= 500, "and it is drawn"
