"""The dashboard's read side on SQLite and the real PostgreSQL, on stores written three ways: by radt
itself (workload parents, the bulk SQL path), by plain MLflow with its system-metric keys, and shaped
like the original radT (params workload/letter/model/params, its legacy keys, step 0 everywhere):
tests/support/stores.py builds them."""

from __future__ import annotations

import dataclasses
import math
import socket
from pathlib import Path

import numpy as np
import pytest
import sqlalchemy as sa
from mlflow import MlflowClient

from radt import catalogue
from radt.app.db.keys import resolve_keys, resolve_scaled
from radt.app.db.runs import RUN_COLUMNS, list_experiments, list_metric_keys, list_runs, list_workloads, present_metrics
from radt.app.db.series import load_metric, load_series
from radt.app.db.store import RUNS, TAGS, StoreUnreadable, check_store, make_read_engine
from radt.app.summary.summaries import SUMMARY_COLUMNS, run_summary
from radt.catalogue import Device
from tests.support.stores import BASE, NOW, Store, build

pytestmark = pytest.mark.dialects  # the SQL radt issues differs per dialect: SQLite and the real PostgreSQL


@pytest.fixture
def built(store_uri, snapshots) -> Store:
    """build()'s rows in the test's own store (filled once per test run: tests/support/snapshots.py)."""
    return dataclasses.replace(snapshots.restore(build, store_uri), uri=store_uri)


@pytest.fixture
def engine(built):
    engine = make_read_engine(built.uri)
    yield engine
    engine.dispose()


# --- experiments, runs, workloads ----------------------------------------------------------------


def _check_experiments(built, engine):
    experiments = list_experiments(engine)
    assert [e["name"] for e in experiments] == ["Default", "mlflow-sys", "radT-legacy", "radt-new"]
    counts = {e["name"]: e["runs"] for e in experiments}
    assert counts == {"Default": 0, "mlflow-sys": 2, "radT-legacy": 3, "radt-new": 4}, "parents and deleted runs not counted"
    assert all(isinstance(e["experiment_id"], str) for e in experiments)


def test_experiments_runs_and_workloads_from_every_kind_of_store(built, engine, monkeypatch):
    _check_experiments(built, engine)
    ids = [built.experiments[n] for n in ("radt-new", "mlflow-sys", "radT-legacy", "deleted-exp")]
    runs = list_runs(engine, ids, now_ms=NOW)
    assert list(runs.columns) == RUN_COLUMNS
    by_label = {label: runs.set_index("run_id").loc[rid] for label, rid in built.runs.items() if rid in set(runs.run_id)}
    # parents (radt.role=workload), the deleted run and the deleted experiment's run are no rows
    assert set(runs.run_id) == {built.runs[k] for k in ("A", "B", "C", "D", "sweep", "trial", "old1", "old2", "old3")}
    assert not set(built.parents.values()) & set(runs.run_id)

    # radt: grouped under the parent run, labelled by its radt.workload tag
    assert by_label["A"].workload_id == by_label["B"].workload_id == built.parents["w1"]
    assert by_label["A"].workload_label == "workload w1" and by_label["C"].workload_label == "workload w2"
    assert by_label["C"].workload_id == built.parents["w2"]
    assert (by_label["A"].letter, by_label["B"].letter) == ("A", "B")
    exp = built.experiments["radt-new"]
    assert (by_label["D"].workload_id, by_label["D"].workload_label) == (f"ungrouped:{exp}", "ungrouped")
    # plain MLflow: a nested run under a non-radt parent is ungrouped, the parent is a run like any other
    exp = built.experiments["mlflow-sys"]
    assert by_label["trial"].workload_id == by_label["sweep"].workload_id == f"ungrouped:{exp}"
    # the original radT: its workload and letter params
    exp = built.experiments["radT-legacy"]
    assert by_label["old1"].workload_id == by_label["old2"].workload_id == f"param:{exp}:3"
    assert (by_label["old3"].workload_id, by_label["old3"].workload_label) == (f"param:{exp}:4", "workload 4")
    assert (by_label["old1"].letter, by_label["old2"].letter, by_label["trial"].letter) == ("A", "B", "")
    assert by_label["old1"].params == {"workload": "3", "letter": "A", "model": "resnet50", "params": "--batch-size 64"}

    # status, times, durations, names, params and tags
    assert by_label["A"].status == "FINISHED" and by_label["A"].duration_s == pytest.approx(900.0)
    assert by_label["A"].start_time == BASE and by_label["A"].end_time == BASE + 900_000
    assert by_label["D"].status == "RUNNING" and math.isnan(by_label["D"].end_time)
    assert by_label["D"].duration_s == pytest.approx((NOW - BASE - 1_200_000) / 1000)
    assert by_label["A"].run_name == "run A" and by_label["trial"].run_name == "trial"
    assert by_label["A"].params["batch-size"] == "256" and by_label["A"].tags["radt.role"] == "run"
    assert by_label["A"].experiment_id == built.experiments["radt-new"]

    workloads = list_workloads(runs)
    w1 = workloads[workloads.workload_id == built.parents["w1"]].iloc[0]
    assert (w1.workload_label, w1.runs, w1.running) == ("workload w1", 2, 0)
    assert list_runs(engine, []).empty and list_runs(engine, ["not-an-id"]).empty
    assert list(list_runs(engine, []).columns) == RUN_COLUMNS

    # a parent outside the selection (here deleted) still names its children's workload; IN lists chunked
    MlflowClient(built.uri).delete_run(built.parents["w1"])
    monkeypatch.setattr("radt.app.db.store.CHUNK", 2)
    again = list_runs(engine, [built.experiments["radt-new"]], now_ms=NOW).set_index("run_id")
    assert again.loc[built.runs["A"]].workload_id == built.parents["w1"]
    assert again.loc[built.runs["B"]].workload_label == "workload w1"
    assert len(again) == 4


# --- keys and the catalogue ----------------------------------------------------------------------


def test_metric_keys_catalogue_resolution_and_legacy_scaling(built, engine):
    _check_metric_keys(built, engine)
    _check_legacy_scaling(built, engine)


def _check_metric_keys(built, engine):
    r = built.runs
    keys = list_metric_keys(engine, [r["A"], r["old1"]])
    assert keys == sorted(keys)
    assert {"system/gpu_0_sm_active", "system/gpu_1_sm_active", "DCGMI - SN Active", "SMI - GPU Util"} <= set(keys)
    assert "loss" not in keys and "loss" in list_metric_keys(engine, [r["trial"]])
    assert list_metric_keys(engine, []) == []

    everyone = [r[k] for k in ("A", "B", "C", "D", "trial", "old1")]
    assert resolve_keys(engine, everyone, "sm_active", 0) == {
        r["A"]: "system/gpu_0_sm_active",
        r["B"]: "system/gpu_0_sm_active",
        r["C"]: "system/gpu_0_sm_active",
        r["old1"]: "DCGMI - SN Active",  # radT's misspelt key, GPU 0 by convention
    }
    assert resolve_keys(engine, everyone, "sm_active", 1) == {r["A"]: "system/gpu_1_sm_active"}
    assert resolve_keys(engine, everyone, "utilization_percentage", 0) == {
        r["trial"]: "system/gpu_0_utilization_percentage",
        r["old1"]: "SMI - GPU Util",
    }
    assert resolve_keys(engine, everyone, "cpu_utilization_percentage") == {
        r["A"]: "system/cpu_utilization_percentage",
        r["trial"]: "system/cpu_utilization_percentage",
    }
    assert resolve_keys(engine, everyone, "process_cpu_utilization_percentage") == {r["old1"]: "TOP - CPU Utilization"}
    assert resolve_scaled(engine, [r["old1"]], "memory_usage_megabytes", 0) == {r["old1"]: ("SMI - Mem Used", catalogue.MIB)}
    with pytest.raises(KeyError):
        resolve_keys(engine, everyone, "no_such_metric", 0)

    present = present_metrics(engine, [r["A"], r["old1"]])
    assert ("sm_active", 0) in present and ("sm_active", 1) in present
    assert ("cpu_utilization_percentage", None) in present and ("process_cpu_utilization_percentage", None) in present
    assert present.index(("sm_active", 0)) < present.index(("sm_active", 1)) < present.index(("cpu_utilization_percentage", None))


def _check_legacy_scaling(built, engine):
    r = built.runs
    util = load_metric(engine, [r["old1"], r["trial"]], "utilization_percentage", 0)
    assert np.allclose(util[r["old1"]][1], 80.0), "radT's 0-1 SMI - GPU Util is percent"
    assert np.array_equal(util[r["trial"]][1], built.series[("trial", "system/gpu_0_utilization_percentage")][1])
    memory = load_metric(engine, [r["old1"]], "memory_usage_megabytes", 0)
    assert np.allclose(memory[r["old1"]][1], 1024.0 * catalogue.MIB)
    energy = load_metric(engine, [r["old2"]], "energy_joules", 0)
    ts, joules = energy[r["old2"]]
    assert joules[0] == pytest.approx(0.0) and joules[-1] == pytest.approx(59 * 100.0), "mJ since driver load made relative"
    smact = load_metric(engine, [r["old1"], r["A"]], "sm_active", 0, start_ms=BASE, end_ms=BASE + 9_000)
    assert list(smact) == [r["old1"], r["A"]]
    assert np.allclose(smact[r["old1"]][1], 0.3 + 0.001 * np.arange(10))
    assert np.array_equal(smact[r["old1"]][0], BASE + np.arange(10) * 1000)


# --- series --------------------------------------------------------------------------------------


@pytest.mark.parametrize("per_run", [False, True], ids=["primary-key", "run-by-run"])
def test_series_budget_extremes_nan_and_zoomed_windows(built, engine, monkeypatch, per_run):
    # PostgreSQL reads a few runs out of many run by run, a larger share through MLflow's primary key
    monkeypatch.setattr("radt.app.db.series.KEY_SCAN_WHOLE", not per_run)
    monkeypatch.setattr("radt.app.db.series.PARALLEL_MIN_RUNS", 1 if per_run else 10**6)  # run by run: also split across connections
    monkeypatch.setattr("radt.app.db.series.USE_ROLLUPS", False)  # the raw path (C is long enough for rollups: tests/test_series_rollups.py)
    _check_series_downsampled(built, engine)
    _check_zoomed_window(built, engine)


def _check_series_downsampled(built, engine):
    r = built.runs
    ts, raw = built.series[("C", "system/gpu_0_sm_active")]
    out = load_series(engine, [r["C"], r["A"], r["trial"]], "system/gpu_0_sm_active", budget=1000)
    assert set(out) == {r["C"], r["A"]}, "runs without the key are absent"
    xs, ys = out[r["C"]]
    assert len(xs) <= 1000 and np.all(np.diff(xs) > 0), "sorted by time although written out of order"
    assert np.nanmax(ys) == 3.0 and np.nanmin(ys) == -2.0, "the spike and the dip survive"
    assert ts[1234] in xs and ts[4321] in xs
    assert np.isnan(ys[xs == ts[5000]]).all() and (xs == ts[5000]).any(), "the NaN sample is a gap"
    lookup = dict(zip(ts.tolist(), raw.tolist()))
    for x, y in zip(xs.tolist(), ys.tolist()):
        assert y == lookup[x] or (math.isnan(y) and math.isnan(lookup[x])), "real points only"
    # A's 300 points are under budget: raw, NaN included
    xa, ya = out[r["A"]]
    expected_t, expected_v = built.series[("A", "system/gpu_0_sm_active")]
    assert np.array_equal(xa, expected_t) and np.allclose(ya, expected_v, equal_nan=True)
    assert math.isnan(ya[17])
    assert len(load_series(engine, [r["C"]], "system/gpu_0_sm_active")[r["C"]][0]) <= 2000, "default budget"
    assert load_series(engine, [], "system/gpu_0_sm_active") == {}
    if engine.dialect.name == "postgresql":  # psycopg 3 reads binary on a raw cursor; psycopg2 goes through SQLAlchemy
        other = make_read_engine(built.uri.replace("postgresql://", "postgresql+psycopg2://"))
        again = load_series(other, [r["C"], r["A"]], "system/gpu_0_sm_active", budget=1000)
        other.dispose()
        assert again.keys() == out.keys()
        for run_id, (xs_, ys_) in again.items():
            assert np.array_equal(xs_, out[run_id][0]) and np.array_equal(ys_, out[run_id][1], equal_nan=True)
    assert load_series(engine, [r["A"]], "no-such-key") == {}


def _check_zoomed_window(built, engine):
    r = built.runs
    ts, raw = built.series[("C", "system/gpu_0_sm_active")]
    lo, hi = int(ts[1000]), int(ts[2499])  # 1,500 points: under the budget
    out = load_series(engine, [r["C"], r["A"]], "system/gpu_0_sm_active", lo, hi, budget=2000)
    assert set(out) == {r["C"]}, "A has no points in this window"
    xs, ys = out[r["C"]]
    assert np.array_equal(xs, ts[1000:2500]) and np.array_equal(ys, raw[1000:2500]), "bounds inclusive, every point"
    xs, _ = load_series(engine, [r["C"]], "system/gpu_0_sm_active", lo, None, budget=500)[r["C"]]
    assert len(xs) <= 500 and xs[0] >= lo and xs[-1] == ts[-1]
    # per-run windows (a time-since-start axis) and the step axis
    windows = {r["C"]: (int(ts[10]), int(ts[19])), r["A"]: (BASE + 5_000, BASE + 7_000)}
    out = load_series(engine, [r["C"], r["A"]], "system/gpu_0_sm_active", windows=windows)
    assert np.array_equal(out[r["C"]][0], ts[10:20]) and np.array_equal(out[r["A"]][0], BASE + np.arange(5, 8) * 1000)
    steps, values = load_series(engine, [r["C"]], "system/gpu_0_sm_active", 100, 199, x="step")[r["C"]]
    assert np.array_equal(steps, np.arange(100, 200)) and np.array_equal(values, raw[100:200])


# --- summary -------------------------------------------------------------------------------------


def test_run_summary(built, engine):
    r = built.runs
    labels = ["A", "B", "D", "trial", "old1"]
    summary = run_summary(engine, [r[k] for k in labels], now_ms=NOW)
    assert list(summary.columns) == SUMMARY_COLUMNS and list(summary.run_id) == [r[k] for k in labels]
    s = summary.set_index("run_id")
    smact = built.series[("A", "system/gpu_0_sm_active")][1]
    smact = smact[~np.isnan(smact)]
    # every point of both of A's GPUs (GPU 1 stored smact / 2), pooled; this was GPU 0's alone, which hid GPU 1
    gpu1 = built.series[("A", "system/gpu_1_sm_active")][1]
    both = np.concatenate([smact, gpu1[~np.isnan(gpu1)]])
    a = s.loc[r["A"]]
    assert a.duration_s == pytest.approx(900.0)
    assert a.smact_mean == pytest.approx(both.mean()) and a.smact_p95 == pytest.approx(np.percentile(both, 95)), "all GPUs, NaN left out"
    assert a.gpu_memory_peak_mb == pytest.approx(4000.0), "the highest of its GPUs"
    assert a.energy_j == pytest.approx(299 * 250.0), "energy_joules' last value"
    assert a.gpu_energy_j == {f"host:{socket.gethostname()}:gpu:0": pytest.approx(299 * 250.0)}, "per physical GPU: radt.host and index"
    assert a.cpu_mean == pytest.approx(20.0) and math.isnan(a.process_cpu_mean)
    assert s.loc[r["B"]].smact_mean == pytest.approx(0.25) and math.isnan(s.loc[r["B"]].energy_j)
    d = s.loc[r["D"]]
    assert d.duration_s == pytest.approx((NOW - BASE - 1_200_000) / 1000) and math.isnan(d.smact_mean)
    trial = s.loc[r["trial"]]
    assert math.isnan(trial.smact_mean) and trial.gpu_memory_peak_mb == pytest.approx(2059.0)
    assert trial.energy_j == pytest.approx(59 * 100.0), "no energy key: power integrated over time"
    assert trial.cpu_mean == pytest.approx(20.0)
    old = s.loc[r["old1"]]
    assert old.smact_mean == pytest.approx(np.mean(0.3 + 0.001 * np.arange(60)))
    assert old.gpu_memory_peak_mb == pytest.approx(1024.0 * catalogue.MIB)
    assert old.energy_j == pytest.approx(59 * 100.0), "radT's mJ counter: last minus first"
    assert old.process_cpu_mean == pytest.approx(150.0) and math.isnan(old.cpu_mean)
    assert run_summary(engine, []).empty


# --- engine --------------------------------------------------------------------------------------


def test_the_read_engine_cannot_write(store_uri):
    client = MlflowClient(store_uri)
    experiment = client.create_experiment("untouchable")
    run_id = client.create_run(experiment).info.run_id
    engine = make_read_engine(store_uri)
    check_store(engine)
    with pytest.raises(sa.exc.DBAPIError), engine.begin() as conn:
        conn.execute(sa.delete(RUNS))
    with pytest.raises(sa.exc.DBAPIError), engine.begin() as conn:
        conn.execute(TAGS.insert().values(key="x", value="y", run_uuid=run_id))
    assert list(list_runs(engine, [experiment]).run_id) == [run_id]
    engine.dispose()


def test_an_unreachable_store_is_one_clear_error(tmp_path: Path, pg_uri):
    missing = tmp_path / "nowhere" / "mlflow.db"
    engine = make_read_engine(f"sqlite:///{missing}")
    with pytest.raises(StoreUnreadable, match=f"sqlite:///{missing}"):
        check_store(engine)
    assert not missing.exists(), "reading never creates a store"
    empty = tmp_path / "empty.db"
    sa.create_engine(f"sqlite:///{empty}").connect().close()
    with pytest.raises(StoreUnreadable, match="not an MLflow tracking store"):
        check_store(make_read_engine(f"sqlite:///{empty}"))
    gone = pg_uri.rsplit("/", 1)[0] + "/radt_no_such_database"
    with pytest.raises(StoreUnreadable, match="radt_no_such_database"):
        check_store(make_read_engine(gone.replace("postgresql://", "postgres://")))
    check_store(make_read_engine(pg_uri))


# --- the pages' cached access (app.view.data) -----------------------------------------------------------


def test_cached_series_zoom_windows_and_step_axis(built, engine, monkeypatch, tmp_path):
    from flask import Flask

    from radt.app.db.state import STATE
    from radt.app.view import data
    from radt.app.view.cache import CACHE, cache_config

    CACHE.init_app(Flask(__name__), config=cache_config("simple"))
    CACHE.clear()
    monkeypatch.setattr(STATE, "engine", engine)
    monkeypatch.setattr(STATE, "store_uri", built.uri)
    r = built.runs
    runs = data.runs([built.experiments["radt-new"]])
    assert set(runs["run_id"]) == {r["A"], r["B"], r["C"], r["D"]}
    gpu0, gpu1 = Device(gpu=0), Device(gpu=1)
    first = data.series("cat:sm_active", runs)
    assert set(first) == {r["A"], r["B"], r["C"]} and len(first[r["C"]][gpu0][0]) <= 2000
    assert list(first[r["A"]]) == [gpu0, gpu1], "every GPU of a 2-GPU run, in order"
    assert np.allclose(first[r["A"]][gpu1][1], built.series[("A", "system/gpu_1_sm_active")][1], equal_nan=True)
    assert list(data.series("cat:sm_active", runs, gpus=[1])) == [r["A"]], "the GPU filter keeps GPU 1 only"

    # a second chart of the same runs comes from the cache: the database is not asked again
    monkeypatch.setattr(STATE, "engine", make_read_engine(f"sqlite:///{tmp_path / 'absent.db'}"))
    again = data.series("cat:sm_active", data.runs([built.experiments["radt-new"]]))
    assert again.keys() == first.keys() and all(np.array_equal(again[k][gpu0][0], first[k][gpu0][0]) for k in first)
    monkeypatch.setattr(STATE, "engine", engine)

    # zoomed to minutes 1-2 since each run's start: C's points 60..120, every one of them
    windows = data.zoom_windows((1.0, 2.0), "relative", runs)
    zoomed = data.series("cat:sm_active", runs, windows)
    ts, raw = built.series[("C", "system/gpu_0_sm_active")]
    assert np.array_equal(zoomed[r["C"]][gpu0][0], ts[60:121]) and np.array_equal(zoomed[r["C"]][gpu0][1], raw[60:121])
    assert np.array_equal(zoomed[r["A"]][gpu0][0], BASE + np.arange(60, 121) * 1000)
    # the step axis is the script's own training steps (hardware samples placed there by time: tests/test_figures.py);
    # these runs logged no metric of their own, so their samples have no step to sit on
    steps = data.series("cat:sm_active", runs, data.zoom_windows((99.5, 199.0), "step", runs), x="step")
    assert steps == {}
    wall = data.zoom_windows(("2023-11-14 22:13:20", "2023-11-14 22:13:30"), "wall", runs)  # BASE in UTC
    assert wall[r["A"]] == (BASE + 0 - 1, BASE + 10_000 + 1)
    summary = data.summary(runs)
    direct = run_summary(engine, list(runs["run_id"]))
    assert list(summary["run_id"]) == list(runs["run_id"])
    assert summary.drop(columns="duration_s").equals(direct.drop(columns="duration_s")), "a running run's duration grows between calls"
