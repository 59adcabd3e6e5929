"""Export from the dashboard in real headless Chromium: a saved view gives `radt export` the same figure,
the PNG download is a real PNG at the chosen DPI, and "open view" brings the saved view back. The store and the
dashboard are conftest.py's filled_store and served, shared with tests/test_explore_browser.py."""

from __future__ import annotations

import csv
import io
import json
import struct

from mlflow import MlflowClient

from radt.app.exportcli import _open_store
from radt.app.exportcli import main as export_main
from radt.app.view.views import load_view, render
from tests.support.browser import drawn_traces, screenshot, wait_for_traces
from tests.support.stores import RESNET

METRICS = "cat:sm_active,cat:power_usage_watts"


def _two_runs(uri: str) -> tuple[str, list[str], list[str]]:
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(RESNET).experiment_id
    runs = client.search_runs([experiment], filter_string="tags.`radt.role` = 'run'", order_by=["attributes.run_name ASC"])[:2]
    return experiment, [r.info.run_id for r in runs], [f"{r.info.run_name} · GPU 0" for r in runs]  # the demo's runs used GPU 0


def test_saved_view_exports_the_same_figure_and_opens_again(page, served, filled_store, tmp_path):
    uri = filled_store["uri"]
    experiment, run_ids, names = _two_runs(uri)
    page.goto(f"{served}?exp={experiment}&runs={','.join(run_ids)}&metrics={METRICS}&x=relative&mode=runs&smooth=0&log=0")
    shown = {t["name"]: t["n"] for t in wait_for_traces(page, set(names))}
    page.get_by_text("Export", exact=True).click()

    with page.expect_download() as saved:
        page.get_by_role("button", name="save view").click()
    view_file = tmp_path / "view.json"
    saved.value.save_as(view_file)
    raw = json.loads(view_file.read_text())
    assert raw["radt_view"] == 1 and raw["runs"].split(",") == run_ids and raw["metrics"] == METRICS

    _open_store(uri)
    rendered = render(load_view(view_file))
    named = lambda t: t.meta["name"] + (f" · {t.meta['device']}" if t.meta.get("device") else "")  # noqa: E731  # as TRACES_JS names them
    first_chart = {named(t): len(t.x) for t in rendered.figure.data if (t.yaxis or "y") == "y" and not t.meta.get("band")}
    assert first_chart == shown, "the saved view draws the same traces with the same points as the browser"

    page.fill("#export-dpi", "150")
    with page.expect_download(timeout=60_000) as png:
        page.get_by_role("button", name="PNG").click()
    data = (tmp_path / "fig.png").read_bytes() if png.value.save_as(tmp_path / "fig.png") is None else b""
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", data[16:24])[0] == 7 * 150, "double column, 7 in at 150 dpi"
    page.wait_for_function("() => document.querySelector('#export-status').textContent.startsWith('PNG exported')")
    screenshot(page, f"export-panel-{filled_store['kind']}")

    page.locator("#export-charts label", has_text="Power").locator("input").uncheck()  # "which charts"
    with page.expect_download(timeout=60_000) as svg:
        page.get_by_role("button", name="SVG").click()
    svg.value.save_as(tmp_path / "fig.svg")
    text = (tmp_path / "fig.svg").read_text()
    assert ">SMACT<" in text and "Power" not in text, "only the ticked chart is exported"

    out = tmp_path / "data.csv"
    assert export_main(["--view", str(view_file), "--store", uri, "-o", str(out)]) == 0
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    assert {r["run_id"] for r in rows} == set(run_ids) and {r["metric"] for r in rows} == {"sm_active", "power_usage_watts"}

    page.goto(served)  # a fresh page with nothing picked, then "open view" with the saved file
    page.get_by_text("Export", exact=True).click()
    with page.expect_file_chooser() as chooser:
        page.get_by_role("button", name="open view").click()
    chooser.value.set_files(str(view_file))
    page.wait_for_url(lambda url: run_ids[0] in url)
    assert {t["name"]: t["n"] for t in wait_for_traces(page, set(names))} == shown
    assert len(drawn_traces(page, "y2")) == 2, "the second chart of the view (power) is back too"


def test_the_comparison_figure_and_a_page_high_figure_from_the_panel(page, served, filled_store, tmp_path):
    """The panel's height field sets the PDF's height in inches; "comparison PDF" exports the comparison section's figure, titled by it."""
    from pypdf import PdfReader

    experiment, run_ids, names = _two_runs(filled_store["uri"])
    page.goto(f"{served}?exp={experiment}&runs={','.join(run_ids)}&metrics={METRICS}&x=relative&mode=runs&smooth=0&log=0")
    wait_for_traces(page, set(names))
    page.get_by_text("Export", exact=True).click()
    gaps = page.evaluate(
        """() => Array.from(document.querySelectorAll('.export-options input[type=radio]')).map(r => {
          const label = r.closest('label').getBoundingClientRect(), box = r.getBoundingClientRect();
          return [r.value, Math.round(box.width), Math.round(label.width)]; })"""
    )
    assert len(gaps) == 2 and all(width <= 20 for _value, width, _label in gaps), ("'colour' and 'monochrome' sat 90 px right of their radios", gaps)
    page.fill("#export-height", "4")
    with page.expect_download(timeout=60_000) as pdf:
        page.get_by_role("button", name="PDF", exact=True).click()
    pdf.value.save_as(tmp_path / "fig.pdf")
    document = PdfReader(tmp_path / "fig.pdf")
    assert float(document.pages[0].mediabox.height) == 4 * 72 and document.metadata["/Title"].startswith("SMACT, Power · 2 runs: ")

    page.locator("#compare-by label", has_text="collocation").locator("input").check()
    page.wait_for_function(
        "() => { const g = document.querySelector('#compare-figure .js-plotly-plot'); return g && g.data.length && g.data[0].type === 'bar'; }"
    )
    with page.expect_download(timeout=60_000) as comparison:
        page.get_by_role("button", name="comparison PDF").click()
    comparison.value.save_as(tmp_path / "bar.pdf")
    assert PdfReader(tmp_path / "bar.pdf").metadata["/Title"].startswith("mean SMACT by collocation (bar) · 2 runs")
