"""`radt import --prometheus` and the prometheus listener's final read, against a real Prometheus scraping a
dcgm-exporter stand-in that serves a recorded `dcgmi dmon` log: the run holds exactly what Prometheus holds."""

from __future__ import annotations

import shutil
import socket
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from radt.cli import main as radt_main
from radt.collectors.promql import EXPORTER_METRICS
from radt.collectors.sources.prometheus import PROMETHEUS_GAP_TAG, PROMETHEUS_TAG
from radt.runmodel import SCRIPT_END_TAG, SCRIPT_START_TAG
from tests.support import prometheus as prom
from tests.support.dcgm_exporter import DcgmExporter, Device
from tests.support.ports import free_port
from tests.support.radtproc import radt_env, run_radt

LOG = Path(__file__).parent / "fixtures" / "real-tool-logs" / "mnist_dcgmi_dmon_18fields.txt"
HOST = "node-a"
HERE = socket.gethostname()
DEVICES = [Device(HOST, 0, 0), Device(HOST, 1, 2), Device("node-b", 0, 4), Device(HERE, 0, 2), Device(HERE, 1, 0)]
SCRAPES = 4


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(exporter, Prometheus, time before the first scrape in ms) once SCRAPES scrapes are stored."""
    assert prom.available(), "Debian's prometheus is not installed (apt-get install prometheus; .ci/run installs it)"
    folder = tmp_path_factory.mktemp("prometheus")
    start_ms = int(time.time() * 1000)
    with DcgmExporter(LOG, DEVICES, start=5) as exporter, prom.Prometheus(folder, [exporter.target]) as server:
        server.wait_samples(f'DCGM_FI_PROF_SM_ACTIVE{{Hostname="{HOST}",gpu="0"}}[1h]', SCRAPES)
        yield exporter, server, start_ms


def held(server: prom.Prometheus, host: str, gpu: int, start_ms: int, end_ms: int) -> dict[str, dict[int, float]]:
    """{catalogue key: {timestamp: value}}: what Prometheus itself holds for one GPU of `host` in [start_ms, end_ms]."""
    names = "|".join(EXPORTER_METRICS)
    span = end_ms - start_ms + 1
    data = server.api("/api/v1/query", query=f'{{__name__=~"{names}",Hostname="{host}",gpu="{gpu}"}}[{span}ms]', time=f"{end_ms / 1000:.3f}")
    out: dict[str, dict[int, float]] = {}
    for series in data["result"]:
        metric = series["metric"]["__name__"]
        name, scale = EXPORTER_METRICS[metric]
        out[f"system/gpu_{gpu}_{name}"] = {
            round(float(t) * 1000): float(v) * scale for t, v in series["values"] if start_ms <= round(float(t) * 1000) <= end_ms
        }
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
    run = client.create_run(client.create_experiment("prom"), start_time=start_ms + 1500)  # plain MLflow: no radt tags
    run_id = run.info.run_id
    end_ms = int(time.time() * 1000)
    client.set_terminated(run_id, "FINISHED", end_time=end_ms)
    code, err = radt_import(capsys, "--prometheus", server.url, "--run", run_id, "--store", store_uri)
    assert code == 2 and err.count("\n") == 1 and "--host" in err, err  # where it ran is not in the run

    code, err = radt_import(capsys, "--prometheus", server.url + "/", "--run", run_id, "--store", store_uri, "--host", HOST, "--gpus", "0")
    assert code == 0, err
    want = held(server, HOST, 0, start_ms + 1500, end_ms)
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


def test_a_run_ends_with_every_scrape_prometheus_holds(served, tmp_path, sqlite_template, radt_home):
    """`-l prometheus` at a 2 s interval returns every other scrape live; the final read adds the rest at their own times."""
    exporter, server, _ = served
    store = tmp_path / "store.db"
    shutil.copy(sqlite_template, store)
    uri = f"sqlite:///{store}"
    script = tmp_path / "train.py"
    script.write_text("import time\ntime.sleep(5)\n")
    env = radt_env(radt_home, uri, extra={"RADT_PROMETHEUS_URL": server.url})
    done = run_radt(["-l", "prometheus+host", "--interval", "2", str(script)], env, tmp_path, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "'prometheus'" not in done.stderr, done.stderr
    client = MlflowClient(tracking_uri=uri)
    run = client.search_runs([e.experiment_id for e in client.search_experiments()])[0]
    start, end = int(run.data.tags[SCRIPT_START_TAG]), int(run.data.tags[SCRIPT_END_TAG])
    got = {k: v for k, v in in_run(client, run.info.run_id).items() if k.startswith("system/gpu_")}
    for gpu in (0, 1):
        want = held(server, HERE, gpu, start, end)
        assert want and set(k for k in got if k.startswith(f"system/gpu_{gpu}_")) == set(want)
        for where, scrapes in want.items():
            series = got[where]
            live = sorted(v for t, v in series.items() if t not in scrapes)  # returned at the sampler's ticks
            late = {t: v for t, v in series.items() if t in scrapes}  # the final read, at the scrapes' own times
            assert late and all(scrapes[t] == v for t, v in late.items()), where
            skipped = sorted(v for t, v in scrapes.items() if t not in late)  # the ones returned live
            assert skipped, (where, series)  # nothing the live source returned is written twice
            assert set(skipped) <= set(live) and len(skipped) <= len(live) <= len(skipped) + 3, (where, skipped, live)


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
