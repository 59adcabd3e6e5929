"""Where runs' artifacts go when several hosts share a store, and the repository that reads or writes one.

An artifact URI (`--artifacts`, RADT_ARTIFACT_URI) is a folder every host mounts (a path or `file:`), an
`mlflow server`'s proxied artifacts (`mlflow-artifacts://host:5000/path`, or that server's
`http://host:5000/api/2.0/mlflow-artifacts/artifacts/path`), or any URI MLflow's artifact repositories take
(s3://, gs://, ...). Both sides use this module: the runner writes the logs, the dashboard reads them back.
MLflow is imported only for a URI that is not a local folder (its import costs seconds).
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import re
import urllib.parse
from pathlib import Path

from radt.errors import UserError

PROXY_PATH = "/api/2.0/mlflow-artifacts/artifacts"  # an `mlflow server --serve-artifacts`'s artifact service
PROXY_SCHEME = "mlflow-artifacts"
# the schemes of MLflow 3.17's artifact repositories that can hold an experiment's artifacts
# (mlflow/store/artifact/artifact_repository_registry.py; `runs:` and `models:` point into other runs)
MLFLOW_SCHEMES = ("file", "s3", "gs", "wasbs", "abfss", "ftp", "sftp", "dbfs", "hdfs", "viewfs", "r2", "b2", "http", "https", PROXY_SCHEME)
RUN_SUFFIX_LENGTH = len("/0123456789abcdef0123456789abcdef/artifacts")  # what a run adds to its experiment's location
URI_COLUMN_LENGTH = 200  # MLflow's runs.artifact_uri column


class ArtifactUriError(UserError, ValueError):
    """An artifact URI radt cannot write to; the message names it and the fix."""


def check_uri(text: str, source: str = "--artifacts", store: str | None = None) -> str:
    """The artifact root a user gave, normalised (a folder becomes its file: URI); ArtifactUriError names the fix.

    `store` is the tracking store: a host-less `mlflow-artifacts:/path` needs it to be the `mlflow server`."""
    value = text.strip().rstrip("/") if text.strip() not in ("", "/") else text.strip()
    if not value:
        return ""
    shown = f"{source} {value}"
    if "\x00" in value:
        raise ArtifactUriError(f"{shown!r} contains a NUL byte; give a shared folder, mlflow-artifacts://host:5000/path or s3://bucket/path")
    parsed = urllib.parse.urlparse(value)
    scheme = parsed.scheme.lower()
    if not scheme or scheme == "file" or len(scheme) == 1:  # a path (C: is a drive, not a scheme)
        uri = _folder_uri(value, shown)
    elif scheme == PROXY_SCHEME:
        uri = _check_proxied(value, parsed, shown, store)
    elif scheme in ("http", "https"):
        if PROXY_PATH not in parsed.path:
            raise ArtifactUriError(
                f"{shown} is not an mlflow server's artifact service; give {parsed.scheme}://{parsed.netloc}{PROXY_PATH}/<path> "
                f"or mlflow-artifacts://{parsed.netloc}/<path> (the server started with --serve-artifacts)"
            )
        uri = value
    elif scheme in MLFLOW_SCHEMES or scheme in _plugin_schemes():
        uri = value
    else:
        raise ArtifactUriError(
            f"{shown}: MLflow has no artifact repository for '{parsed.scheme}:'; give a shared folder, "
            "mlflow-artifacts://host:5000/path or a store MLflow's artifact repositories take (s3://bucket/path, gs://..., wasbs://...)"
        )
    if len(uri) > URI_COLUMN_LENGTH - RUN_SUFFIX_LENGTH - 20:
        raise ArtifactUriError(f"{shown} is {len(uri)} characters; MLflow keeps a run's artifact URI in {URI_COLUMN_LENGTH}: give a shorter one")
    return uri


def _folder_uri(value: str, shown: str) -> str:
    """A shared folder's file: URI; it must exist (a node without the mount would otherwise write to its own disk)."""
    path = local_dir(value) if value.lower().startswith("file:") else value
    folder = Path(os.path.abspath(os.path.expanduser(path or "")))
    if not folder.is_dir():
        raise ArtifactUriError(f"{shown}: the folder {folder} does not exist here; mount the shared filesystem or create it (mkdir -p {folder})")
    return folder.as_uri()


def _check_proxied(value: str, parsed: urllib.parse.ParseResult, shown: str, store: str | None) -> str:
    if parsed.netloc and not parsed.hostname:
        raise ArtifactUriError(f"{shown} names a port but no host; give mlflow-artifacts://HOST:PORT/path")
    if _is_server(store):
        return value  # MLflow resolves it against the tracking server, as its own clients do
    if not parsed.netloc:
        raise ArtifactUriError(
            f"{shown} names no server, and the tracking store is a database; give the mlflow server that serves the artifacts: "
            f"mlflow-artifacts://HOST:5000{parsed.path or '/'}"
        )
    # with a database store, MLflow's clients (a script's own mlflow.log_artifact too) resolve mlflow-artifacts: only
    # against an http tracking URI; the server's artifact service spelled out works for every one of them
    return f"http://{parsed.netloc}{PROXY_PATH}{parsed.path}".rstrip("/")


def _is_server(store: str | None) -> bool:
    return bool(store) and store.split(":", 1)[0].lower() in ("http", "https")


def _plugin_schemes() -> set[str]:
    """Schemes of installed MLflow artifact plugins (entry points, read without importing MLflow)."""
    from importlib.metadata import entry_points

    return {entry.name for entry in entry_points(group="mlflow.artifact_repository")}


def configure(explicit: str | None, store: str) -> str:
    """This command's artifact root (--artifacts, else RADT_ARTIFACT_URI), checked, and set in the environment
    so that the radt processes it starts (a CSV experiment's runs, Slurm jobs) use the same one; "" for none."""
    from radt.settings import ARTIFACT_URI

    source, text = ("--artifacts", explicit) if explicit is not None else (ARTIFACT_URI.name, ARTIFACT_URI.get())
    uri = check_uri(text, source, store)
    if uri:
        os.environ[ARTIFACT_URI.name] = uri
    else:  # `--artifacts ''`: the defaults, also for the processes it starts
        os.environ.pop(ARTIFACT_URI.name, None)
    return uri


def local_dir(uri: str) -> str | None:
    """The folder of a `file:` (or scheme-less) artifact URI; None for any other (s3:, mlflow-artifacts:, ...)."""
    parsed = urllib.parse.urlparse(uri)
    if parsed.scheme == "file":
        return urllib.parse.unquote(parsed.path)
    if not parsed.scheme or len(parsed.scheme) == 1:
        return urllib.parse.unquote(uri)
    return None


def server_of(uri: str) -> str | None:
    """The `mlflow server` (http://host:port) an artifact URI names, if it names one."""
    parsed = urllib.parse.urlparse(uri or "")
    if parsed.scheme == PROXY_SCHEME and parsed.hostname:
        return f"http://{parsed.netloc}"
    if parsed.scheme in ("http", "https") and PROXY_PATH in parsed.path:
        return f"{parsed.scheme}://{parsed.netloc}{parsed.path.split(PROXY_PATH, 1)[0]}"
    return None


def experiment_location(root: str, name: str) -> str:
    """Where a new experiment's artifacts go under `root`: ROOT/<name as a file name>, short enough for MLflow's columns."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", name)
    room = max(16, min(120, URI_COLUMN_LENGTH - RUN_SUFFIX_LENGTH - len(root) - 1))
    if len(safe) > room:  # a long experiment name keeps its start and a digest
        safe = f"{safe[: room - 13]}-{hashlib.sha1(name.encode()).hexdigest()[:12]}"
    parsed = urllib.parse.urlparse(root)
    if not parsed.scheme or len(parsed.scheme) == 1:
        return posixpath.join(root, safe)
    return urllib.parse.urlunparse(parsed._replace(path=posixpath.join(parsed.path or "/", safe)))


def repository(uri: str, tracking_uri: str | None, server: str | None = None):
    """MLflow's artifact repository for a non-local URI (MLflow imported here, only here).

    A host-less `mlflow-artifacts:/path` resolves against the tracking URI when it is the server, else against
    `server` (http://host:port, e.g. server_of(RADT_ARTIFACT_URI)); ArtifactUriError when neither names one."""
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    parsed = urllib.parse.urlparse(uri)
    if parsed.scheme == PROXY_SCHEME and not _is_server(tracking_uri):
        server = f"http://{parsed.netloc}" if parsed.hostname else server
        if not server:
            raise ArtifactUriError(
                f"the artifacts at {uri} are an mlflow server's, and the store is a database; name the server: "
                f"RADT_ARTIFACT_URI=mlflow-artifacts://HOST:5000{parsed.path}"
            )
        return get_artifact_repository(uri, tracking_uri=server)
    return get_artifact_repository(uri, tracking_uri=tracking_uri)
