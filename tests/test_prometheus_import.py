"""`radt import --prometheus` and the prometheus listener's final read, against a real Prometheus scraping a
dcgm-exporter stand-in that serves a recorded `dcgmi dmon` log: the run holds exactly what Prometheus holds."""

from __future__ import annotations

import json
import shutil
import socket
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from radt.catalogue import EXPORTER_METRICS
from radt.cli import main as radt_main
from radt.runmodel import PROMETHEUS_GAP_TAG, PROMETHEUS_TAG, SCRIPT_END_TAG, SCRIPT_START_TAG
from tests.fakes.fake_nvml import A100
from tests.support import prometheus as prom
from tests.support.dcgm_exporter import Device
from tests.support.ports import free_port
from tests.support.radtproc import radt_env, run_radt
from tests.support.rollupcheck import assert_rollups_cover_raw

LOG = Path(__file__).parent / "fixtures" / "real-tool-logs" / "mnist_dcgmi_dmon_18fields.txt"
HOST = "node-a"
HERE = socket.gethostname()
DEVICES = [Device(HOST, 0, 0), Device(HOST, 1, 2), Device(HOST, 1, 3, gi=2), Device("node-b", 0, 4), Device(HERE, 0, 2), Device(HERE, 1, 0)]
SCRAPES = 4


@pytest.fixture(scope="module")
def served():
    """(exporter, Prometheus, time before the first scrape in ms) once SCRAPES scrapes are stored."""
    start_ms = int(time.time() * 1000)
    until = f'DCGM_FI_PROF_SM_ACTIVE{{Hostname="{HOST}",gpu="0"}}[1h]'
    with prom.serving(LOG, DEVICES, until, SCRAPES) as (exporter, server):
        yield exporter, server, start_ms


def held(server: prom.Prometheus, host: str, gpu: int, start_ms: int, end_ms: int, gi: int | None = None, node: str = "") -> dict[str, dict[int, float]]:
    """{catalogue key: {timestamp: value}}: what Prometheus itself holds for one GPU (or MIG slice) of `host` in [start_ms, end_ms]."""
    names = "|".join(EXPORTER_METRICS)
    span = end_ms - start_ms + 1
    promql = f'{{__name__=~"{names}",Hostname="{host}",gpu="{gpu}",GPU_I_ID="{"" if gi is None else gi}"}}[{span}ms]'
    data = server.api("/api/v1/query", query=promql, time=f"{end_ms / 1000:.3f}")
    where = (f"{node}/" if node else "") + f"gpu_{gpu}_" + (f"mig_{gi}_" if gi is not None else "")
    out: dict[str, dict[int, float]] = {}
    for series in data["result"]:
        metric = series["metric"]["__name__"]
        name, scale = EXPORTER_METRICS[metric]
        out[f"system/{where}{name}"] = {round(float(t) * 1000): float(v) * scale for t, v in series["values"] if start_ms <= round(float(t) * 1000) <= end_ms}
    return {k: v for k, v in out.items() if v}


def in_run(client: MlflowClient, run_id: str) -> dict[str, dict[int, float]]:
    """{key: {timestamp: value}} of every system series of the run; a key logged twice at one time fails."""
    out: dict[str, dict[int, float]] = {}
    for where in client.get_run(run_id).data.metrics:
        history = client.get_metric_history(run_id, where)
        stamps = [m.timestamp for m in history]
        assert len(stamps) == len(set(stamps)), (where, sorted(stamps))
        out[where] = {m.timestamp: m.value for m in history}
    return out


def radt_import(capsys, *args: str) -> tuple[int, str]:
    code = radt_main(["import", *args])
    return code, capsys.readouterr().err


def test_import_fills_a_plain_mlflow_run_once(served, store_uri, capsys):
    exporter, server, start_ms = served
    client = MlflowClient(tracking_uri=store_uri)
    run = client.create_run(client.create_experiment("prom"), start_time=start_ms + 3 * prom.SCRAPE_MS // 2)  # plain MLflow: no radt tags
    run_id = run.info.run_id
    end_ms = int(time.time() * 1000)
    client.set_terminated(run_id, "FINISHED", end_time=end_ms)
    code, err = radt_import(capsys, "--prometheus", server.url, "--run", run_id, "--store", store_uri)
    assert code == 2 and err.count("\n") == 1 and "--host" in err, err  # where it ran is not in the run

    code, err = radt_import(capsys, "--prometheus", server.url + "/", "--run", run_id, "--store", store_uri, "--host", HOST, "--gpus", "0")
    assert code == 0, err
    want = held(server, HOST, 0, start_ms + 3 * prom.SCRAPE_MS // 2, end_ms)
    assert len(want) == 7 and min(len(v) for v in want.values()) >= SCRAPES - 2  # FB_USED has no value in this log
    assert in_run(client, run_id) == want  # GPU 1, node-b's GPU 0 and this host's GPUs: absent
    stamp = min(want["system/gpu_0_sm_active"])
    assert want["system/gpu_0_sm_active"][stamp] == exporter.value(DEVICES[0], "DCGM_FI_PROF_SM_ACTIVE", exporter.frame_at(stamp))
    tags = client.get_run(run_id).data.tags
    points = sum(len(v) for v in want.values())
    assert tags[PROMETHEUS_TAG] == f"{server.url} {points} points" and PROMETHEUS_GAP_TAG not in tags

    code, err = radt_import(capsys, "--prometheus", server.url, "--run", run_id, "--store", store_uri, "--host", HOST, "--gpus", "0")
    assert code == 0 and "0 new points" in err, err
    assert in_run(client, run_id) == want  # twice adds nothing
    assert assert_rollups_cover_raw(store_uri, run_id) == points  # Prometheus's backfill, counted once


def test_import_reads_the_runs_gpus_tag_and_reports_a_missing_gpu(served, store_uri, capsys):
    _, server, start_ms = served
    client = MlflowClient(tracking_uri=store_uri)
    tags = {"radt.host": HOST, "radt.gpus": '[{"series":"gpu_1","index":1},{"series":"gpu_5","index":5}]'}
    run_id = client.create_run(client.create_experiment("prom"), start_time=start_ms, tags=tags).info.run_id  # still RUNNING: up to now
    code, err = radt_import(capsys, "--prometheus", server.url, "--run", run_id, "--store", store_uri)
    end_ms = int(time.time() * 1000)
    assert code == 0, err
    got = in_run(client, run_id)
    want = held(server, HOST, 1, start_ms, end_ms)
    assert set(got) == set(want) and all(got[k].items() <= want[k].items() for k in got)
    gap = client.get_run(run_id).data.tags[PROMETHEUS_GAP_TAG]
    assert gap == f"no dcgm-exporter series for GPU 5 of Hostname={HOST} at {server.url} over the run" and gap in err


def test_import_from_a_prometheus_that_is_down(store_uri, radt_home, capsys):
    client = MlflowClient(tracking_uri=store_uri)
    run_id = client.create_run(client.create_experiment("prom"), tags={"radt.host": HOST}).info.run_id
    down = f"http://127.0.0.1:{free_port()}"
    code, err = radt_import(capsys, "--prometheus", down, "--run", run_id, "--store", store_uri)
    assert code == 1 and err.count("\n") == 1 and err.startswith(f"radt import: Prometheus at {down} did not answer"), err
    assert client.get_run(run_id).data.tags[PROMETHEUS_GAP_TAG].startswith(f"Prometheus at {down} did not answer")
    assert client.get_run(run_id).data.metrics == {}
    code, err = radt_import(capsys, "--prometheus", down, "--run", "0" * 32, "--store", store_uri)
    assert code == 2 and "not found" in err and err.count("\n") == 1, err


def run_of(uri: str):
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()], "tags.`radt.role` = 'run'")
    assert len(runs) == 1, runs
    return client, runs[0]


def test_a_run_holds_every_scrape_at_its_own_time_live_and_at_its_end(served, tmp_path, sqlite_template, radt_home, capsys):
    """`-l prometheus` at a 2 s interval: while the script trains, each tick writes the scrapes stored since the last at their
    own timestamps (the script sees them in the store); at its end the rest. The run's series equal what Prometheus holds."""
    exporter, server, _ = served
    store = tmp_path / "store.db"
    shutil.copy(sqlite_template, store)
    uri = f"sqlite:///{store}"
    (tmp_path / "train.py").write_text(prom.LIVE_TRAIN)
    env = radt_env(radt_home, uri, extra={"RADT_PROMETHEUS_URL": server.url})
    done = run_radt(["-l", "prometheus+host", "--interval", "2", "train.py", "3"], env, tmp_path, timeout=90)
    assert done.returncode == 0, done.stderr
    assert "'prometheus'" not in done.stderr, done.stderr
    assert int(done.stdout.split("saw ")[1].split()[0]) >= 3, done.stdout  # written while it trained
    client, run = run_of(uri)
    start, end = int(run.data.tags[SCRIPT_START_TAG]), int(run.data.tags[SCRIPT_END_TAG])
    got = {k: v for k, v in in_run(client, run.info.run_id).items() if k.startswith("system/gpu_")}
    every = {}
    for gpu in (0, 1):
        every |= held(server, HERE, gpu, start - 60_000, end + 5_000)  # the run's points may start before the script, at radt's start
        want = held(server, HERE, gpu, start, end)
        assert want and {k for k in got if k.startswith(f"system/gpu_{gpu}_")} == set(want)
        for where, scrapes in want.items():
            assert scrapes.items() <= got[where].items(), where  # every scrape while the script ran, at its time, with its value
    for where, series in got.items():
        assert series.items() <= every[where].items(), where  # nothing at a tick's time, nothing made up
    code, err = radt_import(capsys, "--prometheus", server.url, "--run", run.info.run_id, "--store", uri)
    assert code == 0 and "0 new points" in err, err  # the import reads the script's time, as the listener did


def test_prometheus_option_adds_the_listener_and_nvml_keeps_the_series_it_reads(served, tmp_path, sqlite_template, radt_home):
    """`radt --prometheus URL` on a host whose NVML (simulated below pynvml: an A100, no GPM) gives power and
    utilisation: those stay NVML's, the exporter adds what NVML lacks (SMACT, SMOCC, ...), each series one instrument's."""
    exporter, server, _ = served
    store = tmp_path / "store.db"
    shutil.copy(sqlite_template, store)
    uri = f"sqlite:///{store}"
    (tmp_path / "train.py").write_text(prom.LIVE_TRAIN)
    env = radt_env(radt_home, uri, fake_gpus=json.dumps([{**A100, "load": 0.5}, {**A100, "load": 0.5}]))
    done = run_radt(["--prometheus", server.url + "/", "-d", "0", "--interval", "0.5", "train.py", "4"], env, tmp_path, timeout=90)
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stderr.splitlines() if "both read" in line]
    assert len(said) == 1 and said[0].startswith("radt: listeners 'nvml' and 'prometheus' both read system/gpu_0_"), done.stderr
    client, run = run_of(uri)
    assert run.data.tags["radt.listeners"] == "nvml+host+prometheus"
    got = in_run(client, run.info.run_id)
    power = 60 + (400 * 0.8 - 60) * 0.5  # the simulated A100's at load 0.5
    assert set(got["system/gpu_0_power_usage_watts"].values()) == {power}
    assert set(got["system/gpu_0_utilization_percentage"].values()) == {50.0}
    every = held(server, HERE, 0, int(run.info.start_time) - 60_000, int(run.info.end_time) + 5_000)
    for name in ("sm_active", "sm_occupancy", "gr_engine_active", "dram_active"):
        series = got[f"system/gpu_0_{name}"]
        assert series and series.items() <= every[f"system/gpu_0_{name}"].items(), name
    assert not [k for k in got if k.startswith("system/gpu_1_")]  # -d 0


def test_a_prometheus_url_that_is_not_one_is_one_line(tmp_path, radt_home):
    (tmp_path / "train.py").write_text("print('trained')\n")
    env = radt_env(radt_home, f"sqlite:///{tmp_path / 'store.db'}")
    done = run_radt(["--prometheus", "prometheus:9090", "train.py"], env, tmp_path, timeout=60)
    assert done.returncode == 2 and "trained" not in done.stdout
    assert done.stderr == "radt: --prometheus 'prometheus:9090' is not a Prometheus server's http(s) URL; give e.g. --prometheus http://prometheus:9090\n"


def test_a_run_with_prometheus_down_ends_with_its_gap_tagged(tmp_path, sqlite_template, radt_home):
    store = tmp_path / "store.db"
    shutil.copy(sqlite_template, store)
    uri = f"sqlite:///{store}"
    script = tmp_path / "train.py"
    script.write_text("print('trained')\n")
    down = f"http://127.0.0.1:{free_port()}"
    env = radt_env(radt_home, uri, extra={"RADT_PROMETHEUS_URL": down})
    done = run_radt(["-l", "prometheus+host", str(script)], env, tmp_path, timeout=60)
    assert done.returncode == 0 and "trained" in done.stdout, done.stderr
    said = [line for line in done.stderr.splitlines() if "'prometheus'" in line]
    assert len(said) == 1 and f"Prometheus at {down} did not answer" in said[0], done.stderr  # one line, the live read's
    client = MlflowClient(tracking_uri=uri)
    run = client.search_runs([e.experiment_id for e in client.search_experiments()])[0]
    assert run.info.status == "FINISHED" and run.data.tags[PROMETHEUS_GAP_TAG] == said[0]
    assert any(k.startswith("system/") for k in run.data.metrics)  # the host listener's series: nothing else lost


def test_import_reads_each_node_of_a_multinode_run_and_mig_slices(served, store_uri, capsys):
    """A run two nodes shared: each node's GPUs from its own host's series, under system/<node>/; a plain run's MIG slice by --gpus 1:2."""
    _, server, start_ms = served
    client = MlflowClient(tracking_uri=store_uri)
    experiment = client.create_experiment("prom")
    tags = {
        "radt.node.n1": "FINISHED",
        "radt.node.n1/host": HOST,
        "radt.node.n1/gpus": '[{"series":"gpu_0","index":0}]',
        "radt.node.n2": "FINISHED",
        "radt.node.n2/host": "node-b",
        "radt.node.n2/gpus": '[{"series":"gpu_0","index":0}]',
    }
    run_id = client.create_run(experiment, start_time=start_ms, tags=tags).info.run_id
    end_ms = int(time.time() * 1000)
    client.set_terminated(run_id, "FINISHED", end_time=end_ms)
    code, err = radt_import(capsys, "--prometheus", server.url, "--run", run_id, "--store", store_uri, "--host", HOST)
    assert code == 2 and err.count("\n") == 1 and "ran on nodes n1, n2" in err, err
    code, err = radt_import(capsys, "--prometheus", server.url, "--run", run_id, "--store", store_uri)
    assert code == 0, err
    want = held(server, HOST, 0, start_ms, end_ms, node="n1") | held(server, "node-b", 0, start_ms, end_ms, node="n2")
    assert want and in_run(client, run_id) == want
    assert want["system/n1/gpu_0_sm_active"] != want["system/n2/gpu_0_sm_active"]  # each node its own GPU 0

    plain = client.create_run(experiment, start_time=start_ms).info.run_id
    client.set_terminated(plain, "FINISHED", end_time=end_ms)
    code, err = radt_import(capsys, "--prometheus", server.url, "--run", plain, "--store", store_uri, "--host", HOST, "--gpus", "1:x")
    assert code == 2 and err.count("\n") == 1 and "--gpus '1:x'" in err, err
    code, err = radt_import(capsys, "--prometheus", server.url, "--run", plain, "--store", store_uri, "--host", HOST, "--gpus", "1:2")
    assert code == 0, err
    want = held(server, HOST, 1, start_ms, end_ms) | held(server, HOST, 1, start_ms, end_ms, gi=2)
    assert "system/gpu_1_mig_2_sm_active" in want and in_run(client, plain) == want


def test_a_good_import_clears_the_gap_an_earlier_one_tagged(served, store_uri, capsys):
    _, server, start_ms = served
    client = MlflowClient(tracking_uri=store_uri)
    run_id = client.create_run(client.create_experiment("prom"), start_time=start_ms, tags={"radt.host": HOST}).info.run_id
    client.set_terminated(run_id, "FINISHED", end_time=int(time.time() * 1000))
    code, err = radt_import(capsys, "--prometheus", f"http://127.0.0.1:{free_port()}", "--run", run_id, "--store", store_uri, "--gpus", "0")
    assert code == 1 and PROMETHEUS_GAP_TAG in client.get_run(run_id).data.tags
    code, err = radt_import(capsys, "--prometheus", server.url, "--run", run_id, "--store", store_uri, "--gpus", "0")
    assert code == 0, err
    tags = client.get_run(run_id).data.tags
    assert PROMETHEUS_GAP_TAG not in tags and tags[PROMETHEUS_TAG].startswith(server.url)


def test_each_node_of_a_run_tags_its_own_prometheus_gap(tmp_path, sqlite_template, radt_home):
    """Two nodes joining one run (MLFLOW_RUN_ID + MLFLOW_SYSTEM_METRICS_NODE_ID) with Prometheus down: each part's gap under
    radt.node.<node>/prometheus_gap, the run's own tag naming both, written with the part's last tags."""
    store = tmp_path / "store.db"
    shutil.copy(sqlite_template, store)
    uri = f"sqlite:///{store}"
    client = MlflowClient(tracking_uri=uri)
    run_id = client.create_run(client.create_experiment("nodes")).info.run_id
    (tmp_path / "train.py").write_text("print('trained')\n")
    down = f"http://127.0.0.1:{free_port()}"
    for node in ("n1", "n2"):
        env = radt_env(radt_home, uri, extra={"MLFLOW_RUN_ID": run_id, "MLFLOW_SYSTEM_METRICS_NODE_ID": node})
        done = run_radt(["--prometheus", down, "-l", "host", "train.py"], env, tmp_path, timeout=60)
        assert done.returncode == 0 and "trained" in done.stdout, done.stderr
    run = client.get_run(run_id)
    tags = run.data.tags
    assert run.info.status == "FINISHED"
    for node in ("n1", "n2"):
        assert tags[f"radt.node.{node}/prometheus_gap"].startswith(f"radt: listener 'prometheus': Prometheus at {down} did not answer")
    assert tags[PROMETHEUS_GAP_TAG] == f"n1: {tags['radt.node.n1/prometheus_gap']}; n2: {tags['radt.node.n2/prometheus_gap']}"


def test_a_csv_experiment_reads_prometheus_from_the_option(served, tmp_path, sqlite_template, radt_home):
    """`radt --prometheus URL experiment.csv`: a row whose Listeners name prometheus reads the URL the option gave."""
    _, server, _ = served
    store = tmp_path / "store.db"
    shutil.copy(sqlite_template, store)
    uri = f"sqlite:///{store}"
    (tmp_path / "train.py").write_text(prom.LIVE_TRAIN)
    (tmp_path / "experiment.csv").write_text(
        "Experiment,Workload,Status,Run,Devices,Collocation,File,Listeners,Params\nprom-csv,1,,,-,-,train.py,prometheus+host,3\n"
    )
    done = run_radt(["--prometheus", server.url, "--interval", "0.5", "experiment.csv"], radt_env(radt_home, uri), tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "'prometheus'" not in done.stderr, done.stderr
    client, run = run_of(uri)
    got = in_run(client, run.info.run_id)
    every = held(server, HERE, 0, int(run.info.start_time) - 60_000, int(run.info.end_time) + 5_000)
    assert len(got["system/gpu_0_sm_active"]) >= 3 and got["system/gpu_0_sm_active"].items() <= every["system/gpu_0_sm_active"].items()
    assert "FINISHED" in (tmp_path / "experiment.csv").read_text()
