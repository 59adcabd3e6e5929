"""radt's own plotly.js (assets/plotly-radt.min.js, docs/plotly-bundle/): the four trace types radt draws, the version
Dash ships, and the page that uses it instead of Dash's full bundle.

The full plotly.js took 0.8-1.1 s of the browser's main thread before a cold page's first chart; WebGL lines without
a GPU (a headless or VM browser's software GL) took 1.7 s to paint 60,000 points where SVG takes 0.3 s.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import plotly
import plotly.graph_objects as go
import pytest
from plotly.basedatatypes import BaseTraceType

from radt.app.db.downsample import envelope
from radt.app.figures.figures import SVG_POINTS, Panel, line_trace_class
from radt.catalogue import METRICS, Device
from tests.support.browser import new_page, wait_for_chart

REPO = Path(__file__).resolve().parent.parent
BUNDLE = REPO / "assets" / "plotly-radt.min.js"
ENTRY = REPO / "docs" / "plotly-bundle" / "entry.js"
BUNDLED_TRACES = {"scatter", "scattergl", "bar", "box"}  # scatter is in plotly.js's core; the others in entry.js
# a trace type in radt's figure code: go.Scatter(...) or go.Scattergl, figure.add_box(...), {"type": "bar"} in a dict
TRACE_USES = (re.compile(r"\bgo\.([A-Z][A-Za-z0-9]*)\b"), re.compile(r"\.add_([a-z0-9]+)\("), re.compile(r"\"type\":\s*\"([a-z0-9]+)\""))
PLOTLY_TRACES = {name.lower() for name in dir(go) if isinstance(getattr(go, name), type) and issubclass(getattr(go, name), BaseTraceType)}


def _trace_types_in_source() -> dict[str, set[str]]:
    """Every trace type named in the dashboard's and export's figure code (app/, pages/), with the files naming it."""
    found: dict[str, set[str]] = {}
    for path in [*REPO.joinpath("app").rglob("*.py"), *REPO.joinpath("pages").rglob("*.py")]:
        text = path.read_text()
        for pattern in TRACE_USES:
            for name in pattern.findall(text):
                if name.lower() in PLOTLY_TRACES:  # not add_annotation, {"type": "log"} of an axis, go.Figure
                    found.setdefault(name.lower(), set()).add(path.name)
    return found


def test_every_trace_type_radt_draws_is_in_its_plotly_bundle():
    used = _trace_types_in_source()
    assert {"scatter", "scattergl", "bar", "box"} <= set(used), ("the scan finds radt's own figures", used)
    missing = {kind: files for kind, files in used.items() if kind not in BUNDLED_TRACES}
    assert not missing, f"trace types not in assets/plotly-radt.min.js (add them to docs/plotly-bundle/entry.js and rebuild): {missing}"
    registered = set(re.findall(r"require\('plotly\.js/lib/([a-z0-9]+)'\)", ENTRY.read_text())) - {"core"}
    assert registered | {"scatter"} == BUNDLED_TRACES, registered


def test_the_bundle_is_the_plotly_js_version_dash_and_plotly_ship():
    """A new plotly (and so a new plotly.js in Dash and in exports) must come with a rebuilt bundle: one figure, two renderers."""
    shipped = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    version = re.search(r"plotly\.js v([0-9.]+)", shipped.read_text()[:400]).group(1)
    banner = BUNDLE.read_text()[:300]
    assert f"plotly.js {version} " in banner, f"assets/plotly-radt.min.js is not plotly.js {version}: rebuild it (docs/plotly-bundle/README.md); {banner[:120]}"


def _panel(runs: int, points: int) -> Panel:
    x = np.arange(points, dtype=np.int64) * 1000
    series = {f"run{i}": {Device(): (x, np.linspace(0, 1, points))} for i in range(runs)}
    return Panel(METRICS["sm_active"], series)


def test_a_figure_draws_svg_lines_up_to_svg_points_and_webgl_beyond():
    assert line_trace_class([_panel(10, 2000)] * 4).__name__ == "Scatter"  # 80,000 points: the newcomer's 10 runs x 4 charts
    assert line_trace_class([_panel(10, SVG_POINTS // 10)]).__name__ == "Scatter"
    assert line_trace_class([_panel(10, SVG_POINTS // 10 + 1)]).__name__ == "Scattergl"
    x = np.arange(30_000, dtype=np.float64)
    band = {"run0": {Device(): envelope(x, np.sin(x), budget=3000)}}  # a band counts 3 points a bucket: its line and polygon
    assert line_trace_class([Panel(METRICS["sm_active"], band)] * (SVG_POINTS // 3000)).__name__ == "Scatter"
    assert line_trace_class([Panel(METRICS["sm_active"], band)] * (SVG_POINTS // 3000 + 1)).__name__ == "Scattergl"


PAGE_PLOTLY = """async () => {
  const d = document.createElement('div'); document.body.appendChild(d);
  await window.Plotly.newPlot(d, [{type: 'scattergl', x: [1, 2, 3], y: [3, 1, 2]}, {type: 'bar', x: [1], y: [1]}, {type: 'box', y: [1, 2, 3]}]);
  const drawn = d._fullData.map(t => t.type + ':' + Boolean(t._module));
  const gl = d.querySelectorAll('canvas.gl-canvas').length;
  window.Plotly.purge(d); d.remove();
  return {version: window.Plotly.version, drawn, gl};
}"""


@pytest.mark.parametrize("filled_store", ["sqlite"], indirect=True)
def test_the_explore_page_draws_with_radts_bundle_and_never_loads_dashs(filled_store, served, browser):
    from radt.app.db.runs import list_experiments
    from radt.app.db.state import STATE
    from radt.app.exportcli import _open_store

    _open_store(filled_store["uri"])
    demo = next(str(e["experiment_id"]) for e in list_experiments(STATE.engine) if e["name"] == "demo: resnet50 collocation")
    with new_page(browser, width=1440, height=900) as page:
        fetched: list[str] = []
        page.on("request", lambda r: fetched.append(r.url))
        page.goto(f"{served}?exp={demo}&runs=" + ",".join(_demo_runs(demo)))
        wait_for_chart(page)
        kinds = page.evaluate("() => [...new Set(document.querySelector('#charts .js-plotly-plot')._fullData.map(t => t.type))]")
        assert kinds == ["scatter"], ("a view of a few runs is drawn in SVG", kinds)
        assert page.locator("#charts .scatterlayer .trace path.js-line").count() > 0
        shown = page.evaluate(PAGE_PLOTLY)
    assert any("/assets/plotly-radt.min.js" in url for url in fetched)
    assert not any("package_data/plotly.min.js" in url or "plotly.min.js" in url.rsplit("/", 1)[-1] for url in fetched), "Dash's full bundle was loaded too"
    assert shown["drawn"] == ["scattergl:true", "bar:true", "box:true"], shown
    assert shown["gl"] > 0, "scattergl still draws with WebGL (figures past SVG_POINTS)"


def _demo_runs(experiment_id: str) -> list[str]:
    from radt.app.view import data

    return list(data.runs([experiment_id])["run_id"])
