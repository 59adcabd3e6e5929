"""Each run's own share of a GPU it shares (#55): NVML's per-process utilization samples, the run's processes summed.

The GPUs are the fake driver's (tests/fakes/fake_nvml.py) behind the real pynvml module, on a clock the test moves; the
processes whose pids the runs own are real ones (a run's tree, DataLoader-style workers included), an outsider's pid is
one only NVML knows. Everything above pynvml is radt's own code.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import signal
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager

import psutil
import pynvml
import pytest
from mlflow import MlflowClient
from prometheus_client.parser import text_string_to_metric_families

from radt.collectors.monitor.exposition import Exposition, Training, bind, run_pids
from radt.collectors.process.proctree import ProcessTree
from radt.collectors.process.watchdog import start_ticks
from radt.collectors.run.runner import share_tag
from radt.collectors.sources.base import SamplingContext
from radt.collectors.sources.gpushare import ProcessRow, power_estimate
from radt.collectors.sources.nvml import NvmlSource
from radt.runmodel import GPU_SHARE_TAG, PID_TAG
from tests.fakes.fake_nvml import A100, H100, FakeNvml, mig_gpu
from tests.support.polling import wait_for
from tests.support.ports import free_port
from tests.support.radtproc import LiveRadt, radt_env, run_radt
from tests.support.runs import radt_run

RUN_SM = "system/gpu_0_run_sm_utilization_percentage"
RUN_MEM = "system/gpu_0_run_memory_utilization_percentage"
RUN_POWER = "system/gpu_0_run_power_watts"
SHARE_KEYS = (RUN_SM, RUN_MEM, RUN_POWER)
OUTSIDER = 4_000_000  # another user's training: a pid only NVML knows (another container's)
BOTH = ("nvmlDeviceGetProcessesUtilizationInfo", "nvmlDeviceGetProcessUtilization")


def _family(workers: int, started, stop) -> None:
    """A training process that starts `workers` DataLoader-style workers (forked children) and says their pids."""
    context = multiprocessing.get_context("fork")
    children = [context.Process(target=stop.wait, daemon=True) for _ in range(workers)]
    for child in children:
        child.start()
    started.put([os.getpid(), *(c.pid for c in children)])
    stop.wait()


@contextmanager
def trained(workers: int = 0) -> Iterator[list[int]]:
    """A real process tree of a run: [root pid, worker pids...]; ended (those pids only) on leaving."""
    context = multiprocessing.get_context("fork")
    started, stop = context.Queue(), context.Event()
    root = context.Process(target=_family, args=(workers, started, stop))
    root.start()
    pids = started.get(timeout=30)
    try:
        yield pids
    finally:
        stop.set()
        root.join(10)
        for pid in pids[1:]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def opened(pids, devices=None, slices=()) -> NvmlSource:
    """An nvml source for a run whose process tree `pids()` gives."""
    source = NvmlSource()
    source.open(SamplingContext(interval=1.0, devices=devices, slices=list(slices), pids=pids))
    return source


def started(fake: FakeNvml, *sources: NvmlSource) -> None:
    """The recording's first tick (the clock not moved): it starts the first window of per-process samples."""
    read(fake, *sources, seconds=0.0)


def processes(*pids: int):
    found = [psutil.Process(pid) for pid in pids]
    return lambda: found


def read(fake: FakeNvml, *sources: NvmlSource, seconds: float = 1.0) -> list[dict[str, list[tuple[int, float]]]]:
    """One tick of each source after `seconds`: {key: [(timestamp, value)]}."""
    fake.clock.advance(seconds)
    now_ms = round((fake.clock() + fake.gpus[0].epoch) * 1000)  # the tick's time on the clock NVML stamps its samples with
    ticks = []
    for source in sources:
        got: dict[str, list[tuple[int, float]]] = {}
        for where, value, stamp in source.readings(now_ms):
            got.setdefault(where, []).append((stamp, value))
        ticks.append(got)
    return ticks


def test_two_runs_and_an_outsider_on_one_gpu_each_run_holds_its_own_processes_share(nvml):
    fake = nvml([{**H100, "load": 0.05}])
    with trained() as (a,), trained() as (b,):
        fake.set_process_load(0, a, 35, 12)
        fake.set_process_load(0, b, 20, 6)
        fake.set_process_load(0, OUTSIDER, 25, 4)
        run_a, run_b = opened(processes(a)), opened(processes(b))
        started(fake, run_a, run_b)
        for _ in range(4):
            got_a, got_b = read(fake, run_a, run_b)
            device = got_a["system/gpu_0_utilization_percentage"][0][1]
            assert [v for _, v in got_a[RUN_SM]] == [35.0] and [v for _, v in got_a[RUN_MEM]] == [12.0]
            assert [v for _, v in got_b[RUN_SM]] == [20.0] and [v for _, v in got_b[RUN_MEM]] == [6.0]
            assert got_a[RUN_SM][0][1] + got_b[RUN_SM][0][1] <= device == 80.0  # the outsider's 25 is in neither
        fake.set_process_load(0, b, 0, 0)  # run B stops computing: its share is 0 (NVML lists only processes that ran)
        got_a, got_b = read(fake, run_a, run_b, seconds=2.0)
        got_a, got_b = read(fake, run_a, run_b)
        assert [v for _, v in got_b[RUN_SM]] == [0.0] and [v for _, v in got_a[RUN_SM]] == [35.0]
        rows = {row.pid: (row.sm, row.mem) for row in run_a.process_rows()}
        assert rows == {a: (35.0, 12.0), b: (0.0, 0.0), OUTSIDER: (25.0, 4.0)}  # radt monitor's per-process gauges
        for source in (run_a, run_b):
            assert "gpu_share" not in source.describe() and share_tag([source]) == {}
            source.close()


def test_a_run_whose_processes_nvml_never_lists_while_it_lists_another_namespaces_says_why_at_its_end(nvml):
    """radt in a container of its own pid namespace: NVML names the host's pids, so the run's pids are never among them and
    the run had neither share series nor a tag. Said once the run ends, never while its CUDA context may still come."""
    fake = nvml([{**H100, "load": 0.05}])
    with trained() as (mine,):
        fake.set_process_load(0, OUTSIDER, 40, 10)  # the run's own process, as the host names it: not a pid of ours
        source = opened(processes(mine))
        started(fake, source)
        for _ in range(4):
            assert RUN_SM not in read(fake, source)[0]
        assert "gpu_share" not in source.describe(), "not yet: the run's context may still come"
        read(fake, source)
        assert share_tag([source])[GPU_SHARE_TAG] == (
            f"device only: GPU 0: none of the run's processes was among NVML's on it (pids {OUTSIDER}, none of them in this pid "
            "namespace): the run did not use this GPU, or it ran in a container with its own pid namespace (NVML names the "
            "host's pids; run the container with --pid=host for the run's own share)"
        )
        source.close()


def test_a_run_whose_dataloader_workers_hold_cuda_contexts_sums_them(nvml):
    fake = nvml([{**H100, "load": 0.0}])
    with trained(workers=2) as (root, first, second):
        tree = ProcessTree(root_pid=root)
        assert {p.pid for p in tree.processes(fresh=True)} == {root, first, second}
        for pid, sm, mem in ((root, 10, 3), (first, 15, 5), (second, 20, 7), (OUTSIDER, 30, 9)):
            fake.set_process_load(0, pid, sm, mem)
        source = opened(tree.processes)
        started(fake, source)
        for _ in range(3):
            (got,) = read(fake, source)
            assert [v for _, v in got[RUN_SM]] == [45.0] and [v for _, v in got[RUN_MEM]] == [15.0]
        source.close()


def test_samples_are_read_once_each_and_written_at_their_own_timestamps(nvml):
    """Two samples of each process a tick (every 0.5 s): each NVML sample is in exactly one read, and each point is at the
    newest sample's stamp (NVML's clock, in ms), not at the tick's."""
    fake = nvml([{**H100, "load": 0.0}])
    me = os.getpid()
    fake.set_process_load(0, me, 40, 10)
    fake.set_process_load(0, OUTSIDER, 30, 5)
    fake.clock.advance(0.7)  # samples before the run's recording starts: not the run's
    before = fake.process_samples(0)
    source = opened(processes(me))
    started(fake, source)
    stamps = []
    for _ in range(5):
        (got,) = read(fake, source)
        ring = fake.process_samples(0)
        assert len(got[RUN_SM]) == 1
        stamps.append(got[RUN_SM][0][0])
        assert stamps[-1] == max(stamp for stamp, *_ in ring) // 1000  # the newest sample's own time
        assert got[RUN_SM] == [(stamps[-1], 40.0)] and got[RUN_POWER][0][0] == stamps[-1]
    assert stamps == sorted(set(stamps)) and all(later - earlier >= 900 for earlier, later in zip(stamps, stamps[1:], strict=False))
    ring = fake.process_samples(0)
    assert len(ring) > len(before) >= 2
    handed = fake.gpus[0].handed
    assert {handed[(stamp, pid)] for stamp, pid, *_ in ring} == {1}  # every sample read, none twice
    assert len({pid for _, pid, *_ in ring}) == 2 and len({stamp for stamp, *_ in ring}) == len(ring)  # two processes, no stamp shared
    source.close()


def test_when_no_process_ran_since_the_last_read_the_runs_share_is_0_at_the_ticks_time(nvml):
    fake = nvml([{**H100, "load": 0.0}])
    me = os.getpid()
    fake.set_process_load(0, me, 40, 10)
    fake.set_process_load(0, OUTSIDER, 30, 5)
    source = opened(processes(me))
    started(fake, source)
    (got,) = read(fake, source)
    ((written, share),) = got[RUN_SM]
    assert share == 40.0
    fake.set_process_load(0, me, 0, 0)
    fake.set_process_load(0, OUTSIDER, 0, 0)
    stepped_back = {where for where, _, _ in source.readings(written - 5000)}  # the wall clock stepped back (NTP)
    assert not stepped_back & set(SHARE_KEYS)  # no 0 stamped before the share already written
    calls = fake.count("nvmlDeviceGetProcessesUtilizationInfo")
    (got,) = read(fake, source)  # NVML_ERROR_NOT_FOUND: nobody ran since
    assert fake.count("nvmlDeviceGetProcessesUtilizationInfo") == calls + 1
    now_ms = round((fake.clock() + fake.gpus[0].epoch) * 1000)
    assert got[RUN_SM] == [(now_ms, 0.0)] and got[RUN_MEM] == [(now_ms, 0.0)]
    source.close()


def test_ticks_shorter_than_nvmls_sample_period_read_once_a_second_and_never_a_0_between_samples(nvml):
    fake = nvml([{**H100, "load": 0.0}])  # a sample of each process every 0.5 s
    me = os.getpid()
    fake.set_process_load(0, me, 40, 10)
    fake.set_process_load(0, OUTSIDER, 30, 5)
    source = opened(processes(me))  # radt monitor's 0.1 s, a run's --interval 0.25: 4 ticks a second here
    started(fake, source)
    shares = [point for _ in range(16) for point in read(fake, source, seconds=0.25)[0].get(RUN_SM, [])]
    assert [v for _, v in shares] == [40.0] * 4  # once a second, each with the run's process in it
    assert fake.count("nvmlDeviceGetProcessesUtilizationInfo") == 1 + 4
    source.close()


def test_the_newer_call_where_the_driver_has_it_else_the_older_one_with_the_same_shares(nvml):
    for older_driver in (False, True):
        fake = nvml({"gpus": [{**H100, "load": 0.0}], "lacks": BOTH[:1] if older_driver else []})
        fake.set_process_load(0, os.getpid(), 40, 10)
        source = opened(processes(os.getpid()))
        started(fake, source)
        for _ in range(3):
            (got,) = read(fake, source)
            assert [v for _, v in got[RUN_SM]] == [40.0]
        newer, older = (fake.count(name) for name in BOTH)
        assert (newer, older) == ((1, 4) if older_driver else (4, 0))  # the missing one asked once, at the start
        assert "gpu_share" not in source.describe()
        source.close()


@pytest.mark.parametrize(
    ("config", "why"),
    [
        ([{**H100, "unsupported": list(BOTH)}], "device only: GPU 0 (NVIDIA H100 80GB HBM3): NVML gives no per-process utilization (Not Supported)"),
        (
            {"driver": "418.67", "gpus": [{**A100}], "lacks": list(BOTH)},
            "device only: GPU 0 (NVIDIA A100-SXM4-40GB): NVML gives no per-process utilization (Function Not Found)",
        ),
    ],
    ids=["gpu-without-it", "older-driver"],
)
def test_a_gpu_without_per_process_figures_says_why_once_and_has_no_share_series(nvml, config, why):
    fake = nvml(config)
    fake.set_process_load(0, os.getpid(), 40, 10)
    source = opened(processes(os.getpid()))
    assert share_tag([source]) == {GPU_SHARE_TAG: why}  # at the start, as the runner tags the run
    for _ in range(4):
        (got,) = read(fake, source)
        assert not [k for k in got if k in SHARE_KEYS] and got["system/gpu_0_power_usage_watts"]
    assert sum(fake.count(name) for name in BOTH) == 2  # each call asked once, at the start; never per sample
    assert source.describe()["gpu_share"] == why
    assert share_tag([source], at_end=True) == {}  # said once: nothing new at the end
    source.close()


def test_mps_clients_that_nvml_names_by_their_server_say_so_and_have_no_share(nvml, tmp_path):
    """An older driver names the MPS server for its clients' work: the run's share cannot be told apart from the others'."""
    server_exe = tmp_path / "nvidia-cuda-mps-server"
    shutil.copy(shutil.which("sleep"), server_exe)
    server = os.posix_spawn(str(server_exe), [str(server_exe), "60"], os.environ)
    try:
        fake = nvml([{**H100, "load": 0.0, "mps_server": server}])
        fake.set_process_load(0, os.getpid(), 40, 10)
        fake.set_process_load(0, OUTSIDER, 30, 5)
        fake.set_processes(0, [*fake.gpus[0].processes, (server, 50_000_000)])
        source = opened(processes(os.getpid()))
        assert share_tag([source]) == {}  # nothing to say before the first read
        for _ in range(3):
            (got,) = read(fake, source)
            assert not [k for k in got if k in SHARE_KEYS]
        why = source.describe()["gpu_share"]
        assert why == f"device only: GPU 0: the run's processes are MPS clients and NVML names the MPS server (pid {server}), not each client"
        source.close()
        assert share_tag([source], at_end=True) == {GPU_SHARE_TAG: why}  # found while sampling: said at the end, once
    finally:
        os.kill(server, signal.SIGKILL)
        os.waitpid(server, 0)


def test_per_process_reads_that_break_stop_alone_and_the_gpus_own_series_go_on(nvml, monkeypatch):
    fake = nvml([{**H100, "load": 0.0}])
    fake.set_process_load(0, os.getpid(), 40, 10)
    source = opened(processes(os.getpid()))
    started(fake, source)

    def broken(handle, since):
        raise OSError("the driver's buffer could not be mapped")

    monkeypatch.setattr(pynvml, "nvmlDeviceGetProcessesUtilizationInfo", broken)
    for _ in range(3):
        (got,) = read(fake, source)
        assert got["system/gpu_0_utilization_percentage"] and not [k for k in got if k in SHARE_KEYS]
    why = "device only: GPU 0: reading per-process utilization failed (OSError: the driver's buffer could not be mapped)"
    assert source.describe()["gpu_share"] == why and share_tag([source], at_end=True) == {GPU_SHARE_TAG: why}
    source.close()


def test_the_power_estimate_splits_the_power_above_idle_by_sm_share_and_idle_equally():
    # a GPU at 360 W, idle at 60 W; the run's 40 % of the 60 % all processes ran, two owners (the run and one outsider)
    assert power_estimate(360.0, 60.0, 40.0, 60.0, 2) == pytest.approx(300.0 * 40 / 60 + 60.0 / 2)  # 230 W
    assert power_estimate(360.0, 60.0, 20.0, 60.0, 2) == pytest.approx(130.0)  # the outsider's: the two add up to the GPU's
    assert power_estimate(90.0, 60.0, 0.0, 0.0, 3) == pytest.approx(30.0)  # nobody ran: all of it split equally
    assert power_estimate(50.0, 60.0, 10.0, 10.0, 1) == pytest.approx(60.0)  # below idle: never a negative share


def test_the_power_estimate_takes_idle_from_the_gpu_at_rest_in_the_recording(nvml):
    fake = nvml([{**H100, "load": 0.0, "idle_power_mw": 60_000}])
    me = os.getpid()
    source = opened(processes(me))
    read(fake, source)  # the GPU at rest: 60 W, its idle power
    fake.set_process_load(0, me, 40, 10)
    fake.set_process_load(0, OUTSIDER, 20, 5)
    for _ in range(3):
        (got,) = read(fake, source)
        power = got["system/gpu_0_power_usage_watts"][0][1]
        assert power == pytest.approx(60 + (560 - 60) * 0.6)  # the fake draws idle + load x (80 % of the limit - idle)
        assert [v for _, v in got[RUN_POWER]] == [pytest.approx((power - 60) * 40 / 60 + 60 / 2)]
    source.close()


def test_a_mig_slices_share_series_are_the_slices_own_activity(nvml):
    fake = nvml([mig_gpu(H100, (1, "3g.40gb", 0.8), (5, "1g.10gb", 0.2))])
    fake.set_process_load(0, OUTSIDER, 30, 5)  # per-process figures do not exist in MIG mode: never asked
    source = opened(processes(os.getpid()), devices=[0], slices=[(0, 1)])
    read(fake, source)
    for _ in range(2):
        (got,) = read(fake, source)
        assert got["system/gpu_0_mig_1_run_sm_utilization_percentage"][0][1] == pytest.approx(100 * got["system/gpu_0_mig_1_gr_engine_active"][0][1])
        assert got["system/gpu_0_mig_1_run_sm_utilization_percentage"][0][1] == pytest.approx(10 + 90 * 0.8)
        assert got["system/gpu_0_mig_1_run_memory_utilization_percentage"][0][1] == pytest.approx(40 * 0.8)
        assert not [k for k in got if "_run_" in k and "_mig_1_" not in k]  # not the GPU's, not slice 5's
    assert sum(fake.count(name) for name in BOTH) == 0 and "gpu_share" not in source.describe()
    source.close()


def test_a_mig_slice_without_its_own_activity_says_so(nvml):
    fake = nvml([mig_gpu(A100, (2, "1g.5gb", 0.6))])  # an A100: no GPM per instance
    source = opened(processes(os.getpid()), devices=[0], slices=[(0, 2)])
    for _ in range(2):
        (got,) = read(fake, source)
        assert not [k for k in got if "_run_" in k]
    why = "device only: GPU 0 MIG slice 2: the slice's own activity cannot be read (radt.mig_activity says why)"
    assert share_tag([source]) == {GPU_SHARE_TAG: why}
    source.close()
    assert share_tag([source], at_end=True) == {}  # said at the start: not again


def test_without_the_nvml_listener_the_run_says_device_only():
    assert share_tag([]) == {GPU_SHARE_TAG: "device only: the nvml listener is not running, and only NVML gives per-process figures"}
    assert share_tag([], at_end=True) == {}


# --- radt monitor -----------------------------------------------------------------------------


NOW_MS = 1_780_000_000_123
UUID0 = "GPU-00008a1c-0d4e-4f0b-8e6a-000000000000"


@pytest.fixture
def exposition() -> Iterator[Exposition]:
    served = bind("127.0.0.1", free_port(), "node-7", lambda line: None)
    training = Training("run-1", "resnet", "vision", "", [{"series": "gpu_0", "index": 0, "uuid": UUID0}], frozenset({111, 112}))
    rows = [ProcessRow(0, 111, 35.0, 12.0, NOW_MS), ProcessRow(0, 112, 10.0, 2.0, NOW_MS), ProcessRow(0, OUTSIDER, 25.0, 4.0, NOW_MS)]
    served.start(lambda: [training], lambda: "monitor-run", {"gpu_0": UUID0}, lambda: rows)
    try:
        yield served
    finally:
        served.stop()


def _scrape(exposition: Exposition) -> str:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{exposition.server.server_address[1]}/metrics", timeout=5) as response:
        return response.read().decode()


def test_radt_monitor_serves_each_process_share_labelled_by_pid_and_its_run(exposition):
    text = _scrape(exposition)
    samples = [s for family in text_string_to_metric_families(text) for s in family.samples]
    sm = {s.labels["pid"]: s for s in samples if s.name == "radt_process_sm_utilization_ratio"}
    mem = {s.labels["pid"]: s.value for s in samples if s.name == "radt_process_memory_utilization_ratio"}
    assert {pid: s.value for pid, s in sm.items()} == {"111": 0.35, "112": 0.1, str(OUTSIDER): 0.25}  # NVML's percentages as ratios
    assert mem == {"111": 0.12, "112": 0.02, str(OUTSIDER): 0.04}
    assert sm["111"].labels == {"Hostname": "node-7", "monitor_run": "monitor-run", "gpu": "0", "UUID": UUID0, "pid": "111", "run_id": "run-1"}
    assert sm["112"].labels["run_id"] == "run-1" and sm[str(OUTSIDER)].labels["run_id"] == ""  # no run radt knows
    assert all(line.endswith(f" {NOW_MS}") for line in text.splitlines() if line.startswith("radt_process_"))  # at the read's own time


def test_radt_monitor_labels_each_process_on_a_gpu_with_the_training_run_it_belongs_to(store_uri, radt_home, monkeypatch):
    """`radt monitor --prometheus-port` in this process on a fake GPU: a training run of this host (its radt: this process)
    whose DataLoader-style process computes beside an outsider's; each process's gauge, and the run's id on its own only."""
    from radt.collectors.monitor.machine import Monitor, MonitorSetup, watch_plan

    fake = FakeNvml.from_config([{**H100, "load": 0.0}], nvml=pynvml)  # on the real clock: the monitor's sampler ticks on it
    fake.install(pynvml, monkeypatch.setattr)
    client = MlflowClient(store_uri)
    training = radt_run(client, client.create_experiment("vision"), "resnet", start_time=int(time.time() * 1000))
    with trained() as (worker,):
        fake.set_process_load(0, worker, 35, 12)
        fake.set_process_load(0, OUTSIDER, 25, 4)
        served = bind("127.0.0.1", free_port(), "node-7", lambda line: None)
        monitor = Monitor(MonitorSetup(store_uri, "monitor", ["nvml"], None, 0.1, 30.0, ["-l", "nvml"]), plan=watch_plan(None), exposition=served)
        monitor.begin()
        try:

            def both() -> dict | None:
                text = _scrape(served)
                found = {s.labels["pid"]: s for f in text_string_to_metric_families(text) for s in f.samples if s.name == "radt_process_sm_utilization_ratio"}
                return found if {str(worker), str(OUTSIDER)} <= found.keys() and found[str(worker)].value else None

            found = wait_for(both, timeout=30, what="both processes' gauges")
        finally:
            assert monitor.end("stopped")
            served.stop()
    assert found[str(worker)].value == 0.35 and found[str(worker)].labels["run_id"] == training
    assert found[str(OUTSIDER)].value == 0.25 and found[str(OUTSIDER)].labels["run_id"] == ""


def test_promtool_accepts_the_exposition_with_the_process_gauges(exposition):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("needs promtool (Debian's prometheus package)")
    import subprocess

    checked = subprocess.run([promtool, "check", "metrics"], input=_scrape(exposition), capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_a_training_runs_pids_are_its_recorded_tree_and_its_radts_descendants(radt_home):
    with trained(workers=1) as (root, worker):
        record = radt_home / "runs" / "run-9"
        record.mkdir(parents=True)
        (record / "tree.json").write_text(json.dumps({"processes": [[worker, start_ticks(worker)], [root, start_ticks(root) + 1], [OUTSIDER, 1]]}))
        assert run_pids("run-9", {}) == {worker}  # a recorded pid that is another process now (or gone) is not the run's
        found = run_pids("run-9", {PID_TAG: str(os.getpid())})  # this process as the run's radt: its descendants too
        assert {root, worker} <= found and OUTSIDER not in found and os.getpid() not in found


# --- end to end ---------------------------------------------------------------------------------


TRAIN = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    import radt
    from tests.support.stored import points

    loads, sm, mem, key, wanted, runs = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6])
    with open(loads, "a") as f:  # this process's own load on the fake GPU, as its kernels would make it
        f.write(f"{os.getpid()} {sm} {mem}\\n")
    with radt.run() as run:
        run.log_param("sm", sm)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # every run on the GPU, and enough of this run's series stored
            if len(Path(loads).read_text().splitlines()) >= runs and points(run.run_id, key) >= wanted:
                break
            time.sleep(0.1)
    """
)


def test_two_radt_runs_on_one_gpu_each_store_their_own_share(tmp_path, store_uri, radt_home):
    loads = tmp_path / "loads.txt"
    loads.write_text("")
    gpu = {**H100, "load": 0.05, "process_loads_from": str(loads), "processes": [{"pid": OUTSIDER, "used": 10**9, "sm": 25, "mem": 4}]}
    env = radt_env(radt_home, store_uri, fake_gpus=json.dumps([gpu]))
    (tmp_path / "train.py").write_text(TRAIN)
    client = MlflowClient(store_uri)
    client.create_experiment("shared")
    mine = {"35": "12", "20": "6"}
    runs = [
        LiveRadt(["-e", "shared", "-d", "0", "-l", "nvml", "--interval", "0.5", "train.py", str(loads), sm, mem, RUN_SM, "3", "2"], env, tmp_path)
        for sm, mem in mine.items()
    ]
    for radt in runs:
        assert radt.proc.wait(timeout=120) == 0, radt.stderr
    found = client.search_runs([client.get_experiment_by_name("shared").experiment_id])
    assert len(found) == 2
    for run in found:
        sm = run.data.params["sm"]
        share = client.get_metric_history(run.info.run_id, RUN_SM)
        assert len(share) >= 3 and {m.value for m in share} == {float(sm)}, (sm, [m.value for m in share])
        assert {m.value for m in client.get_metric_history(run.info.run_id, RUN_MEM)} == {float(mine[sm])}
        assert client.get_metric_history(run.info.run_id, RUN_POWER)
        assert GPU_SHARE_TAG not in run.data.tags


def test_a_radt_run_on_a_gpu_without_per_process_figures_is_tagged_device_only(tmp_path, store_uri, radt_home):
    loads = tmp_path / "loads.txt"
    gpu = {**A100, "load": 0.05, "process_loads_from": str(loads), "unsupported": list(BOTH)}
    env = radt_env(radt_home, store_uri, fake_gpus=json.dumps([gpu]))
    (tmp_path / "train.py").write_text(TRAIN)
    key = "system/gpu_0_utilization_percentage"  # the device's series, which the run still has
    done = run_radt(["-e", "alone", "-d", "0", "-l", "nvml", "--interval", "0.2", "train.py", str(loads), "35", "12", key, "3", "1"], env, tmp_path)
    assert done.returncode == 0, done.stderr
    client = MlflowClient(store_uri)
    (run,) = client.search_runs([client.get_experiment_by_name("alone").experiment_id])
    why = "device only: GPU 0 (NVIDIA A100-SXM4-40GB): NVML gives no per-process utilization (Not Supported)"
    assert run.data.tags[GPU_SHARE_TAG] == why
    assert not [k for k in run.data.metrics if "_run_" in k] and len(client.get_metric_history(run.info.run_id, key)) >= 3


def test_a_radt_run_of_mps_clients_that_nvml_names_by_their_server_is_tagged_device_only_at_its_end(tmp_path, store_uri, radt_home):
    server_exe = tmp_path / "nvidia-cuda-mps-server"
    shutil.copy(shutil.which("sleep"), server_exe)
    server = os.posix_spawn(str(server_exe), [str(server_exe), "120"], os.environ)
    try:
        loads = tmp_path / "loads.txt"
        gpu = {**H100, "load": 0.05, "process_loads_from": str(loads), "mps_server": server, "processes": [{"pid": server, "used": 10**8}]}
        env = radt_env(radt_home, store_uri, fake_gpus=json.dumps([gpu]))
        (tmp_path / "train.py").write_text(TRAIN)
        key = "system/gpu_0_utilization_percentage"
        done = run_radt(["-e", "mps", "-d", "0", "-l", "nvml", "--interval", "0.2", "train.py", str(loads), "35", "12", key, "10", "1"], env, tmp_path)
    finally:
        os.kill(server, signal.SIGKILL)
        os.waitpid(server, 0)
    assert done.returncode == 0, done.stderr
    client = MlflowClient(store_uri)
    (run,) = client.search_runs([client.get_experiment_by_name("mps").experiment_id])
    why = f"device only: GPU 0: the run's processes are MPS clients and NVML names the MPS server (pid {server}), not each client"
    assert run.data.tags[GPU_SHARE_TAG] == why
    assert not [k for k in run.data.metrics if "_run_" in k]
