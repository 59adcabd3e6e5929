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


def _lines(rendered) -> dict[str, list]:
    """The GPU util chart's lines by the run (or device) they belong to: their y values."""
    return {
        t.meta["run_id"]: list(np.asarray(t.y, dtype=float)) for t in rendered.figure.data if isinstance(t.meta, dict) and t.meta.get("metric") == "GPU util"
    }


def test_runs_that_shared_a_gpu_draw_their_own_share_in_the_gpu_util_chart_and_the_device_line_once_on_demand(store_uri, monkeypatch):
    """Two runs on node-a's GPU 0 stored the same device series (80 %): drawn as it is they hid each other. Each now draws
    its own share (30 and 50), said in the title and tooltip; 'apart' (another GPU) keeps its device line; dev=1 adds
    node-a's GPU 0 once, grey, not once per run."""
    from radt.app.view.views import View, render

    made = shared_store(store_uri, START)
    util = f"cat:{MetricName.UTILIZATION_PERCENTAGE}"
    view = {"exp": made["experiment"], "runs": [made[n] for n in ("left", "right", "old")], "metrics": [util]}
    with dashboard_reads(store_uri, monkeypatch):
        plain = render(View.from_dict(view))
        with_device = render(View.from_dict(view | {"dev": "1"}))
    lines = _lines(plain)
    assert set(lines[made["left"]]) == {SHARES["left"]} and set(lines[made["right"]]) == {SHARES["right"]}, "each run its own share"
    assert set(lines[made["old"]]) == {60.0}, "a GPU nobody shared: the device's line"
    assert plain.figure.layout.annotations[0].text.endswith("each run's own share where runs shared a GPU")
    left = next(t for t in plain.figure.data if t.meta.get("run_id") == made["left"])
    assert "own share" in left.meta["where"]
    device = [t for t in with_device.figure.data if str(t.meta.get("run_id", "")).startswith("device:")]
    assert len(device) == 1 and device[0].name == "node-a · GPU 0 (device)" and set(np.asarray(device[0].y, dtype=float)) == {DEVICE}
    entry = next(e for e in _legend(with_device) if e["id"] == "device:node-a · GPU 0 (device)")
    assert entry["stats"][0]["mean"] == pytest.approx(DEVICE) and entry["stats"][0]["last"] == pytest.approx(DEVICE), "the legend's figures"
    assert View.from_dict(view | {"dev": "1"}).to_dict()["dev"] == "1" and "dev" not in View.from_dict(view).to_dict()


def test_each_runs_own_energy_is_its_power_estimate_over_time(store_uri, monkeypatch):
    from radt.app.export.paper import comparison_table
    from radt.app.view.views import View

    made = shared_store(store_uri, START)
    with dashboard_reads(store_uri, monkeypatch):
        table = comparison_table(View([made["experiment"]], [made[n] for n in ("left", "right", "old")])).set_index("run_id")
    # one point each 10 s for 10 minutes (0..590 s) of 2 × its share in watts
    assert [table.loc[made[n], "run_energy_kj"] for n in ("left", "right")] == pytest.approx([60 * 590 / 1000, 100 * 590 / 1000])
    assert np.isnan(table.loc[made["old"], "run_energy_kj"]), "no estimate: no own energy"


def test_energy_per_step_of_runs_together_is_their_own_share_and_alone_the_gpus():
    """Two runs together on one GPU each read the whole GPU's 100 kJ: J/step from it counted the GPU twice. Together a run's
    J/step is its own energy (30 and 70 kJ over 10 steps); alone it stays the GPU's."""
    import pandas as pd

    from radt.app.summary.compare import comparison

    base = {"experiment_id": "1", "status": "FINISHED", "params": {"command": "train.py"}, "tags": {}, "letter": "", "duration_s": 600.0}
    rows = [
        base | {"run_id": "a", "run_name": "a", "workload_id": "w", "workload_label": "workload w", "start_time": 0.0},
        base | {"run_id": "b", "run_name": "b", "workload_id": "w", "workload_label": "workload w", "start_time": 0.0},
        base | {"run_id": "c", "run_name": "c", "workload_id": "ungrouped:1", "workload_label": "ungrouped", "start_time": 0.0},
    ]
    runs = pd.DataFrame(rows)
    own = {"a": 30_000.0, "b": 70_000.0, "c": 50_000.0}
    from radt.app.summary.summaries import SUMMARY_COLUMNS

    figures = {"own_steps": 10.0, "duration_s": 600.0, "energy_j": 100_000.0}
    summary = pd.DataFrame([dict.fromkeys(SUMMARY_COLUMNS, np.nan) | figures | {"run_id": r, "run_energy_j": own[r]} for r in own])
    table = comparison(runs, summary).set_index("run_id")
    assert [table.loc[r, "energy_per_step_j"] for r in ("a", "b", "c")] == pytest.approx([3_000.0, 7_000.0, 10_000.0])
    assert table.loc["a", "together"] == 2 and table.loc["c", "together"] == 1


def test_a_paper_figure_of_a_collocation_keeps_the_stacked_share_and_the_estimate_label(store_uri, monkeypatch):
    from radt.app.export.exportoptions import ExportStyle
    from radt.app.export.paper import figure_for
    from radt.app.view.views import View

    made = shared_store(store_uri, START)
    view = View.from_dict({"exp": made["experiment"], "runs": [made["left"], made["right"]], "metrics": [SHARE_SPEC, f"cat:{MetricName.RUN_POWER_WATTS}"]})
    with dashboard_reads(store_uri, monkeypatch):
        figure, _missing = figure_for(view, ExportStyle())
    stacked = [t for t in figure.data if isinstance(t.meta, dict) and t.meta.get("share")]
    assert len(stacked) == 2 and len({t.stackgroup for t in stacked}) == 1, "the stacked GPU share survives the paper style"
    titles = [a.text for a in figure.layout.annotations]
    assert any("GPU share · node-a · GPU 0" in t for t in titles) and any("Run power (estimate)" in t for t in titles), titles


def test_the_data_export_keeps_each_runs_share_series_and_says_the_power_is_an_estimate(store_uri, monkeypatch):
    import csv
    import io

    from radt.app.export.tables import data_csv
    from radt.app.view.views import View

    made = shared_store(store_uri, START)
    view = View.from_dict({"exp": made["experiment"], "runs": [made["left"], made["right"]], "metrics": [SHARE_SPEC, f"cat:{MetricName.RUN_POWER_WATTS}"]})
    with dashboard_reads(store_uri, monkeypatch):
        text, _missing = data_csv(view)
    rows = list(csv.DictReader(io.StringIO(text)))
    share = {r["run_name"]: float(r["value"]) for r in rows if r["metric"] == MetricName.RUN_SM_UTILIZATION_PERCENTAGE}
    assert share == {"left": SHARES["left"], "right": SHARES["right"]}
    assert {r["label"] for r in rows if r["metric"] == MetricName.RUN_POWER_WATTS} == {"Run power (estimate)"}
