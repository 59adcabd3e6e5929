"""`radt monitor --prometheus-port`'s /metrics read back with prometheus_client's own parser, in process: a run name
with a quote, a backslash and a newline comes back whole, and each sample keeps the millisecond radt stamped it with."""

from __future__ import annotations

import re
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from radt.catalogue import METRICS, MetricName, key
from radt.collectors.monitor.exposition import PROCESS_GAUGES, Exposition, Training, bind
from radt.collectors.sources.gpushare import ProcessRow
from radt.collectors.sources.promql import Series, Wanted, keyed_samples
from radt.points import Point
from tests.support import promtool
from tests.support.ports import free_port

UUID0 = "GPU-00008a1c-0d4e-4f0b-8e6a-000000000000"
RUN_NAME = 'resnet "A" \\ 1\nsecond line'
NOW_MS = 1_780_000_000_123
Y2038_MS = 2_147_483_648_003  # 2**31 s + 3 ms: ms / 1000 * 1000 is 2147483648002.9998 here


@pytest.fixture
def exposition() -> Iterator[Exposition]:
    served = bind("127.0.0.1", free_port(), "node-7", lambda line: None)
    training = Training("run-1", RUN_NAME, "vision", "resnet", [{"series": "gpu_0", "index": 0, "uuid": UUID0}])
    served.start(lambda: [training], lambda: "monitor-run", {"gpu_0": UUID0})
    try:
        yield served
    finally:
        served.stop()


def _get(exposition: Exposition, path: str) -> str:
    port = exposition.server.server_address[1]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
        return response.read().decode()


def test_a_scrape_reads_back_the_run_name_and_the_millisecond_of_each_sample(exposition):
    exposition.put([Point("system/gpu_0_sm_active", 0.25, NOW_MS, 1), Point("system/system_memory_usage_megabytes", 512.0, Y2038_MS, 1)])
    text = _get(exposition, "/metrics")
    samples = {s.name: s for family in text_string_to_metric_families(text) for s in family.samples}

    gpu = samples["radt_sm_active"]
    assert gpu.labels == {
        "Hostname": "node-7",
        "monitor_run": "monitor-run",
        "gpu": "0",
        "UUID": UUID0,
        "run_id": "run-1",
        "run_name": RUN_NAME,
        "experiment": "vision",
        "workload": "resnet",
    }
    assert gpu.value == 0.25
    host = samples["radt_system_memory_usage_bytes"]
    assert host.labels == {"Hostname": "node-7", "monitor_run": "monitor-run"} and host.value == 512e6  # stored in MB
    # the text says each sample's own millisecond, as radt wrote it to the store
    stamps = {line.split("{", 1)[0]: line.rsplit(" ", 1)[1] for line in text.splitlines() if not line.startswith("#")}
    assert stamps == {"radt_sm_active": str(NOW_MS), "radt_system_memory_usage_bytes": str(Y2038_MS)}
    assert "# TYPE radt_sm_active gauge" in text


def test_no_reading_yet_is_an_empty_page_and_other_paths_are_404(exposition):
    assert _get(exposition, "/metrics") == ""
    with pytest.raises(urllib.error.HTTPError) as refused:
        _get(exposition, "/")
    assert refused.value.code == 404


def test_the_port_in_use_is_one_usage_error(exposition):
    from radt.collectors._common import UsageError

    port = exposition.server.server_address[1]
    with pytest.raises(UsageError, match=f"^port {port} is in use; choose another --prometheus-port$"):
        bind("127.0.0.1", port, "node-7", lambda line: None)


def test_a_nan_reading_is_served_as_nan(exposition):
    exposition.put([Point("system/gpu_0_sm_active", float("nan"), int(time.time() * 1000), 1)])
    (family,) = text_string_to_metric_families(_get(exposition, "/metrics"))
    assert family.samples[0].value != family.samples[0].value  # NaN


# --- Prometheus' conventions (#56) ----------------------------------------------------------------------------------

NODE = "node-8"  # a node of a run of several nodes: system/node-8/... keys, a `node` label


@pytest.fixture
def everything() -> Iterator[Exposition]:
    """The exposition with every catalogue metric: the host's, a whole GPU's with the training run on it, a MIG slice's,
    another node's, and each process on GPU 0."""
    served = bind("127.0.0.1", free_port(), "node-7", lambda line: None)
    training = Training("run-1", "resnet", "vision", "resnet", [{"series": "gpu_0", "index": 0, "uuid": UUID0}], frozenset({111}))
    rows = [ProcessRow(0, 111, 35.0, 12.0, NOW_MS), ProcessRow(0, 222, 25.0, 4.0, NOW_MS)]
    served.start(lambda: [training], lambda: "monitor-run", {"gpu_0": UUID0, "gpu_1_mig_3": "MIG-00000000-0000-0000-0000-000000000003"}, lambda: rows)
    points = []
    for metric in METRICS.values():
        if metric.per_gpu:
            where = [key(metric.name, 0), key(metric.name, 1, mig=3), key(metric.name, 0, node=NODE)]
        else:
            where = [key(metric.name), key(metric.name, node=NODE)]
        points += [Point(k, 1.5, NOW_MS, 1) for k in where]
    served.put(points)
    try:
        yield served
    finally:
        served.stop()


def test_promtool_finds_no_problem_in_the_exposition_of_every_metric(everything):
    """`promtool check metrics` said `radt_gpu_memory_usage_megabytes use base unit "bytes" instead of "megabytes"` (exit
    3) for each memory gauge: every line it prints is a problem, and there must be none."""
    text = _get(everything, "/metrics")
    served = {family.name for family in text_string_to_metric_families(text)}
    assert len(served) == len(METRICS) + len(PROCESS_GAUGES)  # every metric is in what promtool reads
    checked = promtool.check("metrics", stdin=text)
    assert (checked.returncode, checked.stdout + checked.stderr) == (0, "")


def test_every_family_has_help_and_type_and_counters_end_in_total(everything):
    text = _get(everything, "/metrics")
    names = {line.split("{", 1)[0].split(" ", 1)[0] for line in text.splitlines() if line and not line.startswith("#")}
    helped = {line.split(" ")[2] for line in text.splitlines() if line.startswith("# HELP ")}
    typed = {line.split(" ")[2]: line.split(" ")[3] for line in text.splitlines() if line.startswith("# TYPE ")}
    assert names == helped == set(typed)
    assert {name for name, kind in typed.items() if kind == "counter"} == {
        "radt_gpu_energy_joules_total",
        "radt_gpu_ecc_errors_corrected_total",
        "radt_gpu_ecc_errors_uncorrected_total",
        "radt_network_receive_bytes_total",
        "radt_network_transmit_bytes_total",
    }
    assert not [name for name in names if re.search(r"_(megabytes|percentage|mhz)$", name)]


def test_each_value_is_served_in_prometheus_base_unit(exposition):
    """radt stores megabytes (10^6 bytes, MLflow's), percentages and MHz; Prometheus gets bytes, 0-1 ratios and hertz."""
    stored = {
        key(MetricName.MEMORY_USAGE_MEGABYTES, 0): 40_537.5,
        key(MetricName.UTILIZATION_PERCENTAGE, 0): 70.0,
        key(MetricName.SM_CLOCK_MHZ, 0): 1410.0,
        key(MetricName.ENERGY_JOULES, 0): 1234.5,
        key(MetricName.SYSTEM_MEMORY_USAGE_MEGABYTES): 512.0,
        key(MetricName.NETWORK_RECEIVE_MEGABYTES): 3.25,
        key(MetricName.PROCESS_CPU_UTILIZATION_PERCENTAGE): 250.0,
    }
    exposition.put([Point(k, v, NOW_MS, 1) for k, v in stored.items()])
    text = _get(exposition, "/metrics")
    samples = {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples}
    assert samples == {
        "radt_gpu_memory_usage_bytes": 40_537_500_000.0,
        "radt_gpu_utilization_ratio": 0.7,
        "radt_gpu_sm_clock_hertz": 1_410_000_000.0,
        "radt_gpu_energy_joules_total": 1234.5,
        "radt_system_memory_usage_bytes": 512_000_000.0,
        "radt_network_receive_bytes_total": 3_250_000.0,
        "radt_process_cpu_utilization_ratio": 2.5,  # 1 = one core
    }
    assert "# HELP radt_gpu_memory_usage_bytes GPU memory (bytes)" in text
    assert "# HELP radt_process_cpu_utilization_ratio Run CPU: the run's processes (1 = one core)" in text
    assert "# TYPE radt_gpu_energy_joules_total counter" in text


def test_what_the_monitor_serves_the_prometheus_listener_reads_back_as_stored_and_the_old_names_too(everything):
    """radt monitor is a node's NVML/GPM exporter: its series, scraped in base units, come back in the catalogue's units
    under the keys the monitor stored; series a Prometheus scraped under the names before #56 (radt_gpu_*_megabytes,
    *_percentage) still come back."""
    text = _get(everything, "/metrics")
    found = [
        Series({"__name__": s.name, **s.labels}, [(NOW_MS, s.value)])
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.labels.get("gpu") == "0" and "node" not in s.labels and "pid" not in s.labels
    ]
    back = keyed_samples(found, Wanted(gpus=[0]))
    per_gpu = [m.name for m in METRICS.values() if m.per_gpu]
    assert back == {key(name, 0): [(NOW_MS, pytest.approx(1.5))] for name in per_gpu}
    old = [
        Series({"__name__": "radt_gpu_memory_usage_megabytes", "Hostname": "node-7", "gpu": "0"}, [(NOW_MS, 40_537.5)]),
        Series({"__name__": "radt_gpu_utilization_percentage", "Hostname": "node-7", "gpu": "0"}, [(NOW_MS, 70.0)]),
        Series({"__name__": "radt_gpu_energy_joules", "Hostname": "node-7", "gpu": "0"}, [(NOW_MS, 1234.5)]),
    ]
    assert keyed_samples(old, Wanted(gpus=[0])) == {
        key(MetricName.MEMORY_USAGE_MEGABYTES, 0): [(NOW_MS, 40_537.5)],
        key(MetricName.UTILIZATION_PERCENTAGE, 0): [(NOW_MS, 70.0)],
        key(MetricName.ENERGY_JOULES, 0): [(NOW_MS, 1234.5)],
    }
