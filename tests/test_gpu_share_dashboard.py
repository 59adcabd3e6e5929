"""The dashboard's side of each run's own GPU share (issue #55), on SQLite and the real PostgreSQL: the "GPU share" chart
Explore draws when the view shows the runs' own SM share (each run that shared a GPU stacked in its colour, with the
GPU's idle remainder), "device only" beside a run whose GPU gave no per-process figure, and the estimate's label."""

from __future__ import annotations

import numpy as np
import pytest

from radt.catalogue import METRICS, MetricName
from tests.support.shared_gpu import DEVICE, SHARES, shared_store
from tests.support.state import dashboard_reads

pytestmark = pytest.mark.dialects  # the share series read through each dialect's SQL

START = 1_760_000_000_000
SHARE_SPEC = f"cat:{MetricName.RUN_SM_UTILIZATION_PERCENTAGE}"


def _render(uri, monkeypatch, made, names, metrics=(SHARE_SPEC,), x="relative"):
    from radt.app.view.views import View, render

    with dashboard_reads(uri, monkeypatch):
        return render(View.from_dict({"exp": made["experiment"], "runs": [made[n] for n in names], "metrics": list(metrics), "x": x}))


def _share_traces(figure) -> list:
    return [t for t in figure.data if isinstance(t.meta, dict) and (t.meta.get("share") or t.meta.get("idle"))]


@pytest.mark.parametrize("device", [True, False], ids=["device-series", "no-device-series"])
def test_runs_that_shared_a_gpu_are_stacked_with_the_idle_remainder(store_uri, monkeypatch, device):
    made = shared_store(store_uri, START, device=device)
    rendered = _render(store_uri, monkeypatch, made, ["left", "right", "apart"])
    shares = [p for p in rendered.panels if p.share is not None]
    assert [(p.share.host, p.share.gpu) for p in shares] == [("node-a", 0)], "one chart: node-b's GPU 0 is another GPU"
    assert shares[0].metric.label == "GPU share · node-a · GPU 0"
    traces = _share_traces(rendered.figure)
    runs = [t for t in traces if t.meta.get("share")]
    idle = [t for t in traces if t.meta.get("idle")]
    assert [t.meta["run_id"] for t in runs] == [made["left"], made["right"]] and len(idle) == 1
    assert len({t.stackgroup for t in traces}) == 1, "the runs and the idle remainder in one stack"
    colours = {e["id"]: e["color"] for e in _legend(rendered)}
    assert [t.fillcolor for t in runs] == [colours[made["left"]], colours[made["right"]]], "each run in its Explore colour"
    for trace, name in zip(runs, ("left", "right"), strict=True):
        assert np.allclose(np.asarray(trace.y, dtype=float), SHARES[name])
    expected_idle = 100 - DEVICE if device else 100 - sum(SHARES.values())
    assert np.allclose(np.asarray(idle[0].y, dtype=float), expected_idle), "100 − the device's utilization, else 100 − the shares"


def _legend(rendered):
    from radt.app.figures.figures import legend_entries

    return legend_entries(rendered)


def test_no_share_chart_without_a_shared_gpu_or_without_the_share_metric(store_uri, monkeypatch):
    made = shared_store(store_uri, START)
    apart = _render(store_uri, monkeypatch, made, ["left", "apart"])
    assert not [p for p in apart.panels if p.share is not None], "different hosts share no GPU"
    other = _render(store_uri, monkeypatch, made, ["left", "right"], metrics=(f"cat:{MetricName.UTILIZATION_PERCENTAGE}",))
    assert not _share_traces(other.figure), "drawn only when the view shows the runs' own SM share"
    stepped = _render(store_uri, monkeypatch, made, ["left", "right"], x="step")
    assert not _share_traces(stepped.figure), "no time to stack on the step axis"


def test_a_run_without_per_process_figures_says_device_only(store_uri, monkeypatch):
    made = shared_store(store_uri, START)
    rendered = _render(store_uri, monkeypatch, made, ["left", "old"], metrics=(f"cat:{MetricName.UTILIZATION_PERCENTAGE}",))
    names = {e["id"]: e["name"] for e in _legend(rendered)}
    assert names[made["old"]] == "old (device only)" and names[made["left"]] == "left"


def test_the_run_power_chart_says_estimate(store_uri, monkeypatch):
    from radt.app.figures.figures import unit_label

    assert METRICS[MetricName.RUN_POWER_WATTS].label == "Run power (estimate)"
    made = shared_store(store_uri, START)
    rendered = _render(store_uri, monkeypatch, made, ["left", "right"], metrics=(f"cat:{MetricName.RUN_POWER_WATTS}",))
    assert unit_label(rendered.panels[0].metric) == "Run power (estimate) (W)"
    assert [a.text for a in rendered.figure.layout.annotations][0] == "Run power (estimate) (W)"
    assert {t.meta["metric"] for t in rendered.figure.data if isinstance(t.meta, dict) and "metric" in t.meta} == {"Run power (estimate)"}


def test_the_summary_table_offers_the_runs_own_sm_share_and_the_filter_reads_it(store_uri, monkeypatch):
    from radt.app.export.paper import comparison_table
    from radt.app.view import data, filters
    from radt.app.view.views import View
    from radt.pages.parts.summary_table import COLUMNS, present

    made = shared_store(store_uri, START)
    names = ("left", "right", "apart", "old")
    with dashboard_reads(store_uri, monkeypatch):
        table = comparison_table(View([made["experiment"]], [made[n] for n in names])).set_index("run_id")
        runs = data.runs([made["experiment"]])
        kept = {runs.set_index("run_id").loc[r, "run_name"] for r in filters.apply(runs, "share.sm > 40")["run_id"]}
        percent = set(filters.apply(runs, "share.sm < 40%")["run_id"])
    assert [table.loc[made[n], "run_sm_share"] for n in ("left", "right", "apart")] == pytest.approx([30.0, 50.0, 70.0])
    assert np.isnan(table.loc[made["old"], "run_sm_share"]), "no per-process figure: no share (device only)"
    assert kept == {"right", "apart"} and percent == {made["left"]}, "a run without a share passes no share.sm test"
    column = next(c for c in COLUMNS if c.id == "run_sm_share")
    assert column in present(COLUMNS) and not column.shown, "offered by the columns control, not in the default set (1440 px)"
