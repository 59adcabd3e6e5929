"""The comparison figures (app/aggregates.py) on a known store, SQLite and PostgreSQL: every bar, box and CDF point
against the comparison table and a hand computation; the GRACT vs SMACT vs SMOCC view of the recorded microbenchmark.

One experiment, one command, four workloads of two runs each (SMACT constant per run, 10 steps, energy from a counter):
- alone: two runs one after another, 1 h each;
- timeslice: two overlapping runs on one GPU (collocation "-");
- mps: two overlapping runs under MPS;
- mig: two overlapping runs in MIG 3g.40gb instances.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from mlflow import MlflowClient

from radt.app.aggregates import activity_figure, bar_figure, box_figure, cdf_figure, groups
from radt.app.export import ExportError, activity_series, comparison_table
from radt.app.exportcli import _open_store
from radt.app.views import View
from radt.collectors.importer import main as import_main
from radt.collectors.stores import open_metric_store
from radt.collectors.tracking import PROCESS_ONLY_ENV
from radt.points import Point
from radt.runmodel import COLLOCATION_TAG
from tests.support.runs import radt_run

BASE = 1_700_000_000_000
MIN = 60_000
# workload -> (collocation tag, [(start min, end min, SMACT, energy J, steps)] per run)
WORKLOADS = {
    "alone": ("-", [(0, 60, 0.60, 360_000, 10), (61, 121, 0.64, 380_000, 10)]),
    "timeslice": ("-", [(200, 320, 0.30, 500_000, 10), (205, 325, 0.34, 520_000, 10)]),
    "mps": ("mps", [(400, 490, 0.40, 450_000, 10), (402, 492, 0.44, 460_000, 10)]),
    "mig": ("3g.40gb", [(600, 720, 0.20, 300_000, 10), (600, 720, 0.26, 310_000, 10)]),
}
METHOD = {"alone": "alone", "timeslice": "same GPU", "mps": "MPS", "mig": "MIG"}


def _build(uri: str) -> tuple[str, dict[str, str]]:
    client, writer = MlflowClient(uri), open_metric_store(uri)
    exp = client.create_experiment("aggregates")
    runs = {}
    for workload, (collocation, specs) in WORKLOADS.items():
        for letter, (start, end, smact, joules, steps) in zip("AB", specs, strict=True):
            t0 = BASE + start * MIN
            run_id = radt_run(client, exp, f"{workload}{letter}", start_time=t0, workload=workload, letter=letter, script_args=("--model", "resnet50"))
            points = [Point("loss", 1.0 / (i + 1), t0 + 1000 * i, i) for i in range(steps)]
            points += [Point("system/gpu_0_sm_active", smact, t0 + 1000 * i, i) for i in range(20)]
            points += [Point("system/gpu_0_energy_joules", float(joules) * i, t0 + 1000 * i, i) for i in (0, 1)]
            writer.write(run_id, points)
            client.set_tag(run_id, COLLOCATION_TAG, collocation)
            client.set_terminated(run_id, "FINISHED", end_time=BASE + end * MIN)
            runs[f"{workload}{letter}"] = run_id
    writer.close()
    return exp, runs


@pytest.fixture
def built(store_uri, snapshots):
    built = snapshots.restore(_build, store_uri)
    _open_store(store_uri)
    return built


def _table(built):
    exp, runs = built
    return comparison_table(View([exp], list(runs.values())))


def _specs(workload: str, column: int) -> list[float]:
    return [spec[column] for spec in WORKLOADS[workload][1]]


def test_the_table_names_each_runs_collocation_and_energy_per_step(built):
    table = _table(built)
    runs = table[table["kind"] == "run"].set_index("run")
    for workload, method in METHOD.items():
        for letter, (_s, _e, _smact, joules, steps) in zip("AB", WORKLOADS[workload][1], strict=True):
            row = runs.loc[f"{workload}{letter}"]
            assert row["collocation"] == method, (workload, row["collocation"])
            assert row["energy_per_step_j"] == pytest.approx(joules / steps), "energy (J) ÷ steps"
            assert row["run_id"] == built[1][f"{workload}{letter}"]


def test_bars_are_the_tables_means_per_collocation_method(built):
    table = _table(built)
    figure = bar_figure(table, "smact_mean", "collocation")
    bar = figure.data[0]
    assert list(bar.x) == ["alone", "same GPU", "MPS", "MIG"], "the papers' order"
    runs = table[table["kind"] == "run"]
    for name, height in zip(bar.x, bar.y, strict=True):
        assert height == pytest.approx(runs[runs["collocation"] == name]["smact_mean"].mean())
    workload = {METHOD[w]: w for w in WORKLOADS}
    assert list(bar.y) == pytest.approx([np.mean(_specs(workload[m], 2)) for m in bar.x]), "each run's SMACT is its constant"
    assert list(bar.customdata) == [2, 2, 2, 2], "two runs a bar"
    by_workload = bar_figure(table, "steps_per_h", "workload").data[0]
    assert list(by_workload.x) == ["workload alone", "workload mig", "workload mps", "workload timeslice"]
    hours = {w: [(e - s) / 60 for s, e, *_ in WORKLOADS[w][1]] for w in WORKLOADS}
    assert list(by_workload.y) == pytest.approx([np.mean([10 / h for h in hours[w]]) for w in ("alone", "mig", "mps", "timeslice")])


def test_boxes_hold_every_run_and_cdfs_end_at_the_extremes(built):
    table = _table(built)
    boxes = {trace.name: sorted(trace.y) for trace in box_figure(table, "energy_per_step_j", "workload").data}
    assert boxes["workload mps"] == pytest.approx(sorted(j / s for _a, _b, _c, j, s in WORKLOADS["mps"][1]))
    lines = {trace.name: trace for trace in cdf_figure(table, "smact_mean", "collocation").data}
    assert set(lines) == {"alone (2)", "same GPU (2)", "MPS (2)", "MIG (2)"}
    mig = lines["MIG (2)"]
    assert mig.x[0] == pytest.approx(0.20) and mig.x[-1] == pytest.approx(0.26), "from the lowest run to the highest"
    assert list(mig.y) == [0.5, 1.0], "the share of runs at or below each value"


def test_group_rows_and_unknown_runs_stay_out_of_the_figures(built):
    table = _table(built)
    assert (table["kind"] == "workload").any(), "runs together have their group's row"
    found = groups(table, "smact_mean", "workload")
    assert sum(len(v) for v in found.values()) == 8, "only the runs, not their groups' rows"
    with pytest.raises(ValueError, match="statistic 'nope' is not one of"):
        bar_figure(table, "nope", "workload")


def test_activity_view_of_the_recorded_microbenchmark(store_uri, fixtures_dir, monkeypatch, capsys):
    """One thread block of one thread (the paper's Figure 1): GRACT and nvidia-smi read busy, SMACT ~0.002, SMOCC 0 on GPU 0, the busy one of five."""
    for name, value in PROCESS_ONLY_ENV.items():
        monkeypatch.setenv(name, os.environ.get(name, value))
    files = [str(fixtures_dir / f"microbench_1.1_{f}") for f in ("dcgmi_dmon.txt", "nvidia_smi.csv")]
    assert import_main([*files, "--store", store_uri, "-e", "microbench", "--start", "2023-02-20T10:00:00"]) == 0
    run_id = capsys.readouterr().out.strip()
    _open_store(store_uri)
    exp = MlflowClient(store_uri).get_run(run_id).info.experiment_id
    series, title = activity_series(View([exp], [run_id]), run_id)
    assert "GPU 0" in title
    means = {name: float(np.mean(values[len(values) // 4 : -len(values) // 4])) for name, (_x, values) in series.items()}  # the kernel's middle half
    assert means["gr_engine_active"] > 0.5 and means["utilization_percentage"] > 50, f"the GPU reads busy: {means}"
    assert means["sm_active"] < 0.01 and means["sm_occupancy"] < 0.01, f"while almost no SM works: {means}"
    figure = activity_figure(series, title)
    names = [trace.name.split(" (")[0] for trace in figure.data]
    assert names == ["GRACT", "SMACT", "SMOCC", "nvidia-smi GPU util ÷ 100"]
    assert list(figure.layout.yaxis.range) == [0, 1.02], "one 0-1 axis"
    with pytest.raises(ExportError, match="not in the view's experiments"):
        activity_series(View([exp], [run_id]), "0" * 32)
