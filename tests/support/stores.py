"""Stores filled once for the dashboard's read side and its browser tests.

`build`: every shape of store the dashboard must read, in one database: written by radt itself (workload
parents, the bulk SQL path), by plain MLflow with its system-metric keys, and shaped like the original
radT (params workload/letter/model/params, its legacy keys, step 0 everywhere).

`fill_browser_store`: `radt demo`, a three-hour run and the real 5-GPU logs imported, for the browser tests.
"""

from __future__ import annotations

import contextlib
import io
import math
from dataclasses import dataclass, field

import numpy as np
from mlflow import MlflowClient
from mlflow.entities import Metric, Param

from radt.collectors.store import tracking
from radt.collectors.store.stores import SqlMetricStore
from radt.points import Point
from tests.support.paths import FIXTURES
from tests.support.runs import radt_run

BASE = 1_700_000_000_000
NOW = BASE + 86_400_000  # "now" for running runs' durations
N_LONG = 6_000  # points of the long series (downsampling, windows)


@dataclass
class Store:
    uri: str
    experiments: dict[str, str] = field(default_factory=dict)  # name -> id
    runs: dict[str, str] = field(default_factory=dict)  # label -> run id
    parents: dict[str, str] = field(default_factory=dict)  # workload -> parent run id
    series: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)  # (label, key) -> (ts, values)


def _smact(n: int) -> np.ndarray:
    return 0.5 + 0.4 * np.sin(np.arange(n) / 20.0)


def _radt_run(client, store: Store, exp: str, label: str, workload: str | None, letter: str, start: int) -> str:
    run_id, parent = tracking.create_run(
        client,
        exp,
        tracking.NewRun(
            command=["python", "train.py", "--batch-size", "256"],
            script="train.py",
            script_args=["--batch-size", "256"],
            run_name=f"run {label}",
            workload=workload,
            letter=letter,
            devices="0,1",
            collocation="-",
            listeners=["nvml", "host"],
            settings={"interval": "1"},
            start_time=start,
        ),
    )
    store.runs[label] = run_id
    if parent:
        store.parents[workload] = parent
    return run_id


def _write(writer: SqlMetricStore, store: Store, label: str, key: str, ts: np.ndarray, values: np.ndarray, steps=None) -> None:
    steps = np.arange(len(ts)) if steps is None else steps
    writer.write(store.runs[label], [Point(key, float(v), int(t), int(s)) for t, v, s in zip(ts, values, steps)])
    store.series[(label, key)] = (np.asarray(ts, dtype=np.int64), np.asarray(values, dtype=np.float64))


def build(uri: str) -> Store:
    """Every shape of store the dashboard must read, in one database."""
    client = MlflowClient(uri)
    store = Store(uri)
    writer = SqlMetricStore(uri)

    # --- written by radt: two workloads (parents + children), a run without workload, a deleted run
    exp = store.experiments["radt-new"] = tracking.resolve_experiment(client, uri, "radt-new")
    a = _radt_run(client, store, exp, "A", "w1", "A", BASE)
    _radt_run(client, store, exp, "B", "w1", "B", BASE)
    _radt_run(client, store, exp, "C", "w2", "A", BASE + 600_000)
    _radt_run(client, store, exp, "D", None, "A", BASE + 1_200_000)
    gone = _radt_run(client, store, exp, "gone", "w2", "B", BASE + 600_000)
    ts = BASE + np.arange(300) * 1000
    smact = _smact(300)
    smact[17] = math.nan  # a sample without a value: MLflow stores 0 with is_nan
    _write(writer, store, "A", "system/gpu_0_sm_active", ts, smact)
    _write(writer, store, "A", "system/gpu_1_sm_active", ts, smact / 2)
    _write(writer, store, "A", "system/gpu_0_memory_usage_megabytes", ts, 1000 + np.arange(300.0))
    _write(writer, store, "A", "system/gpu_1_memory_usage_megabytes", ts, np.full(300, 4000.0))
    _write(writer, store, "A", "system/gpu_0_energy_joules", ts, np.arange(300) * 250.0)
    _write(writer, store, "A", "system/gpu_0_power_usage_watts", ts, np.full(300, 250.0))
    _write(writer, store, "A", "system/cpu_utilization_percentage", ts, np.linspace(10, 30, 300))
    _write(writer, store, "B", "system/gpu_0_sm_active", ts, np.full(300, 0.25))
    _write(writer, store, "gone", "system/gpu_0_sm_active", ts, np.full(300, 0.9))
    # a long series, written out of order in batches, with spikes and a NaN
    long_ts = BASE + 600_000 + np.arange(N_LONG) * 1000
    long = _smact(N_LONG)
    long[1234], long[4321], long[5000] = 3.0, -2.0, math.nan
    order = np.random.default_rng(0).permutation(N_LONG)
    for part in np.array_split(order, 6):
        writer.write(store.runs["C"], [Point("system/gpu_0_sm_active", float(long[i]), int(long_ts[i]), int(i)) for i in part])
    store.series[("C", "system/gpu_0_sm_active")] = (long_ts, long)
    for label in ("A", "B", "C", "gone"):
        client.set_terminated(store.runs[label], "FINISHED", end_time=BASE + 600_000 * (2 if label in ("C", "gone") else 1) + 300_000)
    # D stays RUNNING
    client.delete_run(gone)
    assert a

    # --- plain MLflow with its own system-metrics names, one nested run under a plain parent
    exp = store.experiments["mlflow-sys"] = client.create_experiment("mlflow-sys")
    parent = client.create_run(exp, run_name="sweep", start_time=BASE).info.run_id
    store.runs["sweep"] = parent
    child = client.create_run(exp, run_name="trial", start_time=BASE, tags={"mlflow.parentRunId": parent}).info.run_id
    store.runs["trial"] = child
    mts = BASE + np.arange(60) * 1000
    metrics = []
    for i, t in enumerate(mts):
        metrics += [
            Metric("system/gpu_0_utilization_percentage", 50.0 + i % 10, int(t), i),
            Metric("system/cpu_utilization_percentage", 20.0, int(t), i),
            Metric("system/gpu_0_memory_usage_megabytes", 2000.0 + i, int(t), i),
            Metric("system/gpu_0_power_usage_watts", 100.0, int(t), i),
            Metric("loss", 1.0 / (i + 1), int(t), i),
        ]
    client.log_batch(child, metrics=metrics)
    store.series[("trial", "system/gpu_0_utilization_percentage")] = (mts, np.array([50.0 + i % 10 for i in range(60)]))
    client.set_terminated(child, "FINISHED", end_time=BASE + 60_000)
    client.set_terminated(parent, "FINISHED", end_time=BASE + 61_000)

    # --- shaped like the original radT: params, legacy keys, step 0, values as radT stored them
    exp = store.experiments["radT-legacy"] = client.create_experiment("radT-legacy")
    for label, workload, letter in (("old1", "3", "A"), ("old2", "3", "B"), ("old3", "4", "A")):
        run_id = client.create_run(exp, run_name=f"radT {label}", start_time=BASE).info.run_id
        store.runs[label] = run_id
        params = {"workload": workload, "letter": letter, "model": "resnet50", "params": "--batch-size 64"}
        client.log_batch(run_id, params=[Param(k, v) for k, v in params.items()])
        lts = BASE + np.arange(60) * 1000
        metrics = []
        for i, t in enumerate(lts):
            metrics += [
                Metric("DCGMI - SN Active", 0.3 + 0.001 * i, int(t), 0),
                Metric("SMI - GPU Util", 0.8, int(t), 0),
                Metric("TOP - CPU Utilization", 150.0, int(t), 0),
                Metric("SMI - Mem Used", 1024.0, int(t), 0),
                Metric("DCGMI - Total Energy Consumption", 5e9 + 100_000.0 * i, int(t), 0),
            ]
        client.log_batch(run_id, metrics=metrics)
        client.set_terminated(run_id, "FINISHED", end_time=BASE + 60_000)

    # --- a deleted experiment
    dead = client.create_experiment("deleted-exp")
    client.create_run(dead)
    client.delete_experiment(dead)
    store.experiments["deleted-exp"] = dead
    writer.close()
    return store


# --- the browser tests' store ------------------------------------------------------------------------

RESNET = "demo: resnet50 collocation"
LONG_POINTS = 10_800  # three hours at 1 Hz: downsampled on screen, raw when zoomed in
LONG_START = 1_760_000_000_000


def write_long_run(uri: str) -> str:
    """A three-hour radt run with a spike at minute 100, written through radt's own bulk path."""
    client = MlflowClient(uri)
    experiment = tracking.resolve_experiment(client, uri, "long runs")
    run_id = radt_run(client, experiment, "three hours", start_time=LONG_START)
    values = 0.5 + 0.3 * np.sin(np.arange(LONG_POINTS) / 30.0)
    values[6000] = 0.99  # one second of peak: must survive downsampling
    SqlMetricStore(uri).write(run_id, [Point("system/gpu_0_sm_active", float(v), LONG_START + i * 1000, i) for i, v in enumerate(values)])
    client.set_terminated(run_id, "FINISHED", end_time=LONG_START + LONG_POINTS * 1000)
    return run_id


def import_five_gpus(uri: str) -> str:
    """`radt import` of the real 5-GPU MNIST logs (DGX Station A100: four A100s and the display GPU)."""
    from radt.collectors.imports import importer

    files = [str(FIXTURES / name) for name in ("mnist_dcgmi_dmon_18fields.txt", "mnist_nvidia_smi.csv", "mnist_top_batch.txt")]
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert importer.main([*files, "-e", "imported 5 GPUs", "-n", "mnist (PMDLT)", "--store", uri]) == 0
    return out.getvalue().split()[-1]


def fill_browser_store(uri: str) -> dict[str, str]:
    """`radt demo` (4 minutes), the three-hour run and the five GPUs: the ids the browser tests open."""
    from radt.collectors import demo

    demo.write_demo(uri, minutes=4, report=lambda _line: None)
    return {"long_run": write_long_run(uri), "five_gpus": import_five_gpus(uri)}


def write_default_demo(uri: str) -> None:
    """`radt demo` at its default length, the store a newcomer opens first: bert-base 1A starved by its data loader
    for 30 minutes (SMACT 0 <-> 0.7 every few seconds) beside nine runs of 8 to 30 minutes."""
    from radt.collectors import demo

    demo.write_demo(uri, minutes=demo.DEFAULT_MINUTES, report=lambda _line: None)
