"""The Live tab's read side on SQLite and the real PostgreSQL: which runs are live, the newest values,
and the incremental query that feeds extendData."""

from __future__ import annotations

import numpy as np
import pytest
from mlflow import MlflowClient

from radt.app.db import live
from radt.app.db.store import make_read_engine
from radt.collectors.store import tracking
from radt.collectors.store.stores import SqlMetricStore
from radt.points import Point
from tests.support.runs import radt_run

pytestmark = pytest.mark.dialects  # the SQL radt issues differs per dialect: SQLite and the real PostgreSQL

NOW = 1_760_000_000_000
SMACT = "system/gpu_0_sm_active"
CPU = "system/cpu_utilization_percentage"


def _run(client, experiment, name, letter, start, workload="pair"):
    return radt_run(client, experiment, name, start_time=start, workload=workload, letter=letter)


def test_live_runs_values_and_incremental_points(store_uri):
    client = MlflowClient(store_uri)
    experiment = tracking.resolve_experiment(client, store_uri, "live")
    a = _run(client, experiment, "A", "A", NOW - 600_000)
    b = _run(client, experiment, "B", "B", NOW - 600_000)
    ended = _run(client, experiment, "just ended", "A", NOW - 900_000, workload=None)
    old = _run(client, experiment, "ended long ago", "A", NOW - 9_000_000, workload=None)
    client.set_terminated(ended, "FAILED", end_time=NOW - 30_000)
    client.set_terminated(old, "FINISHED", end_time=NOW - 8_000_000)
    writer = SqlMetricStore(store_uri)

    # two collocated runs whose batches reach the store interleaved and out of timestamp order
    def write(run_id, first, last, offset=0.0):
        writer.write(run_id, [Point(SMACT, 0.3 + offset + i / 1000, NOW - 100_000 + i * 1000, i) for i in range(first, last)])
        writer.write(run_id, [Point(CPU, 50.0 + i, NOW - 100_000 + i * 1000, i) for i in range(first, last)])

    write(b, 0, 40, 0.1)
    write(a, 20, 40)
    write(a, 0, 20)  # A's older half arrives after its newer half
    runs = live.live_runs(make_read_engine(store_uri), NOW)
    engine = make_read_engine(store_uri)
    assert set(runs["run_id"]) == {a, b, ended}, "running runs and the one that ended 30 s ago"
    row = runs.set_index("run_id").loc[a]
    assert row.workload_label == "workload pair" and row.host and row.interval_s == 1.0 and row.experiment_name == "live"

    latest = live.latest_values(engine, [a, b])
    assert latest[a][SMACT] == (0.3 + 39 / 1000, NOW - 100_000 + 39_000) and latest[b][CPU][0] == 89.0

    # the browser has A up to sample 9 and B up to sample 29: exactly the later points come back, in order
    cursors = {a: NOW - 100_000 + 9_000, b: NOW - 100_000 + 29_000}
    keys = {a: [SMACT, CPU], b: [SMACT, CPU]}
    found = live.new_points(engine, cursors, keys)
    assert np.array_equal(found[a][SMACT][0], NOW - 100_000 + np.arange(10, 40) * 1000)
    assert np.allclose(found[a][SMACT][1], 0.3 + np.arange(10, 40) / 1000)
    assert np.array_equal(found[b][CPU][0], NOW - 100_000 + np.arange(30, 40) * 1000)
    assert np.array_equal(found[b][CPU][1], 50.0 + np.arange(30, 40))

    # the next poll, after B wrote two more samples and A none: only B's two, nothing twice
    write(b, 40, 42, 0.1)
    cursors = {a: int(found[a][SMACT][0][-1]), b: int(found[b][SMACT][0][-1])}
    again = live.new_points(engine, cursors, keys)
    assert set(again) == {b} and list(again[b][SMACT][0]) == [NOW - 100_000 + 40_000, NOW - 100_000 + 41_000]
    assert live.new_points(engine, {a: NOW}, keys) == {}

    # the live chart's lines: GPU activity first, the host's CPU on the percent axis
    traces = live.chart_traces([SMACT, CPU, "system/gpu_0_utilization_percentage", "loss"])
    assert [(t.key, t.axis) for t in traces] == [(SMACT, "y"), (CPU, "y2")], "GRACT/SMACT make GPU util redundant; loss is not drawn"
    # each percent line says which hundred it counts (the card's one percent axis held "100 % = 1 core" over the host's CPU)
    named = {t.metric: t.name for t in live.chart_traces([CPU, "system/process_cpu_utilization_percentage", "system/gpu_1_utilization_percentage"])}
    assert named == {"cpu_utilization_percentage": "CPU (% of all cores)", "process_cpu_utilization_percentage": "Run CPU (% of one core)",
                     "utilization_percentage": "GPU util (%)"}, named  # fmt: skip
    engine.dispose()


def test_idle_gpu_flag_needs_a_full_minute_of_near_zero_activity(store_uri):
    client = MlflowClient(store_uri)
    experiment = tracking.resolve_experiment(client, store_uri, "idle")
    stalled = _run(client, experiment, "stalled", "A", NOW - 600_000, workload=None)
    busy = _run(client, experiment, "busy", "A", NOW - 600_000, workload=None)
    young = _run(client, experiment, "young", "A", NOW - 20_000, workload=None)
    util_only = _run(client, experiment, "no GPM", "A", NOW - 600_000, workload=None)
    writer = SqlMetricStore(store_uri)
    span = range(-90, 0)
    writer.write(stalled, [Point(SMACT, 0.6 if t < -70 else 0.01, NOW + t * 1000, t + 90) for t in span])
    writer.write(busy, [Point(SMACT, 0.01 if t != -10 else 0.4, NOW + t * 1000, t + 90) for t in span])
    writer.write(young, [Point(SMACT, 0.0, NOW + t * 1000, t + 20) for t in range(-20, 0)])
    writer.write(util_only, [Point("system/gpu_1_utilization_percentage", 2.0, NOW + t * 1000, t + 90) for t in span])
    engine = make_read_engine(store_uri)
    runs = {stalled: NOW - 600_000, busy: NOW - 600_000, young: NOW - 20_000, util_only: NOW - 600_000}
    keys = {stalled: [SMACT], busy: [SMACT], young: [SMACT], util_only: ["system/gpu_1_utilization_percentage"]}
    assert live.idle_gpus(engine, keys, runs, NOW) == {stalled: [0], util_only: [1]}
    engine.dispose()


def test_a_runs_own_metrics_are_what_its_script_logged():
    """The card's "run" row: loss and accuracy as logged, by name; never a system series nor a radT legacy hardware key."""
    values = {
        "loss": (0.25, NOW),
        "accuracy": (0.875, NOW),
        "val/loss": (float("nan"), NOW),
        SMACT: (0.5, NOW),
        CPU: (250.0, NOW),
        "TOP - CPU Utilization": (99.0, NOW),  # the original radT's top listener: a hardware series
    }
    own = live.own_metrics(values)
    assert [key for key, _v in own] == ["accuracy", "loss", "val/loss"] and own[0][1] == 0.875
    assert len(live.own_metrics({f"m{i:02d}": (float(i), NOW) for i in range(20)})) == live.OWN_LIMIT


def test_a_card_shows_the_runs_own_gpu_memory_beside_the_gpus():
    """Two runs sharing GPU 0 both read the GPU's memory (both runs' and any other process's); the card also shows the
    run's own (NVML's per-process lists), per GPU, the host's values last; radT's legacy keys are left out."""
    values = {
        CPU: (40.0, NOW),
        "system/gpu_1_memory_usage_megabytes": (1_000.0, NOW),
        "system/gpu_0_process_memory_megabytes": (22_234.0, NOW),
        "system/gpu_0_memory_usage_megabytes": (44_708.0, NOW),
        SMACT: (0.6, NOW),
        "TOP - CPU Utilization": (99.0, NOW),
    }
    shown = [(device.gpu, metric.name, value) for device, metric, value in live.card_values(values)]
    assert shown == [
        (0, "sm_active", 0.6),
        (0, "memory_usage_megabytes", 44_708.0),
        (0, "process_memory_megabytes", 22_234.0),
        (1, "memory_usage_megabytes", 1_000.0),
        (None, "cpu_utilization_percentage", 40.0),
    ]


def test_a_card_shows_the_runs_own_share_of_a_shared_gpu_beside_the_devices():
    """Issue 55: a running run's card shows its own SM share and power estimate right after the device's figures."""
    values = {
        "system/gpu_0_power_usage_watts": (400.0, NOW),
        "system/gpu_0_run_power_watts": (150.0, NOW),
        "system/gpu_0_utilization_percentage": (90.0, NOW),
        "system/gpu_0_run_sm_utilization_percentage": (30.0, NOW),
    }
    shown = [(metric.name, value) for _device, metric, value in live.card_values(values)]
    assert shown == [
        ("utilization_percentage", 90.0),
        ("run_sm_utilization_percentage", 30.0),
        ("power_usage_watts", 400.0),
        ("run_power_watts", 150.0),
    ]
