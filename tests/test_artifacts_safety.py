"""The dashboard's artifact pages serve the run's artifact folder and nothing else (issue #24, point 1).

A user who can write into a run's artifact folder (a shared folder) plants `leak.txt -> /etc/passwd` and
`etcdir -> /etc`; an MLflow user gives an experiment the artifact location `http://<internal host>/...`.
Old dashboard: /etc/passwd came back with HTTP 200, and the dashboard host fetched the URL. Now both answer
404 with no byte of the file, and the URL is shown on the page as a link for the browser, never fetched.
The real route on a Flask server (as tests/test_artifacts_shared.py), the real store, real files and a real listener.
"""

from __future__ import annotations

import os
import select
import socket
import threading
from pathlib import Path

import flask
import pytest
import sqlalchemy as sa

from radt.app.db.state import connect_store
from radt.app.web import artifacts as reader
from radt.collectors.store import tracking

LOG = b"epoch 1 loss 0.5\n\xff not utf-8, served as it is\n"
PASSWD = Path("/etc/passwd").read_bytes().splitlines()[0]  # root:x:0:0:...


def _dashboard(store: str) -> flask.testing.FlaskClient:
    connect_store(store)
    server = flask.Flask(__name__)
    reader.install(server)
    return server.test_client()


def _run_in(store: str, location: str) -> str:
    """A run of a new experiment whose artifact location is `location`; its id."""
    client = tracking.connect(store)
    experiment = client.create_experiment(f"exp-{os.urandom(4).hex()}", artifact_location=location)
    return client.create_run(experiment).info.run_id


def _get(dashboard: flask.testing.FlaskClient, url: str, deadline: float = 20.0):
    """The response (redirects followed: Werkzeug merges `//`), failing (not hanging) when it takes longer than `deadline` (a FIFO the old code would wait on)."""
    got = []
    worker = threading.Thread(target=lambda: got.append(dashboard.get(url, follow_redirects=True)), daemon=True)
    worker.start()
    worker.join(deadline)
    assert got, f"GET {url} did not answer within {deadline} s"
    return got[0]


@pytest.fixture
def store(empty_sqlite, tmp_path, radt_home, monkeypatch) -> str:
    monkeypatch.delenv("RADT_ARTIFACT_URI", raising=False)
    return empty_sqlite(tmp_path / "store.db")


def test_symlinks_and_dot_dots_out_of_the_artifact_folder_are_404_and_a_log_is_served(store, tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    monkeypatch.setenv("RADT_ARTIFACT_ROOTS", f"/nonexistent{os.pathsep}{shared}")  # the dashboard host serves this shared folder
    run_id = _run_in(store, str(shared / "exp"))
    root = shared / "exp" / run_id / "artifacts"
    (root / "radt").mkdir(parents=True)
    (root / "radt" / "stdout.log").write_bytes(LOG)
    (root / "leak.txt").symlink_to("/etc/passwd")
    (root / "etcdir").symlink_to("/etc", target_is_directory=True)
    (root / "radt" / "up.txt").symlink_to("../../../../../../../../etc/passwd")  # relative, out
    (root / "same.log").symlink_to("radt/stdout.log")  # stays inside: followed
    (root / "dangling.log").symlink_to(tmp_path / "nowhere")
    os.mkfifo(root / "radt" / "pipe.log")
    dashboard = _dashboard(store)

    for url in [
        "leak.txt",
        "etcdir/passwd",
        "etcdir/hostname",
        "radt/up.txt",
        "dangling.log",
        "radt/pipe.log",
        "../../../../../../../../etc/passwd",
        "radt/../../../../../../../../etc/passwd",
        "%2e%2e/%2e%2e/%2e%2e/%2e%2e/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
        "radt/..%2f..%2f..%2f..%2f..%2f..%2f..%2f..%2fetc%2fpasswd",
        "%2fetc%2fpasswd",
        "/etc/passwd",
        "etcdir",
        "radt",
    ]:
        answer = _get(dashboard, f"/runs/{run_id}/artifacts/{url}")
        assert answer.status_code == 404, (url, answer.status_code)
        assert PASSWD not in answer.data and b"root:" not in answer.data, url

    log = _get(dashboard, f"/runs/{run_id}/artifacts/radt/stdout.log")
    assert log.status_code == 200 and log.data == LOG
    assert _get(dashboard, f"/runs/{run_id}/artifacts/same.log").data == LOG

    listing = _get(dashboard, f"/runs/{run_id}/artifacts")
    assert listing.status_code == 200  # a dangling link does not break the page (old: 502)
    assert "radt/stdout.log" in listing.text and "same.log" in listing.text and "epoch 1 loss 0.5" in listing.text
    for planted in ("leak.txt", "etcdir", "up.txt", "dangling.log", "pipe.log"):
        assert planted not in listing.text, planted
    assert PASSWD.decode() not in listing.text


@pytest.mark.parametrize("location", ["file:///etc", "/etc", "/root", "file:///"])
def test_a_run_whose_artifact_uri_is_a_system_folder_is_not_served(store, location):
    """Every radt user writes the shared store directly (radt's SQL path), so a run's artifact_uri can be set to /etc:
    old dashboard served /etc/passwd as 'passwd' of that run, "inside the run's own root". Only configured folders are served."""
    run_id = _run_in(store, "/tmp/ordinary")
    engine = sa.create_engine(store)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE runs SET artifact_uri = :uri WHERE run_uuid = :run"), {"uri": location, "run": run_id})
    engine.dispose()
    dashboard = _dashboard(store)

    for url in ("passwd", "etc/passwd", "root/.bashrc", "hostname"):
        answer = _get(dashboard, f"/runs/{run_id}/artifacts/{url}")
        assert answer.status_code == 404 and PASSWD not in answer.data and b"root:" not in answer.data, url
    listing = _get(dashboard, f"/runs/{run_id}/artifacts")
    assert listing.status_code == 404 and "passwd" not in listing.text
    assert "outside the folders this dashboard serves" in listing.text and "RADT_ARTIFACT_ROOTS" in listing.text


def test_a_run_folder_replaced_by_a_symlink_out_of_the_configured_root_is_404(store, tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir()
    monkeypatch.setenv("RADT_ARTIFACT_URI", str(shared))  # the dashboard host's configured root, as the README says
    run_id = _run_in(store, str(shared / "exp"))
    (shared / "exp" / run_id).mkdir(parents=True)
    (shared / "exp" / run_id / "artifacts").symlink_to("/etc", target_is_directory=True)
    dashboard = _dashboard(store)

    answer = _get(dashboard, f"/runs/{run_id}/artifacts/passwd")
    assert answer.status_code == 404 and PASSWD not in answer.data
    listing = _get(dashboard, f"/runs/{run_id}/artifacts")
    assert listing.status_code == 404 and "passwd" not in listing.text


class Listener:
    """A TCP listener on 127.0.0.1 that accepts, records and closes every connection (an internal host)."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted: list[tuple] = []
        self._stop_r, self._stop_w = os.pipe()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            ready, _, _ = select.select([self.sock, self._stop_r], [], [])
            if self._stop_r in ready:
                return
            conn, peer = self.sock.accept()
            self.accepted.append(peer)
            conn.close()

    def connections(self) -> int:
        """Every connection made so far: those accepted, and those still waiting in the backlog."""
        os.write(self._stop_w, b"x")
        self._thread.join(10)
        self.sock.setblocking(False)
        while True:
            try:
                conn, peer = self.sock.accept()
            except BlockingIOError:
                break
            self.accepted.append(peer)
            conn.close()
        return len(self.accepted)

    def close(self) -> None:
        self.sock.close()
        os.close(self._stop_r)
        os.close(self._stop_w)


@pytest.mark.parametrize(
    "location, link",
    [
        ("http://127.0.0.1:{port}/x", True),
        ("http://127.0.0.1:{port}/api/2.0/mlflow-artifacts/artifacts/x", True),  # looks like an artifact proxy, is not the dashboard's
        ("mlflow-artifacts://127.0.0.1:{port}/x", False),
    ],
    ids=["http", "fake-proxy", "mlflow-artifacts-other-host"],
)
def test_an_http_artifact_location_is_a_link_and_never_fetched(store, monkeypatch, location, link):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # the old code's fetch fails at once instead of retrying
    listener = Listener()
    try:
        location = location.format(port=listener.port)
        run_id = _run_in(store, location)
        dashboard = _dashboard(store)

        page = _get(dashboard, f"/runs/{run_id}/artifacts")
        one_file = _get(dashboard, f"/runs/{run_id}/artifacts/radt/stdout.log")

        assert listener.connections() == 0, "the dashboard connected to the artifact location"
    finally:
        listener.close()
    uri = f"{location}/{run_id}/artifacts"
    assert page.status_code == 200, page.text
    assert uri in page.text and "does not fetch" in page.text
    assert (f"<a href='{uri}'" in page.text) is link  # http(s) as a link for the browser; other schemes as text
    assert one_file.status_code == 404 and uri in one_file.text


@pytest.mark.parametrize("location", ["s3://team-bucket/hr/payroll", "s3://team-bucket/radt/../hr/payroll", "s3://team-bucket/radtx/y"])
def test_a_bucket_location_is_read_only_below_radt_artifact_uris_folder(store, monkeypatch, location):
    """RADT_ARTIFACT_URI=s3://team-bucket/radt: the dashboard reads that bucket with its own credentials, and any MLflow
    user can give a run the location s3://team-bucket/hr/payroll; the dashboard listed and served what lay there. Only
    keys below the configured folder are read (those are not fetched here: this machine may hold real credentials)."""
    monkeypatch.setenv("RADT_ARTIFACT_URI", "s3://team-bucket/radt")
    run_id = _run_in(store, location)
    page = _get(_dashboard(store), f"/runs/{run_id}/artifacts")
    assert page.status_code == 200 and "does not fetch" in page.text, page.text
    assert reader._own_location("s3://team-bucket/radt/7/abc/artifacts") and reader._own_location("s3://team-bucket/radt")


def _planted_runs(store: str, shared: Path, count: int) -> list[str]:
    """`count` runs of one experiment in the served folder `shared`, each with its own log; their ids."""
    client = tracking.connect(store)
    experiment = client.create_experiment(f"team-{os.urandom(4).hex()}", artifact_location=str(shared / "team"))
    ids = []
    for k in range(count):
        run_id = client.create_run(experiment).info.run_id
        (shared / "team" / run_id / "artifacts" / "radt").mkdir(parents=True)
        (shared / "team" / run_id / "artifacts" / "radt" / "stdout.log").write_text(f"secret of run {k}\n")
        ids.append(run_id)
    return ids


@pytest.mark.parametrize("where", ["root", "experiment"])
def test_a_run_whose_location_holds_other_runs_folders_is_not_listed_as_its_own(store, tmp_path, monkeypatch, where):
    """Issue #52 item 14: a store writer gives a run the served artifact root itself (or an experiment's folder) as its
    location. Old dashboard: that run's listing was every run's files (100,000 files: 14.5 s, 11.7 MB) and each of them
    was served as "its" artifact. Now a location without the run's own id in its path is refused, in one line."""
    shared = tmp_path / "shared"
    monkeypatch.setenv("RADT_ARTIFACT_ROOTS", str(shared))
    others = _planted_runs(store, shared, 3)
    hostile = _run_in(store, "/tmp/ordinary")
    location = shared if where == "root" else shared / "team"
    engine = sa.create_engine(store)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE runs SET artifact_uri = :uri WHERE run_uuid = :run"), {"uri": str(location), "run": hostile})
    engine.dispose()
    dashboard = _dashboard(store)

    listing = _get(dashboard, f"/runs/{hostile}/artifacts")
    assert listing.status_code == 404, listing.text[:300]
    assert "secret of run" not in listing.text and not any(other in listing.text for other in others)
    assert "not its own" in listing.text and f"{hostile}/artifacts" in listing.text
    inside = "" if where == "experiment" else "team/"
    one = _get(dashboard, f"/runs/{hostile}/artifacts/{inside}{others[0]}/artifacts/radt/stdout.log")
    assert one.status_code == 404 and b"secret of run" not in one.data
    own = _get(dashboard, f"/runs/{others[0]}/artifacts")
    assert own.status_code == 200 and "secret of run 0" in own.text and "secret of run 1" not in own.text


def test_a_listing_of_many_files_is_bounded_and_says_so(store, tmp_path, monkeypatch):
    """A run's own folder with 3,000 files (and its log in radt/): the listing shows 1,000 of them, its stdout, and says
    the run holds more; old: every file, a page that grows without end (100,000 files: 11.7 MB)."""
    shared = tmp_path / "shared"
    monkeypatch.setenv("RADT_ARTIFACT_ROOTS", str(shared))
    (run_id,) = _planted_runs(store, shared, 1)
    checkpoints = shared / "team" / run_id / "artifacts" / "checkpoints"
    checkpoints.mkdir()
    for k in range(3000):
        (checkpoints / f"step-{k:05d}.pt").touch()
    listing = _get(_dashboard(store), f"/runs/{run_id}/artifacts")
    assert listing.status_code == 200
    assert listing.text.count("<li>") == 1000, listing.text.count("<li>")
    assert "radt/stdout.log" in listing.text and "secret of run 0" in listing.text, "radt's own folder is read first"
    assert "1,000 files shown: the run holds more" in listing.text


def test_a_hostless_mlflow_artifacts_location_without_a_server_is_a_message_not_a_500(store, monkeypatch):
    """Issue #52 item 18: `mlflow-artifacts:/x` with a database store and no RADT_ARTIFACT_URI naming the server. Old: the
    file answered HTTP 500 with a traceback, the listing 502. Now both say in one line what to set."""
    run_id = _run_in(store, "mlflow-artifacts:/x")
    dashboard = _dashboard(store)
    page = _get(dashboard, f"/runs/{run_id}/artifacts")
    one = _get(dashboard, f"/runs/{run_id}/artifacts/radt/stdout.log")
    for answer in (page, one):
        assert answer.status_code == 404, (answer.status_code, answer.text[:500])
        assert "RADT_ARTIFACT_URI=mlflow-artifacts://HOST:5000" in answer.text and "Traceback" not in answer.text
    assert one.text.count("\n") == 0, "one line"
