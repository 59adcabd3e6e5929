"""`radt monitor --prometheus-port` scraped by a real Prometheus (Debian's `prometheus`): a real monitor
process on fake GPUs (faked only below pynvml), a training run RUNNING on GPU 0 in the real store,
and Prometheus' own HTTP API as the test's view. Every wait is on a condition, never a fixed sleep.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
from mlflow import MlflowClient
from prometheus_client.parser import text_string_to_metric_families

from radt.collectors.sources import gpus
from radt.collectors.sources.prometheus import Backfill, backfill
from tests.fakes.fake_nvml import A100, H100, mig_gpu
from tests.support import prometheus as prom
from tests.support.polling import wait_for
from tests.support.radtproc import radt_command, radt_env, run_radt
from tests.support.runs import radt_run

pytestmark = pytest.mark.skipif(
    not prom.available() and os.environ.get("CI") != "true", reason="needs Debian's prometheus package (.ci/run installs it; under CI it must be there)"
)

UUID0 = "GPU-00008a1c-0d4e-4f0b-8e6a-000000000000"
UUID1 = "GPU-a1000001-5ee6-4c1e-9d1a-000000000001"
GPUS = json.dumps([{**H100, "uuid": UUID0, "load": 0.7}, {**A100, "uuid": UUID1, "load": 0.0}])
RUN_NAME = 'resnet "A" \\ 1'  # a quote and a backslash: label escaping, undone by Prometheus' parser
SMACT = "radt_sm_active"


def _training_run(client: MlflowClient) -> str:
    """A RUNNING run of this host on GPU 0, as `radt train.py` records it (radt.gpus names the GPU by UUID)."""
    experiment = client.create_experiment("vision")
    run_id = radt_run(client, experiment, RUN_NAME, start_time=int(time.time() * 1000), workload="resnet")
    client.set_tag(run_id, "radt.gpus", gpus.gpus_tag([{"series": "gpu_0", "index": 0, "uuid": UUID0, "cuda": 0}]))
    return run_id


def _series(server: prom.Prometheus, query: str) -> list[dict]:
    return server.api("/api/v1/query", query=query)["result"]


def _raw(server: prom.Prometheus, selector: str, count: int) -> list[dict] | None:
    """A range selector's raw samples once its one series holds `count` of them."""
    result = _series(server, selector)
    return result if len(result) == 1 and len(result[0]["values"]) >= count else None


@dataclass
class Scraped:
    """A `radt monitor --prometheus-port` process and the real Prometheus scraping it; the monitor's stderr once stopped."""

    proc: subprocess.Popen
    server: prom.Prometheus
    port: int
    stderr: str = ""


@contextmanager
def _scraped_monitor(store_uri: str, radt_home, fake_gpus: str, *args: str) -> Iterator[Scraped]:
    """`radt monitor --interval 0.5 --prometheus-port PORT ARGS` on the fake GPUs, scraped by a real Prometheus; the
    monitor ends with SIGINT (as Ctrl-C) when the block does."""
    with prom.taken() as server:
        port = server.ports[0]
        proc = subprocess.Popen(
            radt_command("monitor", "--interval", "0.5", "--prometheus-port", str(port), *args),
            env=radt_env(radt_home, store_uri, fake_gpus=fake_gpus),
            cwd=radt_home,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        scraped = Scraped(proc, server, port)
        try:
            yield scraped
        finally:
            proc.send_signal(signal.SIGINT)
            _, scraped.stderr = proc.communicate(timeout=60)


@pytest.mark.dialects  # the GPU -> run lookup is radt's own SQL on the store: the one PostgreSQL end to end of the exposition
def test_prometheus_scrapes_the_monitor_with_the_training_run_on_each_gpu(store_uri, radt_home):
    client = MlflowClient(store_uri)
    training = _training_run(client)
    with _scraped_monitor(store_uri, radt_home, GPUS) as scraped:
        proc, server, port = scraped.proc, scraped.server, scraped.port
        gpu0 = wait_for(
            lambda: _series(server, f'{SMACT}{{gpu="0",run_id="{training}"}}'), timeout=30, what="GPU 0's SMACT with the training run", process=proc
        )
        gpu1 = wait_for(lambda: _series(server, 'radt_gpu_utilization_ratio{gpu="1"}'), timeout=30, what="GPU 1's utilization", process=proc)
        host = wait_for(lambda: _series(server, "radt_system_memory_usage_bytes"), timeout=30, what="host memory", process=proc)
        # the raw samples Prometheus holds for GPU 0, at the timestamps radt gave them
        held = wait_for(lambda: _raw(server, f'{SMACT}{{gpu="0"}}[1m]', 3), timeout=30, what="3 of GPU 0's raw samples", process=proc)
        # radt monitor as a node's NVML/GPM exporter: the prometheus listener and `radt import` read its series back
        first, last = (round(float(held[0]["values"][i][0]) * 1000) for i in (0, -1))
        back = backfill(Backfill(server.url, socket.gethostname(), [0], first, last, 0.5))
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
            content_type = response.headers["Content-Type"]
        monitor = next(r for r in client.search_runs([client.get_experiment_by_name("monitor").experiment_id]))
        key = "system/gpu_0_sm_active"
        scrape_stamps = {round(float(stamp) * 1000) for stamp, _ in held[0]["values"]}

        def written() -> dict[int, float] | None:
            history = {m.timestamp: m.value for m in client.get_metric_history(monitor.info.run_id, key)}
            return history if scrape_stamps <= history.keys() else None

        stored = wait_for(written, timeout=30, what="the scraped samples in the monitor's run")
    stderr = scraped.stderr
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr
    assert f"serving Prometheus metrics at http://127.0.0.1:{port}/metrics" in stderr

    labels = gpu0[0]["metric"]
    assert len(gpu0) == 1
    assert labels["run_name"] == RUN_NAME and labels["experiment"] == "vision" and labels["workload"] == "resnet"
    assert labels["Hostname"] == socket.gethostname() and labels["UUID"] == UUID0 and labels["gpu"] == "0"
    assert labels["monitor_run"] == monitor.info.run_id and "GPU_I_ID" not in labels
    # GPU 1 runs nothing: its series carries no run, and the training run's labels leak nowhere else
    # (radt says run_id="", which Prometheus holds as no run_id label at all)
    assert len(gpu1) == 1 and "run_id" not in gpu1[0]["metric"] and gpu1[0]["metric"]["UUID"] == UUID1
    assert len(host) == 1 and "run_id" not in host[0]["metric"] and "gpu" not in host[0]["metric"]
    assert host[0]["metric"]["Hostname"] == socket.gethostname()

    # every value Prometheus scraped is the value radt wrote to the store at that very millisecond
    values = held[0]["values"]
    assert len(values) >= 3
    for stamp, value in values:
        assert float(value) == stored[round(float(stamp) * 1000)]

    smact_back = {p.timestamp: p.value for p in back if p.key == key}
    assert set(smact_back) == {round(float(t) * 1000) for t, _ in held[0]["values"]}  # every scrape, at its own time
    assert smact_back == {t: stored[t] for t in smact_back}  # the value the monitor stored then
    assert {p.key for p in back} >= {key, "system/gpu_0_utilization_percentage", "system/gpu_0_power_usage_watts"}
    assert not [p for p in back if not p.key.startswith("system/gpu_0_")]  # GPU 1 and the host's series are not asked for

    assert content_type.startswith("text/plain; version=0.0.4")
    assert f"# TYPE {SMACT} gauge" in text and "# HELP radt_gpu_utilization_ratio GPU util" in text
    assert 'run_name="resnet \\"A\\" \\\\ 1"' in text
    # radt writes GPU 1's run labels empty (Prometheus above holds them as none)
    gpu1_text = [s.labels for f in text_string_to_metric_families(text) for s in f.samples if s.labels.get("gpu") == "1"]
    assert gpu1_text and all(labels["UUID"] == UUID1 and not any(labels[k] for k in ("run_id", "run_name", "experiment", "workload")) for labels in gpu1_text)


@pytest.mark.parametrize("store_uri", ["sqlite"], indirect=True)  # refused before any store work: one kind is enough
def test_a_port_in_use_is_one_line_and_exit_2(store_uri, radt_home):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_radt(["monitor", "-l", "host", "--prometheus-port", str(port)], env=radt_env(radt_home, store_uri), cwd=radt_home, timeout=60)
    assert done.returncode == 2, done.stderr
    assert [line for line in done.stderr.splitlines() if line.strip()] == [f"radt monitor: port {port} is in use; choose another --prometheus-port"]
    assert MlflowClient(store_uri).get_experiment_by_name("monitor") is None  # nothing started


def test_each_mig_slice_is_labelled_with_the_run_on_it_and_a_node_of_a_multinode_run_counts_here(store_uri, radt_home):
    """An H100 in MIG mode with two slices: one run on slice 1 (a run of this host), another on slice 2 as node n2 of a
    run whose first node is elsewhere. Each slice's series names its own run only; the whole GPU's series names both."""
    h100 = mig_gpu(H100, (1, "3g.40gb", 0.6), (2, "1g.10gb", 0.2), uuid=UUID0)
    slice1, slice2 = h100["mig"]
    client = MlflowClient(store_uri)
    experiment = client.create_experiment("mig")
    here = socket.gethostname()

    def entries(mig: dict) -> str:
        gpu = {"series": "gpu_0", "index": 0, "uuid": UUID0}
        return gpus.gpus_tag([gpu, {"series": f"gpu_0_mig_{mig['gi']}", "index": 0, "uuid": mig["uuid"], "gpu_instance": mig["gi"]}])

    single = radt_run(client, experiment, "on slice 1", start_time=int(time.time() * 1000), workload="w")
    client.set_tag(single, "radt.gpus", entries(slice1))
    multi = radt_run(client, experiment, "two nodes", start_time=int(time.time() * 1000), workload="w", letter="B")
    for key, value in {
        "radt.host": "node-elsewhere",  # the run's first node
        "radt.node.n1": "RUNNING",
        "radt.node.n1/host": "node-elsewhere",
        "radt.node.n1/gpus": gpus.gpus_tag([{"series": "gpu_0", "index": 0, "uuid": "GPU-elsewhere"}]),
        "radt.node.n2": "RUNNING",
        "radt.node.n2/host": here,
        "radt.node.n2/gpus": entries(slice2),
    }.items():
        client.set_tag(multi, key, value)
    with _scraped_monitor(store_uri, radt_home, json.dumps([h100]), "-d", f"{slice1['uuid']}+{slice2['uuid']}") as scraped:
        server, proc = scraped.server, scraped.proc
        on1 = wait_for(lambda: _series(server, f'{SMACT}{{GPU_I_ID="1"}}'), timeout=30, what="slice 1's SMACT", process=proc)
        on2 = wait_for(lambda: _series(server, f'{SMACT}{{GPU_I_ID="2"}}'), timeout=30, what="slice 2's SMACT", process=proc)
        whole = wait_for(lambda: _series(server, 'radt_gpu_power_usage_watts{gpu="0"}'), timeout=30, what="the GPU's power", process=proc)
    assert proc.returncode == 0, scraped.stderr
    assert [s["metric"]["run_id"] for s in on1] == [single] and on1[0]["metric"]["UUID"] == slice1["uuid"]
    assert [s["metric"]["run_id"] for s in on2] == [multi] and on2[0]["metric"]["UUID"] == slice2["uuid"]
    assert float(on1[0]["value"][1]) == pytest.approx(0.6) and float(on2[0]["value"][1]) == pytest.approx(0.2)  # each slice its own activity
    assert sorted(s["metric"]["run_id"] for s in whole) == sorted([single, multi]) and all("GPU_I_ID" not in s["metric"] for s in whole)


def test_a_scrape_its_client_gave_up_on_leaves_no_traceback(capsys):
    """Under load Prometheus drops a scrape at its timeout; the exposition's write then fails with a broken pipe, and
    socketserver printed that traceback into `radt monitor`'s output (seen in CI). Other errors are still reported."""
    from radt.collectors.monitor.exposition import _Handler, _Server

    server = _Server(("127.0.0.1", 0), _Handler)
    try:
        for gone in (BrokenPipeError(32, "Broken pipe"), ConnectionResetError(104, "Connection reset by peer")):
            try:
                raise gone
            except ConnectionError:
                server.handle_error(None, ("127.0.0.1", 40000))
        assert capsys.readouterr().err == ""
        try:
            raise ValueError("a real bug")
        except ValueError:
            server.handle_error(None, ("127.0.0.1", 40000))
        assert "ValueError: a real bug" in capsys.readouterr().err
    finally:
        server.server_close()
