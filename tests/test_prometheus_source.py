"""The `prometheus` source against a real Prometheus scraping a dcgm-exporter stand-in that serves a recorded
`dcgmi dmon` log: what it reads equals what was served at each scrape, only for this node's and run's GPUs."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from radt.catalogue import MIB
from radt.collectors.run.sampler import Sampler
from radt.collectors.sources.base import SamplingContext, SourceUnavailable
from radt.collectors.sources.listeners import make_source, parse_listeners
from radt.collectors.sources.prometheus import Backfill, PrometheusSource, backfill, final_backfill
from radt.collectors.sources.promql import PromError, query_range
from tests.support import prometheus as prom
from tests.support.dcgm_exporter import COLUMNS, DcgmExporter, Device
from tests.support.polling import wait_for
from tests.support.ports import free_port

LOG = Path(__file__).parent / "fixtures" / "real-tool-logs" / "mnist_dcgmi_dmon_18fields.txt"
HOST = "node-a"
# exporter metric -> (the catalogue key's suffix radt's nvml/dcgm sources write, scale from the exporter's unit)
EXPECTED_KEYS = {
    "DCGM_FI_PROF_SM_ACTIVE": ("sm_active", 1.0),
    "DCGM_FI_PROF_SM_OCCUPANCY": ("sm_occupancy", 1.0),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("gr_engine_active", 1.0),
    "DCGM_FI_PROF_DRAM_ACTIVE": ("dram_active", 1.0),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("tensor_active", 1.0),
    "DCGM_FI_DEV_POWER_USAGE": ("power_usage_watts", 1.0),
    "DCGM_FI_DEV_FB_USED": ("memory_usage_megabytes", MIB),
    "DCGM_FI_DEV_GPU_UTIL": ("utilization_percentage", 1.0),
}
NODE_A = [Device(HOST, gpu, gpu) for gpu in range(5)]
SLICES = [Device(HOST, 1, 4, gi=2), Device(HOST, 1, 3, gi=5, profile="2g.20gb")]
NODE_B = [Device("node-b", 0, 2), Device("node-b", 7, 0)]  # another node's GPU 0 (other values) and a GPU 7
SCRAPES = 6


@pytest.fixture(scope="module")
def served():
    """(exporter, Prometheus, time before the first scrape in ms) once at least SCRAPES scrapes are stored."""
    start_ms = int(time.time() * 1000)
    until = f'DCGM_FI_PROF_SM_ACTIVE{{Hostname="{HOST}",gpu="0",GPU_I_ID=""}}[1h]'
    with prom.serving(LOG, NODE_A + SLICES + NODE_B, until, SCRAPES) as (exporter, server):
        yield exporter, server, start_ms


def expected(exporter: DcgmExporter, device: Device, metric: str, stamp: int) -> float | None:
    frame = exporter.frame_at(stamp)
    assert frame is not None, f"no scrape served near {stamp}: {exporter.served}"
    value = exporter.value(device, metric, frame)
    return None if value is None else value * EXPECTED_KEYS[metric][1]


def key_of(device: Device, metric: str, gpu: int | None = None) -> str:
    mig = f"mig_{device.gi}_" if device.gi is not None else ""
    return f"system/gpu_{device.gpu if gpu is None else gpu}_{mig}{EXPECTED_KEYS[metric][0]}"


def by_key(points) -> dict[str, list]:
    out: dict[str, list] = {}
    for point in points:
        out.setdefault(point.key, []).append(point)
    return out


def check_points(exporter: DcgmExporter, points, devices: dict[str, tuple[Device, str]]) -> None:
    """Every point is the value served at its scrape; each key's timestamps are distinct (no second series merged in)."""
    grouped = by_key(points)
    assert set(grouped) == set(devices)
    for where, series in grouped.items():
        device, metric = devices[where]
        stamps = [p.timestamp for p in series]
        assert len(stamps) == len(set(stamps)) >= SCRAPES, (where, stamps)
        assert [p.value for p in series] == [expected(exporter, device, metric, t) for t in stamps], where


def served_keys(exporter: DcgmExporter, devices: list[Device], gpu: dict[Device, int] | None = None) -> dict[str, tuple[Device, str]]:
    """The keys the run's devices must have: every exporter metric the log has a value for (not FB, not GPU 3's N/A power)."""
    out = {}
    for device in devices:
        for metric in COLUMNS:
            if any(exporter.value(device, metric, f) is not None for f in range(len(exporter.frames))):
                out[key_of(device, metric, (gpu or {}).get(device))] = (device, metric)
    return out


def test_backfill_equals_what_was_served_for_the_runs_gpus_only(served):
    exporter, server, start_ms = served
    points = backfill(Backfill(server.url, HOST, [0, 2], start_ms, int(time.time() * 1000), 1.0))
    keys = served_keys(exporter, [NODE_A[0], NODE_A[2]])
    assert "system/gpu_0_sm_active" in keys and "system/gpu_0_memory_usage_megabytes" not in keys
    check_points(exporter, points, keys)  # node-b's GPU 0 and GPU 7, GPUs 1, 3, 4 and the slices: absent
    smact = [p.value for p in points if p.key == "system/gpu_0_sm_active"]
    assert any(v > 0 for v in smact), smact  # the training's real activity, not only idle zeros
    assert all(p.step == round((p.timestamp - start_ms) / 1000) for p in points)
    # the numbers Prometheus itself holds for GPU 0
    data = server.api("/api/v1/query", query=f'DCGM_FI_DEV_POWER_USAGE{{Hostname="{HOST}",gpu="0"}}[1h]')
    held = [(round(float(t) * 1000), float(v)) for t, v in data["result"][0]["values"]]
    mine = [(p.timestamp, p.value) for p in points if p.key == "system/gpu_0_power_usage_watts"]
    assert mine == [(t, v) for t, v in held if start_ms <= t <= mine[-1][0]]
    # query_range resamples at its step: every value one that a scrape stored
    resampled = query_range(server.url, f'DCGM_FI_DEV_POWER_USAGE{{Hostname="{HOST}",gpu="0"}}', start_ms / 1000, time.time(), prom.SCRAPE_MS / 1000)
    assert len(resampled) == 1 and len(resampled[0].samples) >= SCRAPES - 1  # the step grid need not meet the first scrape
    assert {v for _, v in resampled[0].samples} <= {v for _, v in held}


def test_backfill_maps_mig_instances_and_uuids(served):
    exporter, server, start_ms = served
    end_ms = int(time.time() * 1000)
    points = backfill(Backfill(server.url, HOST, [1], start_ms, end_ms, 1.0, slices=[(1, 2)]))
    check_points(exporter, points, served_keys(exporter, [NODE_A[1], SLICES[0]]))  # GI 5 is not the run's
    assert "system/gpu_1_mig_2_sm_active" in {p.key for p in points}
    # the exporter's UUID names the GPU where its `gpu` label disagrees with NVML's index
    uuids = {NODE_A[3].uuid: 6}
    points = backfill(Backfill(server.url, HOST, [6], start_ms, end_ms, 1.0, uuids=uuids))
    check_points(exporter, points, served_keys(exporter, [NODE_A[3]], gpu={NODE_A[3]: 6}))


def test_another_nodes_series_stay_its_own(served):
    exporter, server, start_ms = served
    end_ms = int(time.time() * 1000)
    points = backfill(Backfill(server.url, "node-b", [0, 7], start_ms, end_ms, 1.0))
    check_points(exporter, points, served_keys(exporter, NODE_B))  # node-b's GPU 0 has GPU 2's values, not node-a's
    # by the scrape target instead: both nodes sit behind the one exporter, so GPU 0 has two series; never merged
    conflicts: list[str] = []
    points = backfill(Backfill(server.url, "127.0.0.1", [0, 7], start_ms, end_ms, 1.0, host_label="instance"), conflicts=conflicts)
    assert {p.key for p in points} == set(served_keys(exporter, NODE_B))
    assert conflicts and all(c.startswith("system/gpu_0_") and "Hostname=node-a" in c and "Hostname=node-b" in c for c in conflicts)
    for series in by_key(points).values():
        assert len({p.timestamp for p in series}) == len(series)


def test_source_reads_each_new_scrape_of_this_node_once_at_its_own_time(served):
    """Each tick gives every scrape stored since the last one, stamped with the scrape's time: nothing at the tick's time,
    nothing twice, nothing from before the run."""
    exporter, server, _ = served
    lines: list[str] = []
    source = PrometheusSource(server.url, host=HOST, report=lines.append, uuids={})
    source.open(SamplingContext(interval=1.0, devices=[0], slices=[(1, 2)]))
    keys = served_keys(exporter, [NODE_A[0], SLICES[0]])
    got: list = []
    wait_for(
        lambda: got.extend(source.readings(int(time.time() * 1000))) or {r.key for r in got} >= set(keys) and got, timeout=15, what="a scrape of every key"
    )
    wait_for(lambda: got.extend(source.readings(int(time.time() * 1000))) or len(got) >= 3 * len(keys), timeout=15, what="three scrapes of every key")
    assert {r.key for r in got} == set(keys)
    for where in keys:
        stamps = [r.timestamp for r in got if r.key == where]
        assert stamps == sorted(set(stamps)) and stamps[0] >= source.since_ms, (where, stamps, source.since_ms)
    for where, value, stamp in got:
        assert value == expected(exporter, *keys[where], stamp), (where, stamp)
    facts = source.describe()
    assert lines == [] and facts["errors"] == []
    assert "DCGM_FI_PROF_SM_ACTIVE" in facts["read"] and "DCGM_FI_DEV_FB_USED" in facts["not_found"]


def test_a_series_two_listeners_read_is_kept_from_the_first_named(served):
    """Two sources giving one key (nvml's and the exporter's power): the sampler keeps the first-named one's points only,
    at the second's own timestamps nothing, and says so once."""
    exporter, server, _ = served
    lines: list[str] = []
    first = PrometheusSource(server.url, host=HOST, report=lines.append, uuids={})
    second = PrometheusSource(server.url, host="node-b", report=lines.append, uuids={})  # node-b's GPU 0: other values, same keys
    for source in (first, second):
        source.open(SamplingContext(devices=[0, 7]))
    points: list = []
    sampler = Sampler([first, second], 0.1, points.extend, report=lines.append)
    wait_for(lambda: sampler.tick() or len({p.key for p in points}) > len(served_keys(exporter, [NODE_A[0]])), timeout=15, what="both sources' keys")
    node_a, node_b = served_keys(exporter, [NODE_A[0]]), served_keys(exporter, [NODE_B[1]])  # node-b's GPU 7 only it has
    assert {p.key for p in points} == set(node_a) | set(node_b)
    for point in points:
        device, metric = node_a.get(point.key) or node_b[point.key]
        assert point.value == expected(exporter, device, metric, point.timestamp), point
    shared = [line for line in lines if "both read" in line]  # besides: node-a has no GPU 7
    assert len(shared) == 1 and shared[0].startswith("radt: listeners 'prometheus' and 'prometheus' both read system/gpu_0_"), lines
    assert set(sampler.describe()["prometheus"]) >= {"url", "read"}
    assert sampler.owners.shadowed["prometheus"]["prometheus"] == set(node_a)


def test_problems_are_one_line_each_and_never_raise(served):
    exporter, server, _ = served
    lines: list[str] = []
    down = PrometheusSource(f"http://127.0.0.1:{free_port()}", host=HOST, report=lines.append, uuids={})
    down.open(SamplingContext(devices=[0]))
    points = []
    sampler = Sampler([down], 0.01, points.extend, report=lines.append)
    for _ in range(3):
        sampler.tick()
    assert points == [] and sampler.sources == [down]
    assert len(lines) == 1 and lines[0].startswith("radt: listener 'prometheus': Prometheus at") and "did not answer" in lines[0], lines
    with pytest.raises(PromError, match="did not answer"):
        backfill(Backfill(down.url, HOST, [0], 0, 1000, 1.0))

    refused = PrometheusSource(f"http://{exporter.target}", host=HOST, report=lines.append, uuids={})  # no API there
    refused.open(SamplingContext(devices=[0]))
    assert refused.sample() == {} and refused.sample() == {}
    assert len(lines) == 2 and "refused the query (HTTP 404" in lines[1], lines

    missing = PrometheusSource(server.url, host=HOST, report=lines.append, uuids={})
    missing.open(SamplingContext(devices=[0, 9]))
    wait_for(lambda: "system/gpu_0_sm_active" in missing.sample(), timeout=10, what="a scrape after open")
    assert len(lines) == 3 and "no dcgm-exporter series for GPU 9 on node-a" in lines[2], lines
    assert missing.describe()["errors"] == [lines[2]]


def test_listener_name_url_and_host_label_settings(monkeypatch):
    assert parse_listeners("nvml+prometheus") == ["nvml", "prometheus"]
    monkeypatch.delenv("RADT_PROMETHEUS_URL", raising=False)
    with pytest.raises(SourceUnavailable, match="--prometheus http://<server>:9090 \\(or RADT_PROMETHEUS_URL\\)"):
        make_source("prometheus").open(SamplingContext())
    monkeypatch.setenv("RADT_PROMETHEUS_URL", "http://prom.example:9090/")
    source = make_source("prometheus")
    assert source.url == "http://prom.example:9090" and source.host_label == "Hostname"
    monkeypatch.setenv("RADT_PROMETHEUS_HOST_LABEL", "kubernetes_node")  # a Kubernetes relabelling's node label
    source = make_source("prometheus")
    source.open(SamplingContext(devices=[0]))
    assert source.host_label == "kubernetes_node" and f'kubernetes_node="{source.host}"' in source.selector
    monkeypatch.setenv("RADT_PROMETHEUS_HOST_LABEL", "node-name")
    with pytest.raises(SourceUnavailable, match="RADT_PROMETHEUS_HOST_LABEL='node-name' is not a Prometheus label name"):
        make_source("prometheus").open(SamplingContext())
    monkeypatch.setenv("RADT_PROMETHEUS_URL", "prom.example:9090")
    monkeypatch.delenv("RADT_PROMETHEUS_HOST_LABEL")
    with pytest.raises(SourceUnavailable, match="RADT_PROMETHEUS_URL 'prom.example:9090' is not a Prometheus server's http\\(s\\) URL"):
        make_source("prometheus").open(SamplingContext())


def test_final_backfill_adds_exactly_the_scrapes_a_tick_too_late_missed(served):
    """A tick that comes more than the window after the last (Prometheus away for minutes, a suspended host) misses
    scrapes; the source remembers which stretches it returned whole, and the run's end reads exactly the rest."""
    exporter, server, _ = served
    source = PrometheusSource(server.url, host=HOST, report=print, uuids={})
    source.open(SamplingContext(interval=0.5, devices=[0]))
    source.window = 2  # seconds: short, so that a gap of a few scrapes stands for an outage
    key = "system/gpu_0_sm_active"
    got: list = []
    wait_for(lambda: got.extend(source.readings(int(time.time() * 1000))) or len([r for r in got if r.key == key]) >= 3, timeout=20, what="3 scrapes")

    def scrapes_after(stamp: int) -> int:
        data = server.api("/api/v1/query", query=f'DCGM_FI_PROF_SM_ACTIVE{{Hostname="{HOST}",gpu="0",GPU_I_ID=""}}[30s]')
        return sum(1 for t, _ in data["result"][0]["values"] if round(float(t) * 1000) > stamp)

    wait_for(lambda: scrapes_after(source._last[key]) >= 5, timeout=20, what="5 scrapes the source has not read")  # more than the window
    got += source.readings(int(time.time() * 1000))
    assert len(source.returned[key]) == 2  # two stretches: before and after the gap
    end_ms = int(time.time() * 1000)
    late = final_backfill(source, source.since_ms, end_ms)
    for where in {r.key for r in got}:
        live = [r.timestamp for r in got if r.key == where]
        added = [p.timestamp for p in late if p.key == where]
        assert added and not set(added) & set(live), where  # the missed scrapes, none twice
        held = [p.timestamp for p in backfill(Backfill(server.url, HOST, [0], source.since_ms, end_ms, 0.5)) if p.key == where]
        assert sorted(live + added) == held, where  # together: every scrape Prometheus holds for the run


def test_the_source_asks_prometheus_once_per_scrape_not_once_per_tick(served, monkeypatch):
    """Ticking far faster than the exporter is scraped (0.05 s against 0.5 s) costs Prometheus about one query per scrape:
    the source learns the scrape interval and asks only once a new scrape can be there; it still reads every scrape."""
    import radt.collectors.sources.prometheus as module

    _exporter, server, _ = served
    asked: list[str] = []
    real = module.query
    monkeypatch.setattr(module, "query", lambda *a, **k: asked.append(a[1]) or real(*a, **k))
    source = PrometheusSource(server.url, host=HOST, report=print, uuids={})
    source.open(SamplingContext(interval=0.05, devices=[0]))
    key, got, ticks = "system/gpu_0_sm_active", [], []

    def tick(scrapes: int):
        ticks.append(1)
        got.extend(source.readings(int(time.time() * 1000)))
        return len([r for r in got if r.key == key]) >= scrapes

    wait_for(lambda: tick(2) and source.scrape_ms, timeout=30, interval=0.05, what="two scrapes: the interval learnt")
    assert 0.8 * prom.SCRAPE_MS <= source.scrape_ms <= 1.2 * prom.SCRAPE_MS, source.scrape_ms  # Prometheus's interval, learnt
    asked.clear()
    ticks.clear()
    wait_for(lambda: tick(6), timeout=30, interval=0.05, what="4 scrapes more")
    assert len(asked) <= 4 * 3 and len(asked) * 4 < len(ticks), (len(asked), len(ticks))  # was one query a tick
    stamps = [r.timestamp for r in got if r.key == key]
    held = [p.timestamp for p in backfill(Backfill(server.url, HOST, [0], source.since_ms, stamps[-1], 1.0)) if p.key == key]
    assert stamps == held  # none missed, none twice


def test_a_run_ending_while_the_exporter_answers_keeps_that_scrape(served):
    """Prometheus stamps a scrape when it begins it and stores it once the exporter has answered. A run that ends in
    between read its end before the scrape was stored, and lost that scrape, though Prometheus holds it inside the run's
    time (seen once in a full suite on 4 workers). The end now waits for it."""
    exporter, server, _ = served
    source = PrometheusSource(server.url, host=HOST, report=print, uuids={})
    source.open(SamplingContext(interval=0.5, devices=[0]))
    key = "system/gpu_0_sm_active"
    got: list = []
    wait_for(
        lambda: got.extend(source.readings(int(time.time() * 1000))) or (len([r for r in got if r.key == key]) >= 2 and source.scrape_ms),
        timeout=20,
        what="2 scrapes",
    )
    slow_from = int(time.time() * 1000)
    # the next scrape is stored 0.3 s after Prometheus stamped it (it is dropped past its timeout: the 0.5 s interval)
    exporter.delay_s = 0.6 * prom.SCRAPE_MS / 1000
    try:
        answered = len(exporter.served)
        wait_for(lambda: len(exporter.served) > answered, timeout=10, interval=0.01, what="a slow scrape begun")
        end_ms = int(time.time() * 1000)  # the run ends while the exporter is still answering
        late = final_backfill(source, source.since_ms, end_ms)
    finally:
        exporter.delay_s = 0.0

    def held() -> list[int]:
        return [p.timestamp for p in backfill(Backfill(server.url, HOST, [0], source.since_ms, end_ms, 0.5)) if p.key == key]

    wait_for(lambda: any(t >= slow_from - 200 for t in held()), timeout=10, what="the slow scrape stored")
    live = [r.timestamp for r in got if r.key == key]
    added = [p.timestamp for p in late if p.key == key]
    assert any(t >= slow_from - 200 for t in added), (added, held())  # the scrape begun before the end
    assert sorted(live + added) == held()  # every scrape Prometheus holds for the run, none twice
