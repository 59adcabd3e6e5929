"""The explore view's 8 default charts exported at a single column (3.5 in, issue 52 item 6): every chart's y tick labels
stand apart however short its row, the figure ends where its last axis and legend end, and the PDF is the figure at its
size (kaleido printed it shrunk by 5 % inside 0.1 in margins: 0.6 in of blank under a 9 in figure).

Images are drawn by kaleido in Debian's real Chromium, as a user's export is.
"""

from __future__ import annotations

import io
import math
import re

import numpy as np
import pytest
from PIL import Image

from radt.app.db.runs import list_experiments
from radt.app.db.state import STATE
from radt.app.export.exportoptions import ExportError, ExportStyle
from radt.app.export.image import image_bytes
from radt.app.export.paper import figure_for
from radt.app.export.restyle import CSS_DPI
from radt.app.exportcli import _open_store
from radt.app.view import data
from radt.app.view.data import DEFAULT_METRICS
from radt.app.view.views import View
from tests.support.stores import write_default_demo

TICK_GAP_FONTS = 2.5  # tick labels closer than this many font sizes touch ("40k" over "30k" at 9 px in a 43 px chart)
DPI = 300
END_BLANK_IN = 0.125  # under a legend's last line, its row's and box's own padding (0.1 in at 9 pt); 0.24 in had been left


@pytest.fixture
def demo_view(snapshots, empty_sqlite, tmp_path) -> View:
    """`radt demo` at its default length; the explore page's default charts of its collocation experiment (7 runs, some
    on MIG slices: the devices' key is drawn under the charts)."""
    uri = empty_sqlite(tmp_path / "demo.db")
    snapshots.restore(write_default_demo, uri)
    _open_store(uri)
    (experiment,) = [str(e["experiment_id"]) for e in list_experiments(STATE.engine) if str(e["name"]) == "demo: resnet50 collocation"]
    return View([experiment], list(data.runs([experiment])["run_id"]), list(DEFAULT_METRICS))


def _tick_gaps(figure) -> dict[str, tuple[int, float, float]]:
    """Per y axis: how many tick labels it draws, their spacing in px and the chart's height in px, from the axis's range
    and tick step as Plotly lays them out (its full figure) and the chart's share of the plot area."""
    full = figure.full_figure_for_development(warn=False).layout
    plot_px = full.height - full.margin.t - full.margin.b
    gaps = {}
    for name in [k for k in full.to_plotly_json() if k.startswith("yaxis")]:
        axis = full[name]
        low, high = sorted(axis.range)
        step, first = float(axis.dtick), float(axis.tick0 or 0)
        count = math.floor((high - first) / step + 1e-9) - math.ceil((low - first) / step - 1e-9) + 1
        height = (axis.domain[1] - axis.domain[0]) * plot_px
        gaps[name] = (count, step / (high - low) * height, height)
    return gaps


def _blank_at_the_end(png: bytes) -> int:
    """Rows of white pixels at the bottom of a PNG."""
    pixels = np.asarray(Image.open(io.BytesIO(png)).convert("L"))
    inked = np.flatnonzero((pixels < 250).any(axis=1))
    return pixels.shape[0] - 1 - int(inked[-1])


@pytest.mark.parametrize(("legend", "font", "height"), [("top", 9.0, None), ("none", 9.0, None), ("bottom", 9.0, 12.0), ("right", 6.0, 6.0)])
def test_every_chart_of_eight_at_a_single_column_keeps_its_tick_labels_apart(demo_view, legend, font, height):
    """GPU memory drew 5 tick labels (0 to 40k) 9 px apart in a 43 px chart, at 9 px text: they touched."""
    figure, _missing = figure_for(demo_view, ExportStyle(size="single-column", legend=legend, font_size=font, height=height))
    gaps = _tick_gaps(figure)
    assert len(gaps) == 8 and figure.layout.width == round(3.5 * CSS_DPI)
    crammed = [
        f"{name}: {count} tick labels {gap:.1f} px apart in a {chart_px:.0f} px chart"
        for name, (count, gap, chart_px) in sorted(gaps.items(), key=lambda item: item[1][1])
        if count < 2 or gap < TICK_GAP_FONTS * font - 0.01
    ]
    assert not crammed, f"at {font:g} px text: " + "; ".join(crammed)


@pytest.mark.parametrize(("legend", "monochrome"), [("top", False), ("bottom", False), ("right", False), ("none", True)])
def test_an_eight_chart_single_column_export_ends_where_its_last_axis_and_legends_end(demo_view, legend, monochrome):
    """The figure's bottom is its last axis's margin: the tick labels, the axis title, the devices' key and a bottom legend,
    nothing under them (0.24 in of blank at 300 DPI, where the legends' room was reserved deeper than Plotly draws them)."""
    figure, _missing = figure_for(demo_view, ExportStyle(size="single-column", legend=legend, monochrome=monochrome))
    lowest = min(figure.layout[name].domain[0] for name in figure.layout.to_plotly_json() if name.startswith("yaxis"))
    assert lowest * (figure.layout.height - figure.layout.margin.t - figure.layout.margin.b) + figure.layout.margin.b == pytest.approx(
        figure.layout.margin.b
    ), "the last chart stands on the bottom margin"
    svg = image_bytes(figure, "svg", DPI).decode()
    boxes = re.findall(r'<g class="legend2?" [^>]*translate\([\d.]+,([\d.]+)\)"><rect class="bg"[^>]*height="([\d.]+)"', svg)
    lowest_box = max(float(top) + float(height) for top, height in boxes) if boxes else None
    if legend in ("top", "bottom", "right") and not monochrome:  # the devices' key under the charts, the runs' legend under it
        assert lowest_box == pytest.approx(figure.layout.height, abs=1.0), "the lowest legend ends at the figure's bottom"
    blank = _blank_at_the_end(image_bytes(figure, "png", DPI))
    assert blank <= END_BLANK_IN * DPI, f"{blank / DPI:.2f} in of blank at the end of a {figure.layout.height / CSS_DPI:g} in figure"


def test_the_pdf_is_the_figure_at_its_size_not_shrunk_into_margins(demo_view):
    """kaleido prints a PDF with Chromium's 0.1 in margins on a page of the figure's size: the 3.5 × 9 in figure came out
    at 94.6 % (9 pt text as 8.5 pt) in the page's top left, 0.39 in of blank under it, 0.6 in with its own."""
    from pypdf import PdfReader

    figure, _missing = figure_for(demo_view, ExportStyle(size="single-column", legend="top"))
    page = PdfReader(io.BytesIO(image_bytes(figure, "pdf", DPI))).pages[0]
    assert (float(page.mediabox.width), float(page.mediabox.height)) == pytest.approx((3.5 * 72, 9 * 72), abs=0.01)
    ctm = [1.0, 0.0, 0.0, 1.0, 0.0, 0.0]
    stack = []
    for operands, operator in page.get_contents().operations:
        if operator == b"q":
            stack.append(ctm)
        elif operator == b"Q":
            ctm = stack.pop()
        elif operator == b"cm":
            a, b, c, d, e, f = (float(x) for x in operands)
            ctm = [a * ctm[0] + b * ctm[2], a * ctm[1] + b * ctm[3], c * ctm[0] + d * ctm[2], c * ctm[1] + d * ctm[3],
                   e * ctm[0] + f * ctm[2] + ctm[4], e * ctm[1] + f * ctm[3] + ctm[5]]  # fmt: skip
        elif operator == b"re" and [float(x) for x in operands] == [0, 0, figure.layout.width, figure.layout.height]:
            break  # the figure's own background: where it lands is where the figure is
    else:
        pytest.fail("no rectangle of the figure's size in the PDF")
    x, y, w, h = (float(v) for v in operands)
    corners = [(ctm[0] * px + ctm[2] * py + ctm[4], ctm[1] * px + ctm[3] * py + ctm[5]) for px, py in ((x, y), (x + w, y + h))]
    left, right = sorted(c[0] for c in corners)
    bottom, top = sorted(c[1] for c in corners)
    assert (left, bottom, right, top) == pytest.approx((0, 0, 3.5 * 72, 9 * 72), abs=0.5), "the figure fills its page at 72 pt an inch"


def test_rows_too_short_for_two_tick_labels_are_refused_with_a_height_that_holds_them(demo_view):
    """8 charts in 5 in at 12 px text left 3 to 15 px a chart (Chromium failed "Something went wrong with axis scaling" with
    a bottom legend, drew 5 overlapping labels without): refused, naming a height; that height draws every chart readable."""
    style = ExportStyle(size="single-column", legend="bottom", font_size=12.0, height=5.0)
    with pytest.raises(ExportError, match=r"--height \d") as refused:
        figure_for(demo_view, style)
    message = str(refused.value)
    assert "\n" not in message and "8 charts" in message and "--font-size" in message, message
    taller = float(re.search(r"--height (\d+(?:\.\d+)?)", message).group(1))
    assert 5.0 < taller <= 30.0
    figure, _missing = figure_for(demo_view, ExportStyle(size="single-column", legend="bottom", font_size=12.0, height=taller))
    assert all(count >= 2 and gap >= TICK_GAP_FONTS * 12 - 0.01 for count, gap, _px in _tick_gaps(figure).values())
