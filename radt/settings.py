"""Every setting radt reads, in one place: the store URI and RADT_HOME folders, and radt's own
timeouts and bounds, each with its environment variable, type and default.

Where radt keeps things: the tracking store URI and the local run directories.

`MLFLOW_TRACKING_URI` wins; without it radt uses an embedded SQLite file under `RADT_HOME`
(default `~/.radt`), so `radt train.py` and `python app.py` find the same store from any folder.

radt's own timeouts and bounds: one place, typed, each with its environment variable and default.

In the style of MLflow's `mlflow/environment_variables.py`: `STORE_TIMEOUT.get()` reads
`RADT_STORE_TIMEOUT` when it is set and the default otherwise; a value that does not parse is a
ValueError naming the variable.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Generic, TypeVar

DATABASE_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")  # SQLAlchemy's names, each with an optional +driver
SERVER_SCHEMES = ("http", "https")  # an `mlflow server`


class StoreUriError(ValueError):
    """A tracking store radt cannot use; the message names it (password masked) and the fix."""


def radt_home() -> Path:
    home = Path(os.environ.get("RADT_HOME") or Path.home() / ".radt").expanduser()
    home.mkdir(parents=True, exist_ok=True)
    return home


def default_store_uri() -> str:
    return f"sqlite:///{radt_home() / 'mlflow.db'}"


def tracking_uri(explicit: str | None = None) -> str:
    """The store to use: an explicit --store, else MLFLOW_TRACKING_URI, else the embedded default; checked by store_uri()."""
    if explicit:
        return store_uri(explicit, "--store")
    environ = os.environ.get("MLFLOW_TRACKING_URI")
    if environ:
        return store_uri(environ, "MLFLOW_TRACKING_URI")
    return default_store_uri()


def store_uri(text: str, source: str = "--store") -> str:
    """The one reading of a user's store, for every radt command and the dashboard: the URI MLflow, the writer and the reader get.

    `postgres://` (as SQLAlchemy users write it) becomes `postgresql://`; a plain path is a SQLite
    file (`sqlite:///<absolute path>`), whose folder must exist. MLflow's file store (`file:`, a
    folder such as ./mlruns) and unknown schemes are refused: StoreUriError names the fix.
    """
    value = text.strip()
    shown = f"{source} {display_uri(value)}"
    if "\x00" in value:
        raise StoreUriError(f"{shown!r} contains a NUL byte; give a database URI such as sqlite:///path/mlflow.db")
    scheme, separator, _rest = value.partition("://")
    if not separator:
        if re.match(r"^[A-Za-z][A-Za-z0-9+.-]+:", value):  # `file:mlruns`, `sqlite:x.db`: a scheme without //
            scheme = value.split(":", 1)[0]
        else:
            path = Path(os.path.abspath(os.path.expanduser(value)))
            if path.is_dir():
                raise StoreUriError(f"{shown} is a folder (MLflow's file store?); radt needs a database: give a SQLite file such as {path / 'mlflow.db'}")
            _check_sqlite_file(path, shown)
            return f"sqlite:///{path}"
    base = scheme.lower().split("+", 1)[0]
    if base != "file" and not separator:
        raise StoreUriError(f"{shown}: a URI needs '{scheme}://'; give e.g. sqlite:///path/mlflow.db, postgresql://user@host/db or the path of a SQLite file")
    if base == "file":
        raise StoreUriError(
            f"{shown}: MLflow's file store is not supported by radt; use a SQLite file (--store sqlite:///path/mlflow.db or a path ending in .db) "
            "or a database, and `mlflow migrate-filestore` to move runs you have there"
        )
    if base == "postgres":
        return "postgresql" + value[len(scheme.split("+", 1)[0]) :]
    if base == "sqlite":
        database = value[len(scheme) + len("://") :].split("?", 1)[0]
        if database.startswith("/") and database not in ("/", "/:memory:") and not database.startswith("/file:"):
            _check_sqlite_file(Path(os.path.expanduser(database[1:])), shown)
        return value
    if base in DATABASE_SCHEMES or base in SERVER_SCHEMES:
        return value
    raise StoreUriError(
        f"{shown}: radt cannot use a '{scheme}' store; give a database URI (sqlite:///path/mlflow.db, postgresql://user@host/db, mysql://...), "
        "an MLflow server (http://host:5000) or the path of a SQLite file"
    )


def _check_sqlite_file(path: Path, shown: str) -> None:
    """A SQLite store's file: not a folder, and in a folder that exists (radt creates no folders on a typo).

    The file itself is not opened here: closing any descriptor of a SQLite file drops the locks
    another thread of this process holds on it (POSIX), so whether it is a database is SQLite's to say."""
    if path.is_dir():
        raise StoreUriError(f"{shown}: {path} is a folder; give the SQLite file in it, e.g. {path / 'mlflow.db'}")
    if not path.parent.is_dir():
        raise StoreUriError(f"{shown}: the folder {path.parent} does not exist; create it (mkdir -p {path.parent}) or give a SQLite file in an existing folder")


def display_uri(uri: str) -> str:
    """The URI for messages and the page: its password (user:password@, password=...) masked."""
    masked = re.sub(r"(://[^:/@]+):[^@/]*@", r"\1:***@", uri)
    return re.sub(r"(?i)(password=)[^&]*", r"\1***", masked)


def is_database_uri(uri: str) -> bool:
    return uri.split(":", 1)[0].split("+", 1)[0] in ("sqlite", "postgresql", "postgres", "mysql", "mssql")


def artifact_root() -> Path:
    """Artifacts of database-URI stores (an `mlflow server` keeps its own)."""
    path = radt_home() / "artifacts"
    path.mkdir(parents=True, exist_ok=True)
    return path


def runs_dir() -> Path:
    """Per-run local folders: logs while the run trains, the spool while the store is away."""
    path = radt_home() / "runs"
    path.mkdir(parents=True, exist_ok=True)
    return path


T = TypeVar("T", int, float, str)


class Setting(Generic[T]):
    """One setting: its environment variable's name, its type and its default (numbers may not be negative; text is taken as given)."""

    def __init__(self, name: str, type_: type[T], default: T, doc: str) -> None:
        self.name = name
        self.type = type_
        self.default = default
        self.doc = doc

    def get(self) -> T:
        raw = os.environ.get(self.name)
        if raw is None or not raw.strip():
            return self.default
        try:
            value = self.type(raw)
        except ValueError:
            raise ValueError(f"{self.name}={raw!r} is not a {self.type.__name__}; unset it or give e.g. {self.default}") from None
        if not isinstance(value, str) and value < 0:
            raise ValueError(f"{self.name}={raw!r} is negative; unset it or give e.g. {self.default}")
        return value

    def __str__(self) -> str:
        return f"{self.name} (default: {self.default})"


STORE_TIMEOUT = Setting(
    "RADT_STORE_TIMEOUT",
    float,
    5.0,
    "seconds a store call (a batch of points, a tag, the final status) may take before it counts as an outage: "
    "the batch goes to the spool and the writer carries on; also PostgreSQL's statement_timeout and connect_timeout, "
    "SQLite's busy timeout and the MLflow client's HTTP timeout in radt's own process",
)
HTTP_RETRIES = Setting(
    "RADT_HTTP_RETRIES",
    int,
    0,
    "MLflow client retries of one HTTP request in radt's own process (MLFLOW_HTTP_REQUEST_MAX_RETRIES); radt retries a failed batch itself, from its spool",
)
ARTIFACT_URI = Setting(
    "RADT_ARTIFACT_URI",
    str,
    "",
    "where experiments radt creates keep their artifacts (logs, nsys/ncu reports), as ROOT/<experiment>: a folder every host "
    "mounts, an mlflow server's mlflow-artifacts://host:5000/path, or any URI MLflow's artifact stores take (s3://bucket/path, ...); "
    "`--artifacts` wins; empty: RADT_HOME/artifacts for a database store, the server's own for an mlflow server (radt/artifacts.py)",
)
RETRY_INTERVAL = Setting("RADT_RETRY_INTERVAL", float, 2.0, "seconds between tries of a store that failed or did not answer")
PROMETHEUS_URL = Setting(
    "RADT_PROMETHEUS_URL",
    str,
    "",
    "the Prometheus server (http://host:9090) whose dcgm-exporter series the `prometheus` listener reads for this node's GPUs; `--prometheus URL` wins",
)
PROMETHEUS_HOST_LABEL = Setting(
    "RADT_PROMETHEUS_HOST_LABEL",
    str,
    "Hostname",
    "the exporter's label that names the node (dcgm-exporter's Hostname; `instance` matches the scrape target host:port; "
    "Kubernetes relabelling often adds `node` or `kubernetes_node`), compared with this host's name",
)
MEMORY_POINTS = Setting(
    "RADT_MEMORY_POINTS",
    int,
    1_000_000,
    "points kept in memory while neither the store nor the spool file can take them (about 200 bytes each); newer ones are dropped and counted",
)
FINISH_TIMEOUT = Setting(
    "RADT_FINISH_TIMEOUT",
    float,
    30.0,
    "seconds for each store call of `radt sync` (a spool batch, a run's last writes: logs, tags, status) and for a run's last writes "
    "where no --flush-timeout bounds them",
)
READ_THREADS = Setting(
    "RADT_READ_THREADS",
    int,
    2,
    "PostgreSQL connections one dashboard chart reads a large selection of runs on at once (each part on its own server core); 0 and 1 read on one",
)
CACHE = Setting(
    "RADT_CACHE",
    str,
    "simple",
    "the dashboard's cache: simple (one process), null (none), or a redis:// URL that several gunicorn workers share; `radt dashboard --cache` wins",
)

# radt's exit status when the script succeeded but points were lost (neither written nor kept on disk);
# EX_TEMPFAIL of sysexits.h. A failing script's own exit code wins; the message says the loss either way.
POINTS_LOST_EXIT = 75
