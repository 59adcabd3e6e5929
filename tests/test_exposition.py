"""`radt monitor --prometheus-port`'s /metrics read back with prometheus_client's own parser, in process: a run name
with a quote, a backslash and a newline comes back whole, and each sample keeps the millisecond radt stamped it with."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from radt.collectors.monitor.exposition import Exposition, Training, bind
from radt.points import Point
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
    host = samples["radt_system_memory_usage_megabytes"]
    assert host.labels == {"Hostname": "node-7", "monitor_run": "monitor-run"} and host.value == 512.0
    # the text says each sample's own millisecond, as radt wrote it to the store
    stamps = {line.split("{", 1)[0]: line.rsplit(" ", 1)[1] for line in text.splitlines() if not line.startswith("#")}
    assert stamps == {"radt_sm_active": str(NOW_MS), "radt_system_memory_usage_megabytes": str(Y2038_MS)}
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
