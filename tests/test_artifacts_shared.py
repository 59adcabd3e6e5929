"""Artifacts every host can read (issue #15, point 3): with a database store, `--artifacts` / RADT_ARTIFACT_URI
puts a new experiment's artifacts where the dashboard's host reads them too: an `mlflow server`'s proxied
artifacts (mlflow-artifacts://host:port/path), a shared folder, any URI MLflow's artifact stores take.

A real `mlflow server --serve-artifacts` (its own SQLite database, which radt writes directly), radt as a
user runs it, and the dashboard's reader on another RADT_HOME (another host's: nothing of the run's folder).
"""

from __future__ import annotations

import json
from pathlib import Path

import flask
import pytest
import sqlalchemy as sa
from mlflow import MlflowClient

from radt import artifacts as uris
from radt.app.db.state import connect_store
from radt.app.web import artifacts as reader
from radt.collectors.store import tracking
from tests.support.mlflowserver import MlflowServer
from tests.support.radtproc import radt_env, run_radt
from tests.test_run_e2e import TRAIN, _only_run, _steps

SCRIPT = "print('epoch 1 loss 0.5 on node-a', flush=True)\n"
RUN = ["-l", "host", "--interval", "0.2", "train.py"]


def _train(folder: Path) -> None:
    (folder / "train.py").write_text(SCRIPT)


def _run(uri: str, run_id: str) -> dict:
    with sa.create_engine(uri).connect() as conn:
        row = conn.execute(sa.text("select status, artifact_uri from runs where run_uuid = :id"), {"id": run_id}).mappings().one()
    return dict(row)


def _run_id(stderr: str) -> str:
    return next(line.split()[2] for line in stderr.splitlines() if line.startswith("radt: run ") and " in experiment" in line)


def _dashboard_on_another_host(monkeypatch, tmp_path: Path, store: str) -> flask.testing.FlaskClient:
    """The dashboard's reader as another host runs it: its own RADT_HOME, the store, nothing of the run's folder."""
    monkeypatch.setenv("RADT_HOME", str(tmp_path / "dashboard-host"))
    connect_store(store)
    server = flask.Flask(__name__)
    reader.install(server)
    return server.test_client()


@pytest.fixture(scope="module")
def server(tmp_path_factory, sqlite_template):
    """`mlflow server --backend-store-uri sqlite:///... --artifacts-destination <folder>/artifacts` (serving artifacts),
    shared by this module's tests (each in its own experiment): starting one takes seconds."""
    with MlflowServer(tmp_path_factory.mktemp("server"), sqlite_template) as started:
        yield started


def test_logs_go_through_the_mlflow_server_and_every_host_reads_them(server, radt_home, tmp_path, monkeypatch):
    _train(tmp_path)
    with open(tmp_path / "train.py", "a") as script:  # the script's own MLflow, on the database store, into the same run
        script.write("import mlflow\nmlflow.start_run()\nmlflow.log_text('from the script', 'mine/note.txt')\n")
    root = f"mlflow-artifacts://127.0.0.1:{server.port}/radt"
    result = run_radt(["--artifacts", root, "-e", "shared", *RUN], env=radt_env(radt_home, server.backend), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    run_id = _run_id(result.stderr)

    row = _run(server.backend, run_id)  # the server's artifact service spelled out: every MLflow client reads it, whatever its store
    assert row == {"status": "FINISHED", "artifact_uri": f"{server.uri}/api/2.0/mlflow-artifacts/artifacts/radt/shared/{run_id}/artifacts"}
    landed = server.folder / "artifacts" / "radt" / "shared" / run_id / "artifacts" / "radt" / "stdout.log"
    assert "loss 0.5 on node-a" in landed.read_text()  # in the server's artifacts destination ...
    assert not list((radt_home / "artifacts").rglob("stdout.log"))  # ... not under ~/.radt on the GPU node
    listed = {f.path for f in MlflowClient(server.uri).list_artifacts(run_id, "radt")}  # MLflow's own client finds them
    assert "radt/stdout.log" in listed
    assert Path(MlflowClient(server.uri).download_artifacts(run_id, "mine/note.txt", str(tmp_path))).read_text() == "from the script"

    monkeypatch.setenv("RADT_ARTIFACT_URI", root)  # the dashboard host names the server (it fetches no other)
    dashboard = _dashboard_on_another_host(monkeypatch, tmp_path, server.backend)
    assert "radt/stdout.log" in {entry.path for entry in reader.list_files(run_id)}
    assert "loss 0.5 on node-a" in reader.read_text(run_id, "radt/stdout.log")
    page = dashboard.get(f"/runs/{run_id}/artifacts")
    assert page.status_code == 200 and "loss 0.5 on node-a" in page.text  # the listing shows the log
    assert "loss 0.5 on node-a" in dashboard.get(f"/runs/{run_id}/artifacts/radt/stdout.log").text


def test_through_an_mlflow_server(server, radt_home, tmp_path):
    """radt tracking a script through the server's REST API (moved here from test_run_e2e.py: on this module's server,
    in an experiment of its own, instead of starting a server of its own)."""
    (tmp_path / "train.py").write_text(TRAIN)
    args = ["-e", "http", "-l", "host", "--interval", "0.2", "train.py", "--epochs", "3"]
    result = run_radt(args, env=radt_env(radt_home, server.uri), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    client = MlflowClient(server.uri)
    run = _only_run(client, "http")
    assert run.info.status == "FINISHED"
    assert _steps(client, run.info.run_id, "loss") == [0, 1, 2]
    cpu = client.get_metric_history(run.info.run_id, "system/cpu_utilization_percentage")
    assert len(cpu) >= 5
    assert int(run.data.tags["radt.points"]) >= 5 * 6
    assert "radt/stdout.log" in {f.path for f in client.list_artifacts(run.info.run_id, "radt")}


def test_an_experiment_the_server_made_keeps_its_location_and_radt_reaches_it_through_the_server_named(server, radt_home, tmp_path, monkeypatch):
    made = MlflowClient(server.uri).create_experiment("made by the server")  # its location: mlflow-artifacts:/<id>, no host
    _train(tmp_path)
    root = f"mlflow-artifacts://127.0.0.1:{server.port}/radt"
    result = run_radt(["--artifacts", root, "-e", "made by the server", *RUN], env=radt_env(radt_home, server.backend), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    run_id = _run_id(result.stderr)
    said = [line for line in result.stderr.splitlines() if "keeps its artifact location" in line]
    assert len(said) == 1 and f"mlflow-artifacts:/{made}" in said[0], result.stderr  # MLflow's rule, said once
    assert _run(server.backend, run_id)["artifact_uri"] == f"mlflow-artifacts:/{made}/{run_id}/artifacts"
    assert "node-a" in (server.folder / "artifacts" / made / run_id / "artifacts" / "radt" / "stdout.log").read_text()

    monkeypatch.setenv("RADT_ARTIFACT_URI", root)  # the dashboard host names the server the same way
    _dashboard_on_another_host(monkeypatch, tmp_path, server.backend)
    assert "node-a" in reader.read_text(run_id, "radt/stdout.log")


def test_a_shared_folder_holds_the_artifacts_of_new_experiments(store_uri, radt_home, tmp_path, monkeypatch):
    shared = tmp_path / "nfs" / "mlflow-artifacts"
    shared.mkdir(parents=True)
    _train(tmp_path)
    (tmp_path / "report.nsys-rep").write_bytes(b"\x00nsys report")
    env = radt_env(radt_home, store_uri, extra={"RADT_ARTIFACT_URI": str(shared)})
    result = run_radt(["-e", "on nfs", *RUN], env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    run_id = _run_id(result.stderr)

    assert _run(store_uri, run_id)["artifact_uri"] == f"{shared.as_uri()}/on_nfs/{run_id}/artifacts"
    assert "node-a" in (shared / "on_nfs" / run_id / "artifacts" / "radt" / "stdout.log").read_text()
    tracking.connect(store_uri).log_artifact(run_id, str(tmp_path / "report.nsys-rep"), "radt")  # as the profiler's report is attached

    monkeypatch.setenv("RADT_ARTIFACT_ROOTS", str(shared))  # the dashboard's host names the shared folder it serves (README)
    dashboard = _dashboard_on_another_host(monkeypatch, tmp_path, store_uri)
    assert "node-a" in reader.read_text(run_id, "radt/stdout.log")
    report = dashboard.get(f"/runs/{run_id}/artifacts/radt/report.nsys-rep")
    assert report.status_code == 200 and report.data == b"\x00nsys report"
    assert "attachment" in report.headers["Content-Disposition"]  # offered as a download, not shown


def test_artifact_server_down_at_run_end_keeps_status_and_logs_and_sync_uploads_them(tmp_path, sqlite_template, radt_home):
    (tmp_path / "server").mkdir()
    server = MlflowServer(tmp_path / "server", sqlite_template)  # its port, not listening yet
    _train(tmp_path)
    env = radt_env(radt_home, server.backend)
    result = run_radt(["--artifacts", f"mlflow-artifacts://127.0.0.1:{server.port}/radt", "-e", "down", *RUN], env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    run_id = _run_id(result.stderr)

    assert _run(server.backend, run_id)["status"] == "FINISHED"  # the status and the points are in the store
    said = [line for line in result.stderr.splitlines() if "could not upload the logs" in line]
    assert len(said) == 1 and "radt sync" in said[0] and str(radt_home / "runs" / run_id / "logs") in said[0], result.stderr
    assert "node-a" in (radt_home / "runs" / run_id / "logs" / "stdout.log").read_text()
    assert json.loads((radt_home / "runs" / run_id / "pending.json").read_text())["status"] == "FINISHED"

    with server:
        synced = run_radt(["sync"], env=env, cwd=tmp_path)
        assert synced.returncode == 0, synced.stderr
        landed = server.folder / "artifacts" / "radt" / "down" / run_id / "artifacts" / "radt" / "stdout.log"
        assert "node-a" in landed.read_text()
        assert not (radt_home / "runs" / run_id / "pending.json").exists()
        assert _run(server.backend, run_id)["status"] == "FINISHED"


def test_an_existing_experiment_keeps_its_location_said_once(store_uri, tmp_path, monkeypatch, capsys):
    client = tracking.connect(store_uri)
    old = tracking.resolve_experiment(client, store_uri, "before")  # RADT_HOME/artifacts/before
    monkeypatch.setenv("RADT_ARTIFACT_URI", (tmp_path / "shared").as_uri())
    assert tracking.resolve_experiment(client, store_uri, "before") == old
    assert tracking.resolve_experiment(client, store_uri, "before") == old
    said = capsys.readouterr().err.splitlines()
    assert len(said) == 1 and "keeps its artifact location" in said[0] and "new -e name" in said[0]
    new = tracking.resolve_experiment(client, store_uri, "after")
    assert client.get_experiment(new).artifact_location == f"{(tmp_path / 'shared').as_uri()}/after"
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("/no/such/shared/folder", "does not exist here; mount the shared filesystem"),
        ("mlflow-artifacts:/radt", "names no server, and the tracking store is a database; give the mlflow server"),
        ("http://mlflow:5000", "is not an mlflow server's artifact service; give http://mlflow:5000/api/2.0/mlflow-artifacts/artifacts/<path>"),
        ("s4://bucket/radt", "MLflow has no artifact repository for 's4:'"),
    ],
)
def test_an_artifact_uri_radt_cannot_write_to_is_one_line_and_exit_2(value, expected, radt_home, tmp_path):
    _train(tmp_path)
    result = run_radt(["--artifacts", value, *RUN], env=radt_env(radt_home), cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [result.stderr.strip()] and expected in result.stderr, result.stderr
    assert result.stderr.startswith(f"radt: --artifacts {value}")


@pytest.mark.parametrize(
    ("value", "store", "expected"),
    [
        ("mlflow-artifacts://mlflow:5000/radt", "postgresql://db/mlflow", "http://mlflow:5000/api/2.0/mlflow-artifacts/artifacts/radt"),
        ("mlflow-artifacts://mlflow:5000/radt", "http://mlflow:5000", "mlflow-artifacts://mlflow:5000/radt"),
        ("mlflow-artifacts:/radt/", "http://mlflow:5000", "mlflow-artifacts:/radt"),
        ("http://mlflow:5000/api/2.0/mlflow-artifacts/artifacts/radt", "sqlite:///x.db", "http://mlflow:5000/api/2.0/mlflow-artifacts/artifacts/radt"),
        ("s3://bucket/radt", "postgresql://db/mlflow", "s3://bucket/radt"),
    ],
)
def test_accepted_artifact_uris(value, store, expected):
    assert uris.check_uri(value, store=store) == expected


def test_the_server_an_artifact_uri_names():
    assert uris.server_of("mlflow-artifacts://mlflow:5000/radt") == "http://mlflow:5000"
    assert uris.server_of("https://lab.org/mlflow/api/2.0/mlflow-artifacts/artifacts/radt") == "https://lab.org/mlflow"
    assert uris.server_of("mlflow-artifacts:/radt") is None
    assert uris.server_of("s3://bucket/radt") is None


def test_radt_monitor_takes_the_same_option(radt_home, tmp_path):
    result = run_radt(["monitor", "--artifacts", str(tmp_path / "not-mounted")], env=radt_env(radt_home), cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith(f"radt monitor: --artifacts {tmp_path / 'not-mounted'}: the folder") and result.stderr.count("\n") == 1, result.stderr
