"""A run's artifacts (its logs, nsys/ncu reports) as the dashboard reads them, from wherever the run keeps them.

A local or shared folder is read in place, and only inside the run's artifact root: every path is resolved
(symlinks too) and one that leaves the root is "no such artifact". Another location is read only when it is
the dashboard's own: its tracking server's proxied artifacts (mlflow-artifacts:, or that server's
http(s)://.../api/2.0/mlflow-artifacts/artifacts) or the bucket RADT_ARTIFACT_URI names; it goes through
MLflow's artifact repository, imported on the first such read, and a file is downloaded once into
RADT_HOME/cache/artifacts (radt uploads a run's files when the run ends and does not change them). Any other
location (an `http://` URL an MLflow user gave their experiment) is never fetched by the dashboard: the page
shows it as a link for the browser.
Served at /runs/<run id>/artifacts (a listing with the logs shown) and /runs/<run id>/artifacts/<path>.
"""

from __future__ import annotations

import os
import posixpath
import re
import shutil
import stat
import tempfile
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import flask
import sqlalchemy as sa
from markupsafe import escape

from radt import artifacts
from radt.app.state import STATE
from radt.app.store import RUNS
from radt.settings import ARTIFACT_ROOTS, ARTIFACT_URI, dashboard_path, display_uri, radt_home

ROUTE = "/runs/<run_id>/artifacts"
TEXT_SUFFIXES = (".log", ".txt", ".json", ".csv", ".out", ".err")  # shown in the browser; anything else (.nsys-rep, .ncu-rep) is a download
SHOWN_LOGS = ("stdout.log", "stderr.log")  # shown on the listing itself, their last SHOWN_BYTES
SHOWN_BYTES = 64 * 1024
_RUN_ID = re.compile(r"^[0-9a-f]{32}\Z")


class ArtifactMissing(LookupError):
    """No such run, or no such file in its artifacts; the message is one line for the page."""


class ArtifactElsewhere(ArtifactMissing):
    """The run keeps its artifacts at a location the dashboard does not fetch; the page links to it instead."""

    def __init__(self, run_id: str, uri: str):
        self.uri = display_uri(uri)
        super().__init__(
            f"run {run_id} keeps its artifacts at {self.uri}, which this dashboard does not fetch "
            "(it reads folders, its tracking server's artifacts and RADT_ARTIFACT_URI); open it yourself"
        )


@dataclass(frozen=True)
class Entry:
    path: str  # relative to the run's artifact root, '/'-separated
    size: int | None


def artifact_uri(run_id: str) -> str:
    """The run's artifact URI, as its store has it."""
    if STATE.engine is None or not _RUN_ID.match(run_id or ""):
        raise ArtifactMissing(f"no run {run_id!r} in the store")
    with STATE.engine.connect() as conn:
        uri = conn.execute(sa.select(RUNS.c.artifact_uri).where(RUNS.c.run_uuid == run_id)).scalar()
    if not uri:
        raise ArtifactMissing(f"no run {run_id} in the store, or it has no artifact location")
    return uri


def list_files(run_id: str, path: str = "") -> list[Entry]:
    """Every file of the run's artifacts under `path`, sorted; empty when there are none (yet)."""
    uri = artifact_uri(run_id)
    path = _relative(path)
    root = artifacts.local_dir(uri)
    if root is not None:
        return _local_files(_local_root(run_id, root), path)
    repo = _repository(run_id, uri)
    found: list[Entry] = []
    pending = [path or None]
    while pending:
        for info in repo.list_artifacts(pending.pop()):
            if info.is_dir:
                pending.append(info.path)
            else:
                found.append(Entry(info.path, info.file_size))
    return sorted(found, key=lambda entry: entry.path)


def _local_files(root: Path, path: str) -> list[Entry]:
    """The regular files under root/path whose real path stays inside root (a symlink out of it is not listed)."""
    base = _inside(root, root / path)
    if base is None:
        return []
    found = []
    for dirpath, _dirs, names in os.walk(base):  # symlinked folders are not walked into
        for name in names:
            full = Path(dirpath) / name
            real = _inside(root, full)
            if real is None or name.startswith(".artifact.uploading."):  # outside, or a copy under way (collectors/sqltracking.py)
                continue
            try:
                info = real.stat()
            except OSError:  # gone meanwhile
                continue
            if stat.S_ISREG(info.st_mode):
                found.append(Entry(full.relative_to(root).as_posix(), info.st_size))
    return sorted(found, key=lambda entry: entry.path)


def open_artifact(run_id: str, path: str) -> BinaryIO:
    """One artifact file, open for reading: from the run's folder (never outside it), else downloaded once into the cache."""
    uri = artifact_uri(run_id)
    path = _relative(path)
    if not path:
        raise ArtifactMissing("give a file of the run's artifacts")
    root = artifacts.local_dir(uri)
    if root is not None:
        return _open_inside(_local_root(run_id, root), path, run_id)
    cached = radt_home() / "cache" / "artifacts" / run_id / path
    if not cached.is_file():
        repo = _repository(run_id, uri)
        cached.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cached.parent) as tmp:
            try:
                downloaded = repo.download_artifacts(path, dst_path=tmp)
            except Exception as exc:  # not there, or the artifact store is away: one line for the page
                raise ArtifactMissing(f"cannot read {path} of run {run_id} from {display_uri(uri)}: {_first_line(exc)}") from exc
            if not os.path.isfile(downloaded):
                raise ArtifactMissing(f"{path} of run {run_id} is a folder")
            shutil.move(downloaded, cached)  # whole or not at all: another reader never sees half a file
    return open(cached, "rb")


def read_text(run_id: str, path: str, limit: int | None = None) -> str:
    """An artifact's text (its last `limit` bytes when given), undecodable bytes replaced."""
    with open_artifact(run_id, path) as handle:
        if limit is not None:
            handle.seek(max(0, os.fstat(handle.fileno()).st_size - limit))
        return handle.read().decode("utf-8", errors="replace")


def _local_root(run_id: str, folder: str) -> Path:
    """The run's artifact folder, resolved. It must resolve inside a configured root (RADT_HOME/artifacts,
    RADT_ARTIFACT_URI's folder, RADT_ARTIFACT_ROOTS): any MLflow user can give an experiment the location
    file:///etc, and a run folder under a root can be replaced by a symlink to /etc."""
    lexical = Path(os.path.abspath(folder))
    real = Path(os.path.realpath(lexical))
    anchors = _configured_folders()
    for anchor in anchors:
        if lexical.is_relative_to(anchor) and _inside(Path(os.path.realpath(anchor)), real) is None:
            raise ArtifactMissing(f"the artifact folder of run {run_id} leaves {anchor}")
    if not any(_inside(Path(os.path.realpath(anchor)), real) for anchor in anchors):
        raise ArtifactMissing(
            f"run {run_id} keeps its artifacts in {lexical}, outside the folders this dashboard serves "
            f"({', '.join(str(a) for a in anchors)}); to serve them, add that folder to {ARTIFACT_ROOTS.name} where the dashboard runs"
        )
    return real


def _configured_folders() -> list[Path]:
    """The local folders whose runs' artifacts are served: radt's own, RADT_ARTIFACT_URI's, RADT_ARTIFACT_ROOTS."""
    folders = [radt_home() / "artifacts"]
    configured = artifacts.local_dir(ARTIFACT_URI.get()) if ARTIFACT_URI.get() else None
    if configured:
        folders.append(Path(configured))
    folders += [Path(os.path.expanduser(part)) for part in ARTIFACT_ROOTS.get().split(os.pathsep) if part.strip()]
    return [Path(os.path.abspath(folder)) for folder in folders]


def _inside(root: Path, path: Path) -> Path | None:
    """path's real path (every symlink followed) when it is root or inside it, else None."""
    real = Path(os.path.realpath(path))
    return real if real.is_relative_to(root) else None


def _open_inside(root: Path, path: str, run_id: str) -> BinaryIO:
    """root/path opened, when it is a regular file whose real path stays inside root.

    The check is made on what was opened (/proc/self/fd), so a symlink swapped in after the check is caught too;
    O_NONBLOCK: a FIFO planted there is refused, not waited on."""
    missing = ArtifactMissing(f"run {run_id} has no artifact {path}")
    real = _inside(root, root / path)
    if real is None:
        raise missing
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        raise missing from None
    try:
        opened = os.readlink(f"/proc/self/fd/{fd}") if os.path.isdir("/proc/self/fd") else str(real)
        if not Path(opened).is_relative_to(root) or not stat.S_ISREG(os.fstat(fd).st_mode):
            raise missing
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _repository(run_id: str, uri: str):
    """MLflow's repository for a location the dashboard may fetch (ArtifactElsewhere for any other); a host-less
    mlflow-artifacts: location resolves against the tracking server, else RADT_ARTIFACT_URI's server."""
    if not _own_location(uri):
        raise ArtifactElsewhere(run_id, uri)
    return artifacts.repository(uri, STATE.store_uri, artifacts.server_of(ARTIFACT_URI.get()))


def _own_location(uri: str) -> bool:
    """Whether a non-folder location is the dashboard's own: its tracking server's (or RADT_ARTIFACT_URI's server's)
    proxied artifacts, or the bucket folder RADT_ARTIFACT_URI names (and what is below it). Any other is an address an
    MLflow user chose."""
    parsed = urllib.parse.urlparse(uri)
    scheme = parsed.scheme.lower()
    configured = ARTIFACT_URI.get() or ""
    tracking = STATE.store_uri if urllib.parse.urlparse(STATE.store_uri or "").scheme.lower() in ("http", "https") else None
    servers = {_server_key(server) for server in (tracking, artifacts.server_of(configured)) if server}
    if scheme == artifacts.PROXY_SCHEME:
        return not parsed.netloc or parsed.netloc.lower() in {netloc for _scheme, netloc, _prefix in servers}
    if scheme in ("http", "https"):
        server = artifacts.server_of(uri)
        return server is not None and _server_key(server) in servers
    own = urllib.parse.urlparse(configured)
    same_bucket = bool(scheme) and artifacts.local_dir(configured) is None and scheme == own.scheme.lower() and parsed.netloc == own.netloc
    return same_bucket and _under(parsed.path, own.path)


def _under(path: str, prefix: str) -> bool:
    """Whether a bucket key lies under RADT_ARTIFACT_URI's prefix: the dashboard reads the bucket with its own credentials,
    and any MLflow user can point a run at s3://<the bucket>/<another team's folder>. A key with '..' in it is not."""
    parts, root = [p for p in path.split("/") if p], [p for p in prefix.split("/") if p]
    return ".." not in parts and parts[: len(root)] == root


def _server_key(server: str) -> tuple[str, str, str]:
    parsed = urllib.parse.urlparse(server)
    return parsed.scheme.lower(), parsed.netloc.lower(), parsed.path.rstrip("/")


def _relative(path: str) -> str:
    path = (path or "").strip("/")
    if not path:
        return ""
    norm = posixpath.normpath(path)
    if norm == ".." or norm.startswith("../") or norm.startswith("/") or "\x00" in norm:
        raise ArtifactMissing(f"{path!r} is not a path inside the run's artifacts")
    return norm


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]


# --- the routes ---------------------------------------------------------------------------------


def listing(run_id: str):
    """The run's artifact files as links, with its stdout and stderr (their last 64 kB) shown."""
    try:
        files = list_files(run_id)
    except ArtifactElsewhere as exc:
        return _page(f"artifacts of run {run_id}", _elsewhere(exc))
    except ArtifactMissing as exc:
        return _page("artifacts", f"<p class='error'>{escape(str(exc))}</p>"), 404
    except Exception as exc:  # the artifact store is away
        return _page("artifacts", f"<p class='error'>cannot list the artifacts of run {escape(run_id)}: {escape(_first_line(exc))}</p>"), 502
    rows = "".join(
        f"<li><a href='{escape(flask.url_for('radt_artifact', run_id=run_id, path=entry.path))}'>{escape(entry.path)}</a> {_size(entry.size)}</li>"
        for entry in files
    )
    body = f"<ul>{rows}</ul>" if rows else "<p>no artifacts yet: radt attaches the logs when the run ends</p>"
    for entry in files:
        if posixpath.basename(entry.path) in SHOWN_LOGS:
            try:
                text = read_text(run_id, entry.path, SHOWN_BYTES)
            except ArtifactMissing as exc:
                text = str(exc)
            body += f"<h2>{escape(entry.path)}</h2><pre>{escape(text)}</pre>"
    return _page(f"artifacts of run {run_id}", body)


def artifact(run_id: str, path: str):
    """One file: a log in the browser, a report (.nsys-rep, .ncu-rep) as a download."""
    try:
        handle = open_artifact(run_id, path)
    except ArtifactMissing as exc:
        return flask.Response(str(exc), status=404, mimetype="text/plain")
    if path.endswith(TEXT_SUFFIXES):
        return flask.send_file(handle, mimetype="text/plain", max_age=0)
    return flask.send_file(handle, as_attachment=True, download_name=posixpath.basename(path), max_age=0)


def _elsewhere(exc: ArtifactElsewhere) -> str:
    """The location as a link for the browser to follow (http and https only), else as text."""
    shown = escape(exc.uri)
    if urllib.parse.urlparse(exc.uri).scheme.lower() in ("http", "https"):
        shown = f"<a href='{shown}' rel='noreferrer'>{shown}</a>"
    return f"<p>This run keeps its artifacts at {shown}; the dashboard does not fetch them (it reads folders, its tracking server's artifacts and RADT_ARTIFACT_URI). Open the link yourself.</p>"


def _page(title: str, body: str) -> str:
    icon = escape(dashboard_path("/_favicon.ico"))  # Dash's, under the dashboard's path: a browser's default /favicon.ico leaves it
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>radt · {escape(title)}</title><link rel='icon' href='{icon}'></head>"
        f"<body><h1>{escape(title)}</h1>{body}</body></html>"
    )


def _size(size: int | None) -> str:
    return "" if size is None else f"({size:,} bytes)"


def install(server: flask.Flask, prefix: str = "/") -> None:
    """The artifact routes on the dashboard's Flask server, under the path it is served at (RADT_URL_PREFIX)."""
    route = prefix.rstrip("/") + ROUTE
    server.add_url_rule(route, "radt_artifacts", listing)
    server.add_url_rule(f"{route}/<path:path>", "radt_artifact", artifact)
