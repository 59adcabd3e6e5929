"""Every stored key means one metric on one device: radt's, MLflow's (per node too), MIG slices, radT's legacy keys.

The store tests write keys the way each writer did and read them back through the dashboard's
read side (app/db/series.load_devices), on SQLite and the real PostgreSQL.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from mlflow import MlflowClient

from radt import catalogue
from radt.app.db.runs import present_metrics
from radt.app.db.series import load_devices
from radt.app.db.store import make_read_engine
from radt.catalogue import Device
from radt.collectors.store import tracking
from radt.collectors.store.stores import open_metric_store
from radt.points import Point

pytestmark = pytest.mark.dialects  # the SQL radt issues differs per dialect: SQLite and the real PostgreSQL

BASE = 1_700_000_000_000


@pytest.mark.parametrize(
    ("key", "metric", "device", "scale"),
    [
        ("system/gpu_0_sm_active", "sm_active", Device(None, 0, None), 1.0),
        ("system/gpu_7_sm_active", "sm_active", Device(None, 7, None), 1.0),
        ("system/gpu_0_mig_3_sm_active", "sm_active", Device(None, 0, 3), 1.0),
        ("system/node-7/gpu_1_utilization_percentage", "utilization_percentage", Device("node-7", 1, None), 1.0),
        ("system/node_0/cpu_utilization_percentage", "cpu_utilization_percentage", Device("node_0", None, None), 1.0),
        ("system/process_cpu_percentage", "process_cpu_utilization_percentage", Device(), 1.0),  # MLflow's name
        ("system/gpu_2_memory_usage_gigabytes", "memory_usage_megabytes", Device(None, 2, None), 1000.0),  # MLflow's ROCm monitor
        ("system/disk_usage_percentage", "disk_usage_percentage", Device(), 1.0),
        ("DCGMI - SN Active", "sm_active", Device(None, 0, None), 1.0),  # radT: no GPU index, counts as GPU 0
        ("system/SMI - GPU Util", "utilization_percentage", Device(None, 0, None), 100.0),  # newer radT prefixes "system/"
        ("TOP - Memory Utilization", "system_memory_usage_percentage", Device(), 1.0),
        ("SMI - Timestamp", "smi_clock_seconds", Device(), 1.0),
    ],
)
def test_every_writer_s_keys_resolve_to_a_metric_and_a_device(key, metric, device, scale):
    resolved = catalogue.resolve(key)
    assert resolved is not None and resolved.metric.name == metric and resolved.device == device and resolved.scale == scale


def test_keys_that_mean_nothing_to_the_catalogue_stay_the_user_s_own():
    for key in ("loss", "system/sm_active", "system/gpu_0_cpu_utilization_percentage", "system/a/b/gpu_0_sm_active", "accuracy/top1"):
        assert catalogue.resolve(key) is None, key


def test_keys_are_written_as_they_are_read():
    for args, kwargs in [
        (("sm_active", 0), {}),
        (("sm_active", 3), {"mig": 5}),
        (("power_usage_watts", 1), {"node": "gpu-node-2"}),
        (("cpu_utilization_percentage",), {"node": "n"}),
    ]:
        key = catalogue.key(*args, **kwargs)
        resolved = catalogue.resolve(key)
        assert resolved.metric.name == args[0] and resolved.device == Device(kwargs.get("node"), args[1] if len(args) > 1 else None, kwargs.get("mig")), key
    assert catalogue.display_name("system/gpu_0_mig_3_sm_active") == "SMACT (GPU 0 · MIG 3)"
    assert catalogue.display_name("system/node-7/gpu_1_sm_active") == "SMACT (node-7 · GPU 1)"
    with pytest.raises(ValueError):
        catalogue.key("sm_active", 0, node="a/b")


def _run(uri: str, name: str) -> str:
    client = MlflowClient(uri)
    experiment = tracking.resolve_experiment(client, uri, "catalogue")
    return client.create_run(experiment, run_name=name, start_time=BASE).info.run_id


def _write(uri: str, run_id: str, key: str, values: list[float]) -> None:
    store = open_metric_store(uri)
    store.write(run_id, [Point(key, v, BASE + i * 1000, i) for i, v in enumerate(values)])
    store.close()


def test_radT_sentinels_are_missing_values_not_data(store_uri):
    """radT wrote -1 for nvidia-smi's N/A and 0 for DCGM's N/A power: gaps in the chart, not dips to 0 or -100 %."""
    run_id = _run(store_uri, "radT with N/A")
    _write(store_uri, run_id, "SMI - GPU Util", [0.5, -1.0, 0.7])
    _write(store_uri, run_id, "DCGMI - Power Usage", [250.0, 0.0, 260.0])
    _write(store_uri, run_id, "DCGMI - Total Energy Consumption", [0.0, 1_000_000.0, 1_500_000.0])  # mJ since driver load; the first reading N/A
    engine = make_read_engine(store_uri)
    util = load_devices(engine, [run_id], "utilization_percentage")[run_id][Device(None, 0, None)][1]
    power = load_devices(engine, [run_id], "power_usage_watts")[run_id][Device(None, 0, None)][1]
    energy = load_devices(engine, [run_id], "energy_joules")[run_id][Device(None, 0, None)][1]
    engine.dispose()
    assert util[0] == 50.0 and math.isnan(util[1]) and util[2] == pytest.approx(70.0)
    assert power[0] == 250.0 and math.isnan(power[1]) and power[2] == 260.0
    assert math.isnan(energy[0]) and list(energy[1:]) == [0.0, 500.0], "relative to the first real reading, in J"


def test_every_node_gpu_and_slice_of_a_run_is_its_own_series(store_uri):
    """MLflow's multi-node keys, radt's per-GPU and per-MIG-slice keys: one series each, in device order."""
    run_id = _run(store_uri, "two nodes")
    for node, offset in (("node_0", 10.0), ("node_1", 20.0)):
        for gpu in (0, 1):
            _write(store_uri, run_id, f"system/{node}/gpu_{gpu}_utilization_percentage", [offset + gpu] * 5)
    _write(store_uri, run_id, "system/gpu_0_mig_1_sm_active", [0.1] * 5)
    _write(store_uri, run_id, "system/gpu_0_mig_2_sm_active", [0.6] * 5)
    engine = make_read_engine(store_uri)
    util = load_devices(engine, [run_id], "utilization_percentage")[run_id]
    smact = load_devices(engine, [run_id], "sm_active")[run_id]
    only_gpu1 = load_devices(engine, [run_id], "utilization_percentage", gpus=[1])[run_id]
    present = present_metrics(engine, [run_id])
    engine.dispose()
    assert [d.label for d in util] == ["node_0 · GPU 0", "node_0 · GPU 1", "node_1 · GPU 0", "node_1 · GPU 1"]
    assert [float(v[1][0]) for v in util.values()] == [10.0, 11.0, 20.0, 21.0]
    assert {d.label: float(v[1][0]) for d, v in smact.items()} == {"GPU 0 · MIG 1": pytest.approx(0.1), "GPU 0 · MIG 2": pytest.approx(0.6)}
    assert [d.label for d in only_gpu1] == ["node_0 · GPU 1", "node_1 · GPU 1"]
    assert ("utilization_percentage", 1) in present and ("sm_active", 0) in present


def test_radt_s_own_key_wins_over_radT_s_for_the_same_gpu(store_uri):
    run_id = _run(store_uri, "both")
    _write(store_uri, run_id, "system/gpu_0_sm_active", [0.4] * 3)
    _write(store_uri, run_id, "DCGMI - SN Active", [0.9] * 3)
    _write(store_uri, run_id, "system/gpu_1_sm_active", [0.2] * 3)
    engine = make_read_engine(store_uri)
    found = load_devices(engine, [run_id], "sm_active")[run_id]
    engine.dispose()
    assert {d.gpu: float(np.nanmean(v[1])) for d, v in found.items()} == {0: pytest.approx(0.4), 1: pytest.approx(0.2)}
