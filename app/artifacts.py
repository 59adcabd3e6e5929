"""A run's artifacts (its logs, nsys/ncu reports) as the dashboard reads them, from wherever the run keeps them.

A local or shared folder is read in place. Any other location (an `mlflow server`'s proxied artifacts, a
bucket) goes through MLflow's artifact repository, imported on the first such read, and a file is downloaded
once into RADT_HOME/cache/artifacts: radt uploads a run's files when the run ends and does not change them.
Served at /runs/<run id>/artifacts (a listing with the logs shown) and /runs/<run id>/artifacts/<path>.
"""

from __future__ import annotations

import os
import posixpath
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import flask
import sqlalchemy as sa
from markupsafe import escape

from radt import artifacts
from radt.app.state import STATE
from radt.app.store import RUNS
from radt.settings import ARTIFACT_URI, display_uri, radt_home

ROUTE = "/runs/<run_id>/artifacts"
TEXT_SUFFIXES = (".log", ".txt", ".json", ".csv", ".out", ".err")  # shown in the browser; anything else (.nsys-rep, .ncu-rep) is a download
SHOWN_LOGS = ("stdout.log", "stderr.log")  # shown on the listing itself, their last SHOWN_BYTES
SHOWN_BYTES = 64 * 1024
_RUN_ID = re.compile(r"^[0-9a-f]{32}$")


class ArtifactMissing(LookupError):
    """No such run, or no such file in its artifacts; the message is one line for the page."""


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
        return _local_files(Path(root), path)
    repo = _repository(uri)
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
    base = root / path if path else root
    found = []
    for dirpath, _dirs, names in os.walk(base):
        for name in names:
            full = Path(dirpath) / name
            if not name.startswith(".artifact.uploading."):  # a copy under way (collectors/sqltracking.py)
                found.append(Entry(full.relative_to(root).as_posix(), full.stat().st_size))
    return sorted(found, key=lambda entry: entry.path)


def fetch(run_id: str, path: str) -> Path:
    """A readable local copy of one artifact file: the file itself in a folder, else downloaded once into the cache."""
    uri = artifact_uri(run_id)
    path = _relative(path)
    if not path:
        raise ArtifactMissing("give a file of the run's artifacts")
    root = artifacts.local_dir(uri)
    if root is not None:
        found = Path(root) / path
        if not found.is_file():
            raise ArtifactMissing(f"run {run_id} has no artifact {path}")
        return found
    cached = radt_home() / "cache" / "artifacts" / run_id / path
    if cached.is_file():
        return cached
    cached.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cached.parent) as tmp:
        try:
            downloaded = _repository(uri).download_artifacts(path, dst_path=tmp)
        except Exception as exc:  # not there, or the artifact store is away: one line for the page
            raise ArtifactMissing(f"cannot read {path} of run {run_id} from {display_uri(uri)}: {_first_line(exc)}") from exc
        if not os.path.isfile(downloaded):
            raise ArtifactMissing(f"{path} of run {run_id} is a folder")
        shutil.move(downloaded, cached)  # whole or not at all: another reader never sees half a file
    return cached


def read_text(run_id: str, path: str, limit: int | None = None) -> str:
    """An artifact's text (its last `limit` bytes when given), undecodable bytes replaced."""
    with open(fetch(run_id, path), "rb") as handle:
        if limit is not None:
            handle.seek(max(0, os.fstat(handle.fileno()).st_size - limit))
        return handle.read().decode("utf-8", errors="replace")


def _repository(uri: str):
    """MLflow's repository for the dashboard's store; a host-less mlflow-artifacts: location uses RADT_ARTIFACT_URI's server."""
    return artifacts.repository(uri, STATE.store_uri, artifacts.server_of(ARTIFACT_URI.get()))


def _relative(path: str) -> str:
    path = (path or "").strip("/")
    if not path:
        return ""
    norm = posixpath.normpath(path)
    if norm.startswith("..") or norm.startswith("/") or "\x00" in norm:
        raise ArtifactMissing(f"{path!r} is not a path inside the run's artifacts")
    return norm


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]


# --- the routes ---------------------------------------------------------------------------------


def listing(run_id: str):
    """The run's artifact files as links, with its stdout and stderr (their last 64 kB) shown."""
    try:
        files = list_files(run_id)
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
        local = fetch(run_id, path)
    except ArtifactMissing as exc:
        return flask.Response(str(exc), status=404, mimetype="text/plain")
    if path.endswith(TEXT_SUFFIXES):
        return flask.send_file(local, mimetype="text/plain", max_age=0)
    return flask.send_file(local, as_attachment=True, download_name=posixpath.basename(path), max_age=0)


def _page(title: str, body: str) -> str:
    return f"<!doctype html><html><head><meta charset='utf-8'><title>radt · {escape(title)}</title></head><body><h1>{escape(title)}</h1>{body}</body></html>"


def _size(size: int | None) -> str:
    return "" if size is None else f"({size:,} bytes)"


def install(server: flask.Flask) -> None:
    """The artifact routes on the dashboard's Flask server."""
    server.add_url_rule(ROUTE, "radt_artifacts", listing)
    server.add_url_rule(f"{ROUTE}/<path:path>", "radt_artifact", artifact)
