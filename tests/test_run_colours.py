"""A run's colour is its place in the view: the view keeps its runs in the order they were added (the link keeps it), and
colours them in that order, so adding runs never changes the colour of a run already shown, on the page and in exports;
no two runs of a view get near-twin colours while the palette has distinct ones left (issue #52, item 1).

Colour differences are CIEDE2000 (coloraide): under about 10 two thin lines are easily taken for one."""

from __future__ import annotations

import hashlib
import itertools

import pandas as pd
import pytest
from coloraide import Color

from radt.app.db.runs import list_experiments
from radt.app.db.state import STATE
from radt.app.export.exportoptions import ExportStyle
from radt.app.export.paper import figure_for
from radt.app.exportcli import _open_store
from radt.app.figures.figures import legend_entries
from radt.app.figures.palette import PALETTE, colors, run_colors
from radt.app.view import data
from radt.app.view.views import View, in_added_order, render
from tests.support.stores import write_default_demo

NEAR_TWIN = 15.0  # CIEDE2000 below this is a near twin (Tableau 10's own closest pair, red and brown, is 16.2)


def _sweep(n: int) -> pd.DataFrame:
    """N runs as runs.list_runs gives them, each added one started earlier than those before it (a sweep ticked newest first)."""
    ids = [hashlib.md5(f"run {i}".encode()).hexdigest() for i in range(n)]
    return pd.DataFrame({"run_id": ids, "start_time": [1_760_000_000_000 - i * 60_000 for i in range(n)]})


def _difference(a: str, b: str) -> float:
    return Color(a).delta_e(Color(b), method="2000")


def test_adding_runs_never_changes_the_colour_of_a_run_already_shown():
    sweep = _sweep(25)
    shown: dict[str, str] = {}
    for n in range(1, len(sweep) + 1):
        now = run_colors(sweep.iloc[:n])
        assert {r: now[r] for r in shown} == shown, f"adding run {n} changed the colour of a run already shown"
        shown = now
    assert list(shown.values())[:20] == list(PALETTE), "the view's first run gets the palette's first colour, and so on"


@pytest.mark.parametrize("runs", [3, 10, 13, 20])
def test_a_view_of_up_to_twenty_runs_has_no_near_twin_colours(runs):
    shown = list(run_colors(_sweep(runs)).values())
    assert len(set(shown)) == runs
    closest = min((_difference(a, b), a, b) for a, b in itertools.combinations(shown, 2))
    assert closest[0] >= NEAR_TWIN, f"{closest[1]} and {closest[2]} are near twins (CIEDE2000 {closest[0]:.1f})"


def test_the_palette_has_no_near_twins_and_no_colour_too_pale_for_a_thin_line_on_white():
    closest = min((_difference(a, b), a, b) for a, b in itertools.combinations(PALETTE, 2))
    assert closest[0] >= NEAR_TWIN, closest
    lightness = {c: Color(c).convert("lch").get("lightness") for c in PALETTE}
    assert all(25 <= value <= 75 for value in lightness.values()), lightness


def test_a_run_keeps_its_colour_while_others_come_and_go_on_a_page_that_remembers_them():
    """Live keeps its cards' colours while the page is open: a card that stays keeps its colour, a new run takes a free one."""
    first = colors(["a", "b", "c"])
    later = colors(["b", "c", "d"], kept=first)
    assert (later["b"], later["c"]) == (first["b"], first["c"])
    assert later["d"] not in (later["b"], later["c"]), "a new run never takes a colour in use"
    assert colors(["x", "y"], kept={"zz": PALETTE[0]}) == {"x": PALETTE[1], "y": PALETTE[2]}, "nor one the page still shows"


def test_a_view_keeps_its_runs_in_the_order_they_were_added():
    """The picker's boxes list runs in the tree's order; the view keeps the order they were ticked in, newly ticked last."""
    assert in_added_order(["c", "a"], ["a", "b", "c", "d"]) == ["c", "a", "b", "d"]
    assert in_added_order(["c", "a", "x"], ["a", "c"]) == ["c", "a"], "an unticked run leaves the view"
    assert in_added_order([], ["b", "a"]) == ["b", "a"]
    assert View.from_dict({"runs": "c9,a1,b5"}).to_dict()["runs"] == "c9,a1,b5", "the link keeps the order"


@pytest.fixture
def demo_store(snapshots, empty_sqlite, tmp_path) -> dict:
    """`radt demo` at its default length in a store of the test's own: experiment ids and its 10 runs, newest first."""
    uri = empty_sqlite(tmp_path / "demo.db")
    snapshots.restore(write_default_demo, uri)
    _open_store(uri)
    experiments = [str(e["experiment_id"]) for e in list_experiments(STATE.engine) if str(e["name"]).startswith("demo: ")]
    runs = data.runs(experiments).sort_values("start_time", ascending=False)
    return {"uri": uri, "experiments": experiments, "runs": runs}


def _line_colours(figure) -> dict[str, str]:
    """run_id -> the colour of its lines (not its envelope), each run once, checking a run has one colour in every chart."""
    out: dict[str, str] = {}
    for trace in figure.data:
        meta = trace.meta if isinstance(trace.meta, dict) else {}
        if meta.get("run_id") and not meta.get("band"):
            assert out.setdefault(meta["run_id"], trace.line.color) == trace.line.color, meta
    return out


def test_every_figure_of_a_view_and_its_export_colour_the_runs_in_the_views_order(demo_store):
    """Charts, the legend and `radt export`'s figure: the view's i-th run in PALETTE[i], whatever the runs' ids or start
    times; a view that begins with the same three runs gives them the same colours."""
    ids = list(demo_store["runs"]["run_id"])
    assert len(ids) == 10
    wanted = {run_id: PALETTE[i] for i, run_id in enumerate(ids)}
    view = View(demo_store["experiments"], ids, ["cat:sm_active", "cat:power_usage_watts"])
    rendered = render(view)
    assert _line_colours(rendered.figure) == wanted
    assert [(e["id"], e["color"]) for e in legend_entries(rendered)] == list(wanted.items()), "the legend lists the runs in the view's order"
    printed, _missing = figure_for(view, ExportStyle(size="double-column"))
    assert _line_colours(printed) == wanted, "radt export and the export panel colour them as the page does"
    starved = demo_store["runs"].loc[demo_store["runs"]["run_name"] == "bert-base 1A", "run_id"].iloc[0]
    for figure in (rendered.figure, printed):  # issue #52 item 3: at the export's 20,000-point budget too
        assert any((t.meta or {}).get("run_id") == starved and t.meta.get("band") for t in figure.data), "the starved run is its mean in an envelope"

    three = render(View(demo_store["experiments"], ids[:3], ["cat:sm_active"]))
    assert _line_colours(three.figure) == {r: wanted[r] for r in ids[:3]}
    backwards = render(View(demo_store["experiments"], ids[::-1], ["cat:sm_active"]))
    assert _line_colours(backwards.figure) == {run_id: PALETTE[i] for i, run_id in enumerate(ids[::-1])}
