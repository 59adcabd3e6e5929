"""dcgm-exporter's per-process series (its --kubernetes-virtual-gpus mode, pods time-sharing a GPU), scraped by a real
Prometheus: the device's series stay the device's own, and a run that knows its pod gets its pod's own share
(run_sm_utilization_percentage, process_memory_megabytes), in the prometheus listener and in `radt import --prometheus`."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from radt.catalogue import EXPORTER_METRICS, MIB
from radt.cli import main as radt_main
from radt.collectors.sources.base import SamplingContext
from radt.collectors.sources.prometheus import Backfill, PrometheusSource, backfill
from radt.collectors.sources.promql import owners
from tests.support import prometheus as prom
from tests.support.dcgm_exporter import COLUMNS, DcgmExporter, Device, Pod
from tests.support.polling import wait_for

LOG = Path(__file__).parent / "fixtures" / "real-tool-logs" / "mnist_dcgmi_dmon_18fields.txt"
NEW, OLD = "node-k", "node-o"  # an exporter writing pod/namespace/container, one writing pod_name/... (--use-old-namespace)
PODS = (Pod("train-a", 0.6, uid="3f1c"), Pod("train-b", 0.25, uid="9d2e"))  # two pods on GPU 0, different loads
SCRAPES = 6
UTIL, FB = "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED"
# every metric the stand-in serves, at the device's own value: GPU_UTIL and FB_USED beside the pods', the others per pod only
DEVICE_KEYS = {f"system/gpu_0_{EXPORTER_METRICS[m][0]}": (m, EXPORTER_METRICS[m][1]) for m in COLUMNS}
SHARE_KEYS = {"system/gpu_0_run_sm_utilization_percentage": (UTIL, 1.0), "system/gpu_0_process_memory_megabytes": (FB, MIB)}


@pytest.fixture(scope="module")
def served():
    """({host: exporter}, Prometheus, time before the first scrape in ms) once SCRAPES scrapes of each are stored."""
    start_ms = int(time.time() * 1000)
    with prom.taken() as server:
        new = DcgmExporter(LOG, [Device(NEW, 0, 0, used_mib=20000, pods=PODS)], start=5, port=server.ports[0])
        old = DcgmExporter(LOG, [Device(OLD, 0, 0, used_mib=30000, pods=PODS)], start=5, port=server.ports[1], old_pod_labels=True)
        with new, old:
            for host in (NEW, OLD):
                server.wait_samples(f'{UTIL}{{Hostname="{host}"}}[1h]', SCRAPES)
            yield {NEW: new, OLD: old}, server, start_ms


def check(exporter: DcgmExporter, got: dict[str, dict[int, float]], pod: Pod | None) -> None:
    """The device's keys hold the device's own values at every scrape; with `pod`, the share keys hold that pod's."""
    device = exporter.devices[0]
    wanted = DEVICE_KEYS | (SHARE_KEYS if pod else {})
    assert set(got) == set(wanted), sorted(got)
    for where, (metric, scale) in wanted.items():
        assert len(got[where]) >= SCRAPES - 1, (where, got[where])
        for stamp, value in got[where].items():
            frame = exporter.frame_at(stamp)
            assert frame is not None, (where, stamp)
            raw = exporter.value(device, metric, frame) if where in DEVICE_KEYS else exporter.pod_value(device, pod, metric, frame)
            assert value == raw * scale, (where, stamp, value, raw)


def keyed(points) -> dict[str, dict[int, float]]:
    out: dict[str, dict[int, float]] = {}
    for point in points:
        assert point.timestamp not in out.setdefault(point.key, {}), point  # one value per scrape: never two series joined
        out[point.key][point.timestamp] = point.value
    return out


@pytest.mark.parametrize("host", [NEW, OLD])
def test_backfill_without_a_pod_reads_the_device_only(served, host):
    exporters, server, start_ms = served
    points = backfill(Backfill(server.url, host, [0], start_ms, int(time.time() * 1000), 1.0))
    check(exporters[host], keyed(points), None)


@pytest.mark.parametrize("host", [NEW, OLD])
@pytest.mark.parametrize("pod", PODS, ids=lambda p: p.name)
def test_backfill_with_the_runs_pod_adds_its_own_share(served, host, pod):
    exporters, server, start_ms = served
    conflicts: list[str] = []
    points = backfill(Backfill(server.url, host, [0], start_ms, int(time.time() * 1000), 1.0, owners=owners({}, pod.name)), conflicts=conflicts)
    check(exporters[host], keyed(points), pod)
    assert conflicts == []


def test_a_pod_not_on_the_gpu_gets_no_share_and_the_device_still(served):
    exporters, server, start_ms = served
    points = backfill(Backfill(server.url, NEW, [0], start_ms, int(time.time() * 1000), 1.0, owners=owners({}, "serve-x")))
    got = keyed(points)
    assert not set(got) & set(SHARE_KEYS)
    device = exporters[NEW].devices[0]
    for stamp, value in got["system/gpu_0_utilization_percentage"].items():  # the device-level series is no pod's
        assert value == exporters[NEW].value(device, UTIL, exporters[NEW].frame_at(stamp))


def test_the_runs_pod_is_the_setting_else_the_pods_host_name(monkeypatch):
    monkeypatch.delenv("RADT_PROMETHEUS_POD", raising=False)
    assert owners({"HOSTNAME": "train-a"}).get("pod") is None  # not in Kubernetes: no pod
    assert owners({"HOSTNAME": "train-a", "KUBERNETES_SERVICE_HOST": "10.0.0.1"})["pod"] == "train-a"
    assert owners({"HOSTNAME": "train-a", "KUBERNETES_SERVICE_HOST": "10.0.0.1"}, "train-b")["pod_name"] == "train-b"
    monkeypatch.setenv("RADT_PROMETHEUS_POD", "train-c")
    assert owners({})["pod"] == "train-c"


def test_listener_in_a_pod_reads_the_device_and_its_pods_share(served, monkeypatch):
    exporters, server, _ = served
    monkeypatch.delenv("RADT_PROMETHEUS_POD", raising=False)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("HOSTNAME", PODS[1].name)
    lines: list[str] = []
    source = PrometheusSource(server.url, host=NEW, report=lines.append, uuids={})
    source.open(SamplingContext(interval=1.0, devices=[0]))
    got: dict[str, dict[int, float]] = {}

    def enough() -> bool:
        for where, value, stamp in source.readings(int(time.time() * 1000)):
            assert stamp not in got.setdefault(where, {}), (where, stamp)
            got[where][stamp] = value
        return set(got) >= set(DEVICE_KEYS | SHARE_KEYS) and all(len(got[k]) >= SCRAPES for k in DEVICE_KEYS | SHARE_KEYS)

    wait_for(enough, timeout=20, what=lambda: f"{SCRAPES} scrapes of every key ({sorted(got)})", interval=0.2)
    check(exporters[NEW], got, PODS[1])
    assert lines == []


def test_import_with_pod_fills_the_runs_share(served, store_uri, capsys):
    exporters, server, start_ms = served
    client = MlflowClient(tracking_uri=store_uri)
    runs = {}
    for pod in (None, PODS[0]):
        run_id = client.create_run(client.create_experiment(f"pods-{pod and pod.name}"), start_time=start_ms).info.run_id
        client.set_terminated(run_id, "FINISHED", end_time=int(time.time() * 1000))
        options = ["--pod", pod.name] if pod else []
        code = radt_main(["import", "--prometheus", server.url, "--run", run_id, "--store", store_uri, "--host", OLD, "--gpus", "0", *options])
        assert code == 0, capsys.readouterr().err
        runs[pod] = run_id
    for pod, run_id in runs.items():
        got = {where: {m.timestamp: m.value for m in client.get_metric_history(run_id, where)} for where in client.get_run(run_id).data.metrics}
        check(exporters[OLD], got, pod)


def test_import_refuses_a_malformed_pod(served, store_uri, capsys):
    _, server, _ = served
    with pytest.raises(SystemExit) as exits:  # argparse exits
        radt_main(["import", "--prometheus", server.url, "--run", "x", "--store", store_uri, "--pod", "no such pod"])
    err = capsys.readouterr().err
    assert exits.value.code == 2 and err.count("\n") == 1 and "--pod 'no such pod' is not a Kubernetes pod's name" in err, err
