"""The diagnosis in the dashboard, on SQLite and the real PostgreSQL (issue #54): the summary table's and `radt export
--table`'s diagnosis and footprint columns, the Cluster page's jobs ranked by idle GPU-hours and counted by finding, a
drawn run's findings under Explore's charts with the zoom to each one's span, and a running run's findings over its last
minutes on the Live page. The tags come from radt's own path: series written by radt's writer (rollups kept), then
`radt diagnose`'s diagnose_and_store."""

from __future__ import annotations

import csv
import io

import pytest
from mlflow import MlflowClient

from radt import settings
from radt.catalogue import MetricName
from radt.collectors.store import tracking
from radt.collectors.store.stores import SqlMetricStore
from tests.support.diagnosed import MINUTE, import_jobs, views_store, write_series
from tests.support.runs import radt_run
from tests.support.state import dashboard_reads

pytestmark = pytest.mark.dialects  # the tags and rollups read through each dialect's SQL

START = 1_760_000_000_000


def test_the_summary_table_and_the_exported_table_carry_the_diagnosis_and_the_footprint(store_uri, monkeypatch, tmp_path):
    from radt.app.export.paper import comparison_table
    from radt.app.exportcli import main as export_main
    from radt.app.view.views import View
    from radt.pages.parts.summary_table import COLUMNS, present, table_rows

    made = views_store(store_uri, START)
    runs = [made["pair"], made["busy"], made["plain"]]
    with dashboard_reads(store_uri, monkeypatch):
        table = comparison_table(View([made["experiment"]], runs)).set_index("run_id")
        shown = {row["run_id"]: row for row in table_rows(comparison_table(View([made["experiment"]], runs)))}
    assert table.loc[made["pair"], "diagnosis"] == "idle_gpus,throttled", "the codes, in the catalogue's order"
    assert [table.loc[made[n], "diagnosis"] for n in ("busy", "plain")] == ["none", ""], "diagnosed and clean; never diagnosed"
    assert shown[made["pair"]]["diagnosis"] == "idle gpus, throttled" and shown[made["plain"]]["diagnosis"] is None, "the screen says them in words"
    assert "diagnosis" in [c.id for c in present(COLUMNS)], "offered by the table's columns control"
    # the footprint: 2 GPUs × 0.5 h held, GPU 1 idle throughout; (300 + 60) W × 30 min = 0.18 kWh; cost at the price per GPU-hour
    pair = table.loc[made["pair"]]
    assert pair["idle_gpu_hours"] == pytest.approx(0.5, rel=1e-3) and pair["energy_kwh"] == pytest.approx(0.18, rel=1e-3)
    assert pair["co2_kg"] == pytest.approx(0.18 * settings.PUE.get() * settings.GRID_INTENSITY.get() / 1000, rel=1e-3)
    assert pair["cost"] == pytest.approx(1.0 * settings.GPU_HOUR_PRICE.get(), rel=1e-3)
    assert (
        pair["footprint_basis"]
        == f"{settings.GRID_INTENSITY.get():g} gCO2eq/kWh, PUE {settings.PUE.get():g}, {settings.GPU_HOUR_PRICE.get():g} {settings.CURRENCY.get()} per GPU-hour"
    )

    out = tmp_path / "table.csv"
    assert export_main(["--experiment", "diagnosis", "--table", "--store", store_uri, "-o", str(out)]) == 0
    exported = {r["run"]: r for r in csv.DictReader(io.StringIO(out.read_text()))}
    assert exported["pair"]["diagnosis"] == "idle_gpus,throttled" and exported["busy"]["diagnosis"] == "none" and exported["plain"]["diagnosis"] == ""
    assert float(exported["pair"]["energy_kwh"]) == pytest.approx(0.18, rel=1e-3) and float(exported["pair"]["idle_gpu_hours"]) == pytest.approx(0.5, rel=1e-3)
    assert exported["plain"]["cost"] == "" and exported["pair"]["footprint_basis"] == pair["footprint_basis"]


def test_a_drawn_runs_findings_say_their_sentences_what_it_lacked_and_its_footprint(store_uri, monkeypatch):
    from radt.app.view import data
    from radt.pages.parts.findings import panel

    made = views_store(store_uri, START)
    with dashboard_reads(store_uri, monkeypatch):
        listed = data.runs([made["experiment"]]).set_index("run_id")
        runs = listed.loc[[made["pair"], made["busy"], made["plain"]]].reset_index()
        tags = listed.loc[made["pair"], "tags"]
        text = [str(part) for part in panel(runs)]
    pair, busy, plain = text
    assert "pair: idle gpus, throttled" in pair and tags["radt.diagnosis.idle_gpus"] in pair and tags["radt.diagnosis.throttled"] in pair
    assert pair.count("className='finding-zoom'") == 2, "a zoom button for each finding with a span"
    assert pair.count("Not judged") == 1 and "hardware_errors" in pair, "the metrics it lacked, said once"
    assert "0.18 kWh" in pair and "0.50 of 1.00 GPU-hours idle" in pair
    assert f"({tags['radt.footprint.basis']})" in pair, "the footprint with the factors it used"
    assert "busy: nothing found" in busy and "finding-zoom" not in busy
    assert f"Not diagnosed yet: radt diagnose {made['plain']}" in plain


def test_a_findings_zoom_is_its_span_on_the_charts_axis():
    from radt.app.view.views import View, span_zoom, x_range

    span = (START + 10 * MINUTE, START + 20 * MINUTE)
    assert span_zoom(span, START, "relative", "runs") == ("relative", "10,20"), "minutes since the run's start"
    assert span_zoom(span, START - 90_000, "relative", "grouped") == ("relative", "11.5,21.5")
    assert span_zoom(span, START, "step", "runs") == ("relative", "10,20"), "no time maps onto steps: time since start"
    x, wall = span_zoom(span, START, "wall", "runs")
    view = View.from_dict({"runs": "a" * 32, "x": x, "xr": wall})
    assert not view.notes and [t.value // 1_000_000 for t in x_range(view)] == list(span), "UTC times the view reads back as the span"
    assert span_zoom(span, START, "wall", "grouped") == ("wall", "10,20"), "a grouped view draws the wall clock as time since start"


SACCT = (  # four jobs as sacct --parsable2 prints them: 4 GPUs for 2 h (3 idle), 1 busy GPU for 1 h, no GPU, 2 GPUs for 1 h (1 idle)
    "101|101|train-big|alice|proj|gpu|2026-11-20T10:00:00|2026-11-20T10:00:05|2026-11-20T12:00:05|COMPLETED|0:0|gpu01|"
    "billing=1,cpu=8,gres/gpu=4,node=1|radt-gres=gpu01>gpu:4(IDX:0-3)\n"
    "102|102|train-small|bob|other|gpu|2026-11-20T10:00:00|2026-11-20T10:00:05|2026-11-20T11:00:05|COMPLETED|0:0|gpu02|"
    "billing=1,cpu=8,gres/gpu=1,node=1|radt-gres=gpu02>gpu:1(IDX:2)\n"
    "103|103|prep|alice|proj|cpu|2026-11-20T10:00:00|2026-11-20T10:00:05|2026-11-20T10:30:05|FAILED|2:0|cpu07|billing=1,cpu=8,node=1|\n"
    "104|104|sweep|carol|proj|gpu|2026-11-20T10:00:00|2026-11-20T10:00:05|2026-11-20T11:00:05|COMPLETED|0:0|gpu03|"
    "billing=1,cpu=8,gres/gpu=2,node=1|radt-gres=gpu03>gpu:2(IDX:0-1)\n"
)
BUSY = {"101": [0], "102": [2], "104": [0]}  # per job its busy GPUs; its other GPUs stay idle
GPUS = {"101": [0, 1, 2, 3], "102": [2], "104": [0, 1]}


def test_the_clusters_jobs_rank_by_idle_gpu_hours_and_count_by_finding(store_uri):
    from radt.app.db import jobs
    from radt.app.db.store import make_read_engine

    runs = import_jobs(store_uri, SACCT, GPUS, BUSY)
    engine = make_read_engine(store_uri)
    rows = jobs.job_rows(engine)
    assert [r["job"] for r in rows] == ["101", "104", "102", "103"], "3 × 2 h idle, then 1 × 1 h, then none; the job without a diagnosis last"
    by_job = {r["job"]: r for r in rows}
    assert by_job["101"]["idle_gpu_hours"] == pytest.approx(6.0, rel=1e-3) and by_job["101"]["gpu_hours"] == pytest.approx(8.0, rel=1e-3)
    assert by_job["102"]["idle_gpu_hours"] == 0 and by_job["102"]["codes"] == [] and by_job["102"]["diagnosed"]
    assert by_job["103"]["idle_gpu_hours"] is None and not by_job["103"]["diagnosed"] and by_job["103"]["no_series"] == "the job had no GPU"
    assert by_job["104"]["codes"] == ["idle_gpus"]

    assert jobs.finding_counts(rows) == [("idle_gpus", 2)]
    assert [r["job"] for r in jobs.narrow(rows, {jobs.FINDING: "idle_gpus"})] == ["101", "104"], "narrowed to one finding, the order kept"
    assert [r["job"] for r in jobs.narrow(rows, {jobs.FINDING: "idle_gpus", "user": "carol"})] == ["104"]
    assert jobs.narrow(rows, {jobs.FINDING: "throttled"}) == []

    by_user = jobs.totals(rows, "user")
    assert [(g["name"], g["jobs"], g["ranked"], g["gpus_unknown"]) for g in by_user] == [("alice", 2, 1, 0), ("carol", 1, 1, 0), ("bob", 1, 1, 0)]
    assert [g["idle_gpu_hours"] for g in by_user] == pytest.approx([6.0, 1.0, 0.0], rel=1e-3)
    assert by_user[0]["idle_share"] == pytest.approx(0.75, rel=1e-3) and by_user[1]["idle_share"] == pytest.approx(0.5, rel=1e-3)
    assert [g["name"] for g in jobs.totals(rows, "account")] == ["proj", "other"], "proj: 7 idle GPU-hours; other: none"
    price = settings.GPU_HOUR_PRICE.get()
    assert [g["cost"] for g in by_user] == pytest.approx([8 * price, 2 * price, 1 * price], rel=1e-3), "cost per user: its jobs' GPU-hours × the price"

    sentences = jobs.finding_sentences(engine, [runs["101"], runs["102"]])
    assert set(sentences) == {runs["101"]} and sentences[runs["101"]]["idle_gpus"].startswith("3 of 4 GPUs idle")
    engine.dispose()


def test_a_running_runs_findings_are_over_its_last_minutes(store_uri):
    """A run whose second GPU sat idle for its first 10 minutes and worked since: idle over the whole run (the share is
    half), not over the last five minutes; the run beside it went idle 3 minutes ago, which the window sees at once."""
    from radt.app.db import live
    from radt.app.db.store import make_read_engine

    now = START + 20 * MINUTE
    client = MlflowClient(store_uri)
    experiment = tracking.resolve_experiment(client, store_uri, "live diagnosis")
    recovered = radt_run(client, experiment, "recovered", start_time=START)
    stalled = radt_run(client, experiment, "stalled", start_time=START)
    writer = SqlMetricStore(store_uri)
    for run_id in (recovered, stalled):
        write_series(writer, run_id, MetricName.SM_ACTIVE, 0, START, 20, lambda m: 0.8)
    write_series(writer, recovered, MetricName.SM_ACTIVE, 1, START, 20, lambda m: 0.0 if m < 10 else 0.8)
    write_series(writer, stalled, MetricName.SM_ACTIVE, 1, START, 20, lambda m: 0.8 if m < 17 else 0.0)
    writer.close()
    engine = make_read_engine(store_uri)
    found = live.recent_diagnoses(engine, [recovered, stalled], now)
    whole = live.recent_diagnoses(engine, [recovered], now, window_ms=20 * MINUTE)
    engine.dispose()
    assert whole[recovered].codes == ["idle_gpus"], "over the whole run GPU 1 was idle half the time"
    assert found[recovered].codes == [], "over the last 5 minutes both GPUs work"
    assert found[stalled].codes == ["idle_gpus"] and "GPU 1 60%" in found[stalled].findings[0].sentence, "3 of the window's 5 minutes idle"
    assert found[stalled].findings[0].span == (now - live.findings_window_ms(), now), "the finding covers the window, not the run"


def test_a_new_store_gives_a_running_run_no_finding_rather_than_an_error(store_uri):
    """The dashboard reads through a read-only engine; a store no point has reached yet has no rollup tables, which the
    evidence's reader makes as a chart's read does (the Live page's tick raised, and no card got a point)."""
    from radt.app.db import live
    from radt.app.db.store import make_read_engine

    client = MlflowClient(store_uri)
    run_id = radt_run(client, tracking.resolve_experiment(client, store_uri, "cold"), "cold start", start_time=START)
    engine = make_read_engine(store_uri)
    found = live.recent_diagnoses(engine, [run_id], START + MINUTE)
    engine.dispose()
    assert found[run_id].findings == [] and found[run_id].lacking == []
