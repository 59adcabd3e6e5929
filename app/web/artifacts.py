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
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import flask
import sqlalchemy as sa
from markupsafe import escape

from radt import artifacts
from radt.app.db import deadline
from radt.app.db.state import STATE
from radt.app.db.store import RUNS
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


@dataclass(frozen=True)
class Listing:
    """The files a listing found (sorted), and whether that is all of them: a listing stops at LISTED_FILES files, at
    READ_ENTRIES entries read, or at the request's deadline, so no run's folder holds a worker (100,000 files: 14.5 s)."""

    entries: list[Entry]
    complete: bool


LISTED_FILES = 1000  # files one listing shows; a run with more is said to have more
READ_ENTRIES = 10_000  # directory entries (files, folders, links) one listing reads at most
LISTED_FOLDERS = 100  # folders of a remote location one listing asks for (one request each)


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
    """The files of the run's artifacts under `path`, sorted (at most LISTED_FILES: `listing_of` says whether all)."""
    return listing_of(run_id, path).entries


def listing_of(run_id: str, path: str = "") -> Listing:
    """The run's artifact files under `path`, bounded (Listing); empty when there are none (yet)."""
    uri = artifact_uri(run_id)
    path = _relative(path)
    root = artifacts.local_dir(uri)
    if root is not None:
        return _local_files(_local_root(run_id, root), path)
    return _remote_files(_repository(run_id, uri), path)


def _remote_files(repo, path: str) -> Listing:
    """A remote location's files, folder by folder (a request each), breadth first, within the listing's bounds."""
    found: list[Entry] = []
    pending, asked = deque([path or None]), 0
    while pending:
        if asked >= LISTED_FOLDERS or len(found) >= LISTED_FILES or _past_deadline():
            return Listing(sorted(found, key=lambda entry: entry.path)[:LISTED_FILES], False)
        asked += 1
        for info in repo.list_artifacts(pending.popleft()):
            if info.is_dir:
                pending.append(info.path)
            else:
                found.append(Entry(info.path, info.file_size))
    return Listing(sorted(found, key=lambda entry: entry.path)[:LISTED_FILES], len(found) <= LISTED_FILES)


def _local_files(root: Path, path: str) -> Listing:
    """The regular files under root/path whose real path stays inside root (a symlink out of it is not listed), breadth
    first (radt's own logs, radt/, before other folders) until LISTED_FILES files, READ_ENTRIES entries or the deadline."""
    base = _inside(root, root / path)
    if base is None:
        return Listing([], True)
    found: list[Entry] = []
    pending, read = deque([base]), 0
    while pending:
        folder, folders = pending.popleft(), []
        try:
            with os.scandir(folder) as entries:
                for item in entries:
                    read += 1
                    if read > READ_ENTRIES or len(found) >= LISTED_FILES or (read % 256 == 0 and _past_deadline()):
                        return Listing(sorted(found, key=lambda entry: entry.path), False)
                    if item.is_dir(follow_symlinks=False):  # symlinked folders are not walked into
                        folders.append(Path(item.path))
                    elif (entry := _local_entry(root, Path(item.path))) is not None:
                        found.append(entry)
        except OSError:  # gone meanwhile, or unreadable
            continue
        pending.extend(sorted(folders, key=lambda f: (f.name != "radt", f.name)))
    return Listing(sorted(found, key=lambda entry: entry.path), True)


def _local_entry(root: Path, full: Path) -> Entry | None:
    """A regular file's entry, when its real path stays inside root and it is no copy under way (collectors/store/sqltracking.py)."""
    real = _inside(root, full)
    if real is None or full.name.startswith(".artifact.uploading."):
        return None
    try:
        info = real.stat()
    except OSError:  # gone meanwhile
        return None
    return Entry(full.relative_to(root).as_posix(), info.st_size) if stat.S_ISREG(info.st_mode) else None


def _past_deadline() -> bool:
    left = deadline.remaining()
    return left is not None and left <= 0


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
    served = [Path(os.path.realpath(anchor)) for anchor in anchors if _inside(Path(os.path.realpath(anchor)), real)]
    if not served:
        raise ArtifactMissing(
            f"run {run_id} keeps its artifacts in {lexical}, outside the folders this dashboard serves "
            f"({', '.join(str(a) for a in anchors)}); to serve them, add that folder to {ARTIFACT_ROOTS.name} where the dashboard runs"
        )
    if not any(run_id in real.relative_to(anchor).parts for anchor in served):
        raise _not_its_own(run_id, str(lexical))
    return real


def _not_its_own(run_id: str, where: str) -> ArtifactMissing:
    """A location without the run's id in its path (a served root, an experiment's folder): it holds other runs' folders,
    and any store writer can give a run such a location; MLflow and radt give each run <location>/<run id>/artifacts."""
    return ArtifactMissing(
        f"run {run_id} names {display_uri(where)} as its artifact location, a folder that is not its own (a run's is "
        f".../{run_id}/artifacts) and may hold other runs' artifacts: it is not listed or served"
    )


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
    if run_id not in urllib.parse.urlparse(uri).path.split("/"):
        raise _not_its_own(run_id, uri)
    try:
        return artifacts.repository(uri, STATE.store_uri, artifacts.server_of(ARTIFACT_URI.get()))
    except artifacts.ArtifactUriError as exc:  # a host-less mlflow-artifacts: location, and no server to read it from
        raise ArtifactMissing(f"cannot read the artifacts of run {run_id}: {exc}") from exc


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
        listed = listing_of(run_id)
    except ArtifactElsewhere as exc:
        return _page(f"artifacts of run {run_id}", _elsewhere(exc))
    except ArtifactMissing as exc:
        return _page("artifacts", f"<p class='error'>{escape(str(exc))}</p>"), 404
    except Exception as exc:  # the artifact store is away
        return _page("artifacts", f"<p class='error'>cannot list the artifacts of run {escape(run_id)}: {escape(_first_line(exc))}</p>"), 502
    files = listed.entries
    rows = "".join(
        f"<li><a href='{escape(flask.url_for('radt_artifact', run_id=run_id, path=entry.path))}'>{escape(entry.path)}</a> {_size(entry.size)}</li>"
        for entry in files
    )
    body = f"<ul>{rows}</ul>" if rows else "<p>no artifacts yet: radt attaches the logs when the run ends</p>"
    if not listed.complete:
        body = f"<p class='note'>{len(files):,} files shown: the run holds more than a listing reads (at most {LISTED_FILES:,} files, {READ_ENTRIES:,} entries); open its folder for the rest</p>{body}"
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
    except Exception as exc:  # the artifact store is away, or MLflow cannot read the location: one line, never a traceback
        return flask.Response(f"cannot read {path} of run {run_id}: {_first_line(exc)}", status=502, mimetype="text/plain")
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
