"""Naming the node in Prometheus: a real Prometheus scraping two dcgm-exporter stand-ins, one with dcgm-exporter's
`Hostname` label for a pod whose name is not this machine's, one with newer exporters' lower-case `hostname` (and
`pci_bus_id`) for this machine. `--host NAME` / `RADT_HOST` name the node for a live run, `radt monitor` and the run's
tags; both label spellings are tried by default; a node with no series is one line naming what was looked for."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from radt.catalogue import EXPORTER_METRICS
from radt.cli import main as radt_main
from radt.runmodel import HOST_TAG, HOSTNAME_TAG, PROMETHEUS_GAP_TAG
from tests.support import prometheus as prom
from tests.support.dcgm_exporter import DcgmExporter, Device
from tests.support.polling import wait_for
from tests.support.radtproc import radt_command, radt_env, run_radt

pytestmark = pytest.mark.skipif(
    not prom.available() and os.environ.get("CI") != "true", reason="needs Debian's prometheus package (.ci/run installs it; under CI it must be there)"
)

LOG = Path(__file__).parent / "fixtures" / "real-tool-logs" / "mnist_dcgmi_dmon_18fields.txt"
HERE = socket.gethostname()
POD = "trainer-7f9c4d-x2k8q"  # a Kubernetes pod's name, as the exporter labels the node: not this machine's
NEWER = "gpu-node-3"  # a node whose exporter spells the label `hostname`
OLDER = [Device(POD, 0, 0), Device(POD, 1, 2), Device("node-b", 0, 4)]  # Hostname="..."
LOWER = [Device(HERE, 0, 2), Device(HERE, 1, 0), Device(NEWER, 0, 3)]  # hostname="...", pci_bus_id="..."
SCRAPES = 4


@pytest.fixture(scope="module")
def served():
    """A real Prometheus scraping both exporters, once each has SCRAPES scrapes stored; the time before them in ms."""
    assert prom.available(), "Debian's prometheus is not installed (apt-get install prometheus; .ci/run installs it)"
    start_ms = int(time.time() * 1000)
    with (
        prom.taken() as server,
        DcgmExporter(LOG, OLDER, start=5, port=server.ports[0]),
        DcgmExporter(LOG, LOWER, start=5, lower_case=True, port=server.ports[1]),
    ):
        server.wait_samples(f'DCGM_FI_PROF_SM_ACTIVE{{Hostname="{POD}",gpu="0"}}[1h]', SCRAPES)
        server.wait_samples(f'DCGM_FI_PROF_SM_ACTIVE{{hostname="{HERE}",gpu="0"}}[1h]', SCRAPES)
        yield server, start_ms


def held(server: prom.Prometheus, label: str, host: str, gpu: int, start_ms: int, end_ms: int) -> dict[str, dict[int, float]]:
    """{catalogue key: {timestamp: value}}: what Prometheus itself holds for one GPU of `host` (by `label`) in [start_ms, end_ms]."""
    names = "|".join(EXPORTER_METRICS)
    promql = f'{{__name__=~"{names}",{label}="{host}",gpu="{gpu}"}}[{end_ms - start_ms + 1}ms]'
    out: dict[str, dict[int, float]] = {}
    for series in server.api("/api/v1/query", query=promql, time=f"{end_ms / 1000:.3f}")["result"]:
        name, scale = EXPORTER_METRICS[series["metric"]["__name__"]]
        stamps = {round(float(t) * 1000): float(v) * scale for t, v in series["values"]}
        out[f"system/gpu_{gpu}_{name}"] = {t: v for t, v in stamps.items() if start_ms <= t <= end_ms}
    return {k: v for k, v in out.items() if v}


def gpu_series(client: MlflowClient, run_id: str) -> dict[str, dict[int, float]]:
    """{key: {timestamp: value}} of the run's GPU series."""
    keys = [k for k in client.get_run(run_id).data.metrics if k.startswith("system/gpu_")]
    return {k: {m.timestamp: m.value for m in client.get_metric_history(run_id, k)} for k in keys}


def the_run(uri: str):
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()], "tags.`radt.role` = 'run'")
    assert len(runs) == 1, runs
    return client, runs[0]


def fresh_store(tmp_path: Path, sqlite_template: Path) -> str:
    store = tmp_path / "store.db"
    shutil.copy(sqlite_template, store)
    return f"sqlite:///{store}"


def assert_holds_the_nodes_gpu_0(server: prom.Prometheus, client: MlflowClient, run, label: str, host: str) -> None:
    """The run's GPU series are exactly `host`'s GPU 0 (by `label`): every scrape while the script ran, nothing else."""
    start, end = int(run.data.tags["radt.script_start_ms"]), int(run.data.tags["radt.script_end_ms"])
    got = gpu_series(client, run.info.run_id)
    want = held(server, label, host, 0, start, end)
    every = held(server, label, host, 0, start - 60_000, end + 5_000)
    assert want and set(got) == set(want), (sorted(got), sorted(want))
    for key, scrapes in want.items():
        assert scrapes.items() <= got[key].items(), key  # each scrape of the script's time, at its own time
        assert got[key].items() <= every[key].items(), key  # and nothing another node's or made up


@pytest.mark.parametrize("given", ["option", "environment"])
def test_a_run_given_the_pods_node_name_stores_its_series_and_tags_it(given, served, tmp_path, sqlite_template, radt_home):
    """In a pod (its host name is not the exporter's Hostname): `radt --host POD` or RADT_HOST=POD reads POD's series and
    tags the run with it, keeping the machine's own name beside it."""
    server, _ = served
    uri = fresh_store(tmp_path, sqlite_template)
    (tmp_path / "train.py").write_text(prom.LIVE_TRAIN)
    env = radt_env(radt_home, uri, extra={"RADT_HOST": POD} if given == "environment" else {})
    host = ["--host", POD] if given == "option" else []
    done = run_radt(["--prometheus", server.url, *host, "-d", "0", "-l", "prometheus+host", "--interval", "0.5", "train.py", "3"], env, tmp_path, timeout=90)
    assert done.returncode == 0, done.stderr
    assert "'prometheus'" not in done.stderr, done.stderr  # no "no series" line
    assert int(done.stdout.split("saw ")[1].split()[0]) >= 3, done.stdout  # read live, while the script trained
    client, run = the_run(uri)
    assert run.data.tags[HOST_TAG] == POD and run.data.tags[HOSTNAME_TAG] == HERE
    assert PROMETHEUS_GAP_TAG not in run.data.tags
    assert_holds_the_nodes_gpu_0(server, client, run, "Hostname", POD)


def test_an_exporter_that_spells_it_hostname_is_read_with_no_option(served, tmp_path, sqlite_template, radt_home):
    """Newer exporters label the node `hostname`: a plain `radt --prometheus URL` on this machine reads it."""
    server, _ = served
    uri = fresh_store(tmp_path, sqlite_template)
    (tmp_path / "train.py").write_text(prom.LIVE_TRAIN)
    done = run_radt(
        ["--prometheus", server.url, "-d", "0", "-l", "prometheus+host", "--interval", "0.5", "train.py", "3"], radt_env(radt_home, uri), tmp_path, timeout=90
    )
    assert done.returncode == 0, done.stderr
    assert "'prometheus'" not in done.stderr, done.stderr
    client, run = the_run(uri)
    assert run.data.tags[HOST_TAG] == HERE and HOSTNAME_TAG not in run.data.tags
    assert_holds_the_nodes_gpu_0(server, client, run, "hostname", HERE)


def test_no_series_is_one_line_naming_both_labels_and_the_name_looked_for(served, tmp_path, sqlite_template, radt_home):
    server, _ = served
    uri = fresh_store(tmp_path, sqlite_template)
    (tmp_path / "train.py").write_text("print('trained')\n")
    done = run_radt(["--prometheus", server.url, "--host", "pod-elsewhere", "-d", "0", "-l", "prometheus+host", "train.py"], radt_env(radt_home, uri), tmp_path)
    assert done.returncode == 0 and "trained" in done.stdout, done.stderr
    said = [line for line in done.stderr.splitlines() if "'prometheus'" in line]
    assert len(said) == 1, done.stderr
    assert said[0].startswith(
        f"radt: listener 'prometheus': no dcgm-exporter series for GPU 0 of Hostname=pod-elsewhere or hostname=pod-elsewhere at {server.url}; "
    ), said
    assert "--host NAME (or RADT_HOST)" in said[0] and "RADT_PROMETHEUS_HOST_LABEL" in said[0]
    _, run = the_run(uri)
    assert run.data.tags[PROMETHEUS_GAP_TAG] == said[0] and run.data.tags[HOST_TAG] == "pod-elsewhere"


def test_monitor_given_the_pods_node_name_records_its_series(served, tmp_path, sqlite_template, radt_home):
    """`radt monitor --host POD -l prometheus`: POD's GPUs (not node-b's GPU 0), in a run named and tagged for POD."""
    server, _ = served
    uri = fresh_store(tmp_path, sqlite_template)
    env = radt_env(radt_home, uri, extra={"RADT_PROMETHEUS_URL": server.url})
    proc = subprocess.Popen(
        radt_command("monitor", "--host", POD, "-l", "prometheus", "--interval", "0.5"),
        env=env,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    client = MlflowClient(tracking_uri=uri)

    def recorded():
        runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
        return runs and all(len(client.get_metric_history(runs[0].info.run_id, f"system/gpu_{g}_sm_active")) >= 2 for g in (0, 1)) and runs[0]

    try:
        run = wait_for(recorded, timeout=60, what="2 scrapes of POD's GPUs in the monitor run", process=proc)
    finally:
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "'prometheus'" not in stderr, stderr
    run = client.get_run(run.info.run_id)
    assert run.info.run_name.startswith(f"{POD} ") and run.data.tags[HOST_TAG] == POD and run.data.tags[HOSTNAME_TAG] == HERE
    got = gpu_series(client, run.info.run_id)
    every = held(server, "Hostname", POD, 0, 0, int(time.time() * 1000)) | held(server, "Hostname", POD, 1, 0, int(time.time() * 1000))
    assert got and set(got) <= set(every) and {k.split("_")[1] for k in got} == {"0", "1"}
    for key, series in got.items():
        assert series.items() <= every[key].items(), key  # POD's own scrapes; node-b's GPU 0 has other values


def radt_import(capsys, *args: str) -> tuple[int, str]:
    code = radt_main(["import", *args])
    return code, capsys.readouterr().err


def test_import_tries_both_spellings_and_names_them_when_neither_matches(served, tmp_path, sqlite_template, capsys):
    server, start_ms = served
    uri = fresh_store(tmp_path, sqlite_template)
    client = MlflowClient(tracking_uri=uri)
    run_id = client.create_run(client.create_experiment("prom"), start_time=start_ms).info.run_id
    end_ms = int(time.time() * 1000)
    client.set_terminated(run_id, "FINISHED", end_time=end_ms)
    code, err = radt_import(capsys, "--prometheus", server.url, "--run", run_id, "--store", uri, "--host", NEWER, "--gpus", "0")
    assert code == 0 and PROMETHEUS_GAP_TAG not in client.get_run(run_id).data.tags, err
    want = held(server, "hostname", NEWER, 0, start_ms, end_ms)
    assert want and gpu_series(client, run_id) == want

    other = client.create_run(client.create_experiment("elsewhere"), start_time=start_ms).info.run_id
    client.set_terminated(other, "FINISHED", end_time=end_ms)
    code, err = radt_import(capsys, "--prometheus", server.url, "--run", other, "--store", uri, "--host", "pod-elsewhere", "--gpus", "0")
    line = err.splitlines()[0]
    assert code == 0 and line.startswith("radt import: no dcgm-exporter series for GPU 0"), err
    assert line.endswith(f" of Hostname=pod-elsewhere or hostname=pod-elsewhere at {server.url} over the run"), err
    assert client.get_run(other).data.tags[PROMETHEUS_GAP_TAG] == line.removeprefix("radt import: ")
    code, err = radt_import(capsys, "--prometheus", server.url, "--run", other, "--store", uri, "--host", NEWER, "--gpus", "0", "--host-label", "Hostname")
    assert err.splitlines()[0].endswith(f" of Hostname={NEWER} at {server.url} over the run"), err  # the one label given, only


def test_a_bad_host_is_one_line_and_a_scripts_own_host_option_is_its_own(tmp_path, radt_home):
    (tmp_path / "train.py").write_text("import sys\nprint(sys.argv[1:])\n")
    env = radt_env(radt_home, f"sqlite:///{tmp_path / 'store.db'}")
    done = run_radt(["--host", " ", "train.py"], env, tmp_path, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == "radt: --host ' ' is not a host name; give the node's name as its exporter labels it, e.g. --host gpu-node-7\n"
    done = run_radt(["train.py"], {**env, "RADT_HOST": "my pod"}, tmp_path, timeout=60)
    assert done.returncode == 2 and done.stderr == "radt: RADT_HOST='my pod' is not a host name without spaces such as gpu-node-7; give one, or unset it\n"
    (tmp_path / "experiment.csv").write_text("Experiment,Workload,Status,Run,Devices,Collocation,Listeners,File,Params\n")
    done = run_radt(["--slurm", "--host", POD, "experiment.csv"], env, tmp_path, timeout=60)
    assert done.returncode == 2 and done.stderr.startswith("radt: --host names this node; a --slurm job runs on the node Slurm picks"), done.stderr
    done = run_radt(["-l", "host", "train.py", "--host", "x"], env, tmp_path, timeout=60)  # after the script: the script's
    assert done.returncode == 0 and "['--host', 'x']" in done.stdout, done.stderr
    _, run = the_run(f"sqlite:///{tmp_path / 'store.db'}")
    assert run.data.tags[HOST_TAG] == HERE
