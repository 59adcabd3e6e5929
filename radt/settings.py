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

import math
import os
import re
import socket
import sys
import threading
import urllib.parse
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Generic, NoReturn, TypeVar

from radt.errors import UserError

DATABASE_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")  # SQLAlchemy's names, each with an optional +driver
SERVER_SCHEMES = ("http", "https")  # an `mlflow server`


class StoreUriError(UserError, ValueError):
    """A tracking store radt cannot use; the message names it (password masked) and the fix."""


def home_path() -> Path:
    """RADT_HOME as configured (default ~/.radt), not yet created."""
    return Path(os.environ.get("RADT_HOME") or Path.home() / ".radt").expanduser()


def radt_home() -> Path:
    home = home_path()
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
    file (`sqlite:///<absolute path>`), whose folder must exist, and a new one's name ends in .db/.sqlite/.sqlite3.
    MLflow's file store (`file:`, a folder or a new path such as ./mlruns) and unknown schemes are refused:
    StoreUriError names the fix.
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
            if not path.exists():
                _check_new_sqlite_name(value, path, shown)
            return f"sqlite:///{path}"
    base = scheme.lower().split("+", 1)[0]
    if base != "file" and not separator:
        raise StoreUriError(f"{shown}: a URI needs '{scheme}://'; give e.g. sqlite:///path/mlflow.db, postgresql://user@host/db or the path of a SQLite file")
    if base == "file":
        raise StoreUriError(
            f"{shown}: MLflow's file store is not supported by radt; use a SQLite file (--store sqlite:///path/mlflow.db or a path ending in .db) "
            "or a database, and `mlflow migrate-filestore` to move runs you have there"
        )
    if base in DATABASE_SCHEMES or base == "postgres":  # SQLAlchemy reads only lower-case names; postgres:// is its old spelling
        written = scheme
        scheme = ("postgresql" + scheme[len("postgres") :] if base == "postgres" else scheme).lower()
        value, base = scheme + value[len(written) :], scheme.split("+", 1)[0]
    if base == "sqlite":
        database = value[len(scheme) + len("://") :].split("?", 1)[0]
        if database.startswith("/") and database not in ("/", "/:memory:") and not database.startswith("/file:"):
            _check_sqlite_file(Path(os.path.expanduser(database[1:])), shown)
    if base in DATABASE_SCHEMES:
        if scheme != "sqlite":  # plain sqlite:// is Python's own sqlite3
            _check_driver(value, scheme, shown)
        return value
    if base in SERVER_SCHEMES:
        return value
    raise StoreUriError(
        f"{shown}: radt cannot use a '{scheme}' store; give a database URI (sqlite:///path/mlflow.db, postgresql://user@host/db, mysql://...), "
        "an MLflow server (http://host:5000) or the path of a SQLite file"
    )


# A database driver's module -> the package that installs it, for the line that says what to install.
DRIVER_PACKAGES = {
    "MySQLdb": "mysqlclient",
    "pymysql": "PyMySQL",
    "mysql": "mysql-connector-python",
    "mariadb": "mariadb",
    "pyodbc": "pyodbc",
    "pymssql": "pymssql",
    "psycopg": "'psycopg[binary]'",
    "psycopg2": "psycopg2-binary",
    "pg8000": "pg8000",
}


def _check_driver(value: str, scheme: str, shown: str) -> None:
    """The URI's SQLAlchemy dialect and its Python driver load here: a driver that is not installed is one line that
    names the package, at start, instead of a traceback from deep inside the first connection (or a dashboard that
    serves and cannot read)."""
    import sqlalchemy as sa

    base, _plus, driver = scheme.partition("+")
    try:
        dialect = sa.engine.make_url(value).get_dialect()
    except sa.exc.NoSuchModuleError:
        named = f"no driver '{driver}'" if driver else "no driver named after '+'"
        raise StoreUriError(
            f"{shown}: SQLAlchemy has {named} for {base}; give {base}://... (its default driver) or {base}+<driver>:// with a driver SQLAlchemy names"
        ) from None
    except (sa.exc.ArgumentError, ValueError) as exc:  # a port that is not a number, a URI SQLAlchemy cannot split
        raise StoreUriError(f"{shown} is not a database URI radt can read ({str(exc).splitlines()[0]}); give e.g. {base}://user@host:5432/db") from None
    if getattr(dialect, "is_async", False):
        raise StoreUriError(f"{shown}: '{scheme}' is an asyncio driver; radt needs a synchronous one, e.g. {base}://...")
    try:
        dialect.import_dbapi()
    except ImportError as exc:
        module = (exc.name or str(exc)).split(".")[0]
        package = DRIVER_PACKAGES.get(module, module)
        why = "is not installed" if isinstance(exc, ModuleNotFoundError) else f"does not load ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"
        raise StoreUriError(
            f"{shown} needs the Python driver '{module}', which {why}; `{sys.executable} -m pip install {package}`, "
            f"or name an installed driver ({base}+<driver>://)"
        ) from None


SQLITE_SUFFIXES = (".db", ".sqlite", ".sqlite3")  # the names a plain path may create a new SQLite store under
FILE_STORE_NAME = "mlruns"  # the folder of MLflow's file store (its default tracking URI)


def _check_new_sqlite_name(typed: str, path: Path, shown: str) -> None:
    """A plain path that does not exist creates a SQLite store only under a database's name: `./mlruns` (what an MLflow
    user types for its file store) or a typo made a SQLite file of that name and recorded there without a word."""
    if path.suffix.lower() in SQLITE_SUFFIXES:
        return
    if path.name.lower() == FILE_STORE_NAME:
        raise StoreUriError(
            f"{shown}: no such file, and {path.name} is the folder of MLflow's file store, which radt does not use; "
            f"give a SQLite file such as {typed.rstrip('/')}.db (radt creates it) or a database URI (postgresql://user@host/db)"
        )
    names = ", ".join(SQLITE_SUFFIXES[:-1]) + f" or {SQLITE_SUFFIXES[-1]}"
    raise StoreUriError(
        f"{shown}: no such file; radt creates a new SQLite store only under a name ending in {names} (a typo is not taken for one): "
        f"give {typed.rstrip('/')}.db, or sqlite:///{path} for that very name"
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


HOME_PROBE_BYTES = 16 * 1024  # what a run writes in RADT_HOME before its script starts: meta.json, its lock, the GPU inventory


class RadtHomeError(UserError, ValueError):
    """RADT_HOME cannot be written; the message names the folder, the reason and the fix."""


def check_radt_home() -> Path:
    """RADT_HOME and its runs folder, each written to (HOME_PROBE_BYTES) before a run is created: a full,
    read-only or impossible RADT_HOME is refused while nothing exists yet, not after a run was left RUNNING."""
    home = home_path()
    try:
        for folder in (home, home / "runs"):
            folder.mkdir(parents=True, exist_ok=True)
            _probe(folder)
    except OSError as exc:
        where = f": {exc.filename}" if exc.filename and ".radt-probe-" not in str(exc.filename) and str(exc.filename) != str(home) else ""
        raise RadtHomeError(
            f"RADT_HOME {home} cannot be written ({exc.strerror or exc}{where}); radt keeps each run's logs and spool there: "
            "free space there or set RADT_HOME to a folder radt can write"
        ) from None
    return home


def _probe(folder: Path) -> None:
    """Write HOME_PROBE_BYTES in `folder` and remove them; OSError where the disk is full or read-only."""
    path = folder / f".radt-probe-{os.getpid()}-{threading.get_ident()}"
    probe = open(path, "wb")  # noqa: SIM115 - closed below, before the file is removed
    try:
        with probe:
            probe.write(bytes(HOME_PROBE_BYTES))  # a full disk fails here or at close
    finally:
        path.unlink(missing_ok=True)


T = TypeVar("T", int, float, str)


class SettingError(UserError, ValueError):
    """A RADT_* variable radt cannot use; the message names it, its value and what it takes."""


SETTINGS: list[Setting] = []  # every Setting made, in order: check_settings reads them all before a command starts


class Setting(Generic[T]):
    """One setting: its environment variable's name, its type, its default and what it takes.

    A number must be finite and from `low` to `high` (`unit` says what it counts), or get() refuses it; a text must
    pass `check` (`accepted` says what passes) where validate() asks. A refusal is a SettingError naming the variable,
    its value and the fix."""

    def __init__(
        self,
        name: str,
        type_: type[T],
        default: T,
        doc: str,
        *,
        low: float = 0,
        high: float | None = None,
        unit: str = "",
        check: Callable[[str], bool] | None = None,
        accepted: str = "",
    ) -> None:
        self.name = name
        self.type = type_
        self.default = default
        self.doc = doc
        self.low, self.high = low, high
        self.unit = unit or ("a whole number" if type_ is int else "a number")
        self.check, self.accepted = check, accepted
        SETTINGS.append(self)

    def get(self) -> T:
        raw = os.environ.get(self.name)
        if raw is None or not raw.strip():
            return self.default
        if self.type is str:
            return raw  # taken as given here; check_settings refuses one that fails `check` before a command starts
        try:
            value = self.type(raw)
        except ValueError:
            self._refuse(raw, f"is not {'a whole number' if self.type is int else 'a number'}")
        if not math.isfinite(value):
            self._refuse(raw, "is not a finite number")
        if value < self.low or (self.high is not None and value > self.high):
            self._refuse(raw, "is out of range")
        return value

    def _refuse(self, raw: str, problem: str) -> NoReturn:
        limits = f"from {_plain(self.low)} to {_plain(self.high)}" if self.high is not None else f"of {_plain(self.low)} or more"
        raise SettingError(f"{self.name}={raw!r} {problem}; give {self.unit} {limits} (default {_plain(self.default)}), or unset it")

    def validate(self) -> None:
        """get(), and a text that fails `check` refused: what check_settings asks of every setting."""
        value = self.get()
        if self.check is not None and value != self.default and not self.check(value.strip()):
            default = f" for {self.default}" if self.default else ""
            raise SettingError(f"{self.name}={value!r} is not {self.accepted}; give one, or unset it{default}")

    def __str__(self) -> str:
        return f"{self.name} (default: {self.default})"


def _plain(number: float) -> str:
    """A bound as a person writes it: 86400, 1000000000, 0.1."""
    return str(int(number)) if float(number).is_integer() else f"{number:g}"


def check_settings() -> None:
    """Every RADT_* setting read once, before a command creates anything: a bad one is its SettingError now, not after a run exists."""
    for setting in SETTINGS:
        setting.validate()


def reference() -> str:
    """Every setting as docs/reference.md's table (name, default, what it does): tests/test_settings_reference.py keeps the page equal to it."""
    rows = ["| variable | default | what it sets |", "| --- | --- | --- |"]
    for setting in SETTINGS:
        default = _plain(setting.default) if isinstance(setting.default, (int, float)) else (setting.default or "(empty)")
        rows.append(f"| `{setting.name}` | `{default}` | {setting.doc.replace('|', '/')} |")
    return "\n".join(rows) + "\n"


def is_http_url(text: str) -> bool:
    """An http(s)://host[:port][/path] URL that urllib reads (a Prometheus server)."""
    try:
        parsed = urllib.parse.urlsplit(text)
        return parsed.scheme in ("http", "https") and bool(parsed.hostname) and parsed.port != 0 and not (parsed.query or parsed.fragment)
    except ValueError:  # 'http://[::1' (an unclosed IPv6 address), a port that is not a number or out of range
        return False


LABEL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # a Prometheus label name (Hostname, instance, node)


def is_label_list(text: str) -> bool:
    """Prometheus label names joined with ',' (spaces around the commas allowed)."""
    return all(LABEL_NAME.fullmatch(name.strip()) for name in text.split(","))


def is_host_name(text: str) -> bool:
    """A node's name as an exporter's label holds it: 1 to 253 characters, none of them blank."""
    return re.fullmatch(r"\S{1,253}", text) is not None


FRAME_SOURCE = re.compile(r"https?://(\*\.)?[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*(:\d{1,5})?")  # an origin, as CSP's frame-ancestors lists one


def is_frame_ancestors(text: str) -> bool:
    """CSP frame-ancestors sources: 'none' alone, or 'self' and http(s) origins separated by spaces (no ';' or ',' that
    would start another directive or header value)."""
    sources = text.split()
    if sources == ["'none'"]:
        return True
    return bool(sources) and all(source == "'self'" or FRAME_SOURCE.fullmatch(source) for source in sources)


PATH_SEGMENT = re.compile(r"[A-Za-z0-9_~-][A-Za-z0-9._~-]*")  # one segment of a URL path prefix: no '.', '..', '%', '?' or '#'


def is_url_prefix(text: str) -> bool:
    """A URL path the dashboard can be served under (/radt/, /tools/radt, radt): segments of letters, digits and . _ ~ -."""
    segments = text.strip().strip("/").split("/")
    return segments == [""] or all(PATH_SEGMENT.fullmatch(segment) for segment in segments)


def url_prefix() -> str:
    """RADT_URL_PREFIX as Dash takes it, '/' at both ends ('radt' -> '/radt/', '' -> '/'); a SettingError for one that is no path."""
    URL_PREFIX.validate()
    inner = URL_PREFIX.get().strip().strip("/")
    return f"/{inner}/" if inner else "/"


def dashboard_path(path: str) -> str:
    """A link of the dashboard ('/live?x=1', '/runs/<id>/artifacts') under RADT_URL_PREFIX ('/radt/live?x=1')."""
    return url_prefix().rstrip("/") + path


def host_name() -> str:
    """The node's name for Prometheus and the run's radt.host tag: RADT_HOST (what --host sets), else this machine's."""
    return HOST.get().strip() or socket.gethostname()


DAY = 86_400.0  # the longest timeout radt takes: a day (PostgreSQL's statement_timeout is an int of milliseconds)
STORE_TIMEOUT = Setting(
    "RADT_STORE_TIMEOUT",
    float,
    5.0,
    "seconds a store call (a batch of points, a tag, the final status) may take before it counts as an outage: "
    "the batch goes to the spool and the writer carries on; also PostgreSQL's statement_timeout and connect_timeout, "
    "SQLite's busy timeout and the MLflow client's HTTP timeout in radt's own process",
    low=0.1,
    high=DAY,
    unit="seconds",
)
STORE_CREATE_TIMEOUT = Setting(
    "RADT_STORE_CREATE_TIMEOUT",
    float,
    300.0,
    "seconds a radt waits while another process creates or migrates a new store's schema (radts started together on a new "
    "SQLite file or PostgreSQL database: one creates it, the others wait, then record); past it, one line and exit 2",
    low=0.1,
    high=DAY,
    unit="seconds",
)
HTTP_RETRIES = Setting(
    "RADT_HTTP_RETRIES",
    int,
    0,
    "MLflow client retries of one HTTP request in radt's own process (MLFLOW_HTTP_REQUEST_MAX_RETRIES); radt retries a failed batch itself, from its spool",
    high=100,
    unit="a number of retries",
)
ARTIFACT_URI = Setting(
    "RADT_ARTIFACT_URI",
    str,
    "",
    "where experiments radt creates keep their artifacts (logs, nsys/ncu reports), as ROOT/<experiment>: a folder every host "
    "mounts, an mlflow server's mlflow-artifacts://host:5000/path, or any URI MLflow's artifact stores take (s3://bucket/path, ...); "
    "`--artifacts` wins; empty: RADT_HOME/artifacts for a database store, the server's own for an mlflow server (radt/artifacts.py)",
)
ARTIFACT_ROOTS = Setting(
    "RADT_ARTIFACT_ROOTS",
    str,
    "",
    "more local folders (separated by ':') whose runs' artifacts the dashboard serves, besides RADT_HOME/artifacts and "
    "RADT_ARTIFACT_URI's folder; a run whose experiment points anywhere else (file:///etc) has its artifacts refused",
)
RETRY_INTERVAL = Setting(
    "RADT_RETRY_INTERVAL", float, 2.0, "seconds between tries of a store that failed or did not answer", low=0.01, high=3600, unit="seconds"
)
PROMETHEUS_URL = Setting(
    "RADT_PROMETHEUS_URL",
    str,
    "",
    "the Prometheus server (http://host:9090) whose dcgm-exporter series the `prometheus` listener reads for this node's GPUs; `--prometheus URL` wins",
    check=is_http_url,
    accepted="a Prometheus server's http(s) URL such as http://prometheus:9090",
)
PROMETHEUS_HOST_LABEL = Setting(
    "RADT_PROMETHEUS_HOST_LABEL",
    str,
    "Hostname,hostname",
    "the exporter's label that names the node, or several joined with ',' tried in turn (dcgm-exporter's Hostname, newer "
    "exporters' hostname; `instance` matches the scrape target host:port; Kubernetes relabelling often adds `node` or "
    "`kubernetes_node`), compared with RADT_HOST",
    check=is_label_list,
    accepted="a Prometheus label name such as Hostname or instance",
)
HOST = Setting(
    "RADT_HOST",
    str,
    "",
    "the node's name as its exporter labels it in Prometheus (a Kubernetes node for a pod, the machine for a container): "
    "what the prometheus listener looks for and the run's radt.host tag; `--host NAME` wins; empty: this machine's host name",
    check=is_host_name,
    accepted="a host name without spaces such as gpu-node-7",
)
POD_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")  # a Kubernetes pod's name: a DNS subdomain
PROMETHEUS_POD = Setting(
    "RADT_PROMETHEUS_POD",
    str,
    "",
    "the Kubernetes pod the run runs in, as dcgm-exporter labels a time-shared GPU's per-pod series (pod, pod_name): the "
    "prometheus listener reads that pod's own GPU utilization and memory as the run's share; empty: HOSTNAME where "
    "KUBERNETES_SERVICE_HOST says the run is in a pod, else none",
    check=lambda text: POD_NAME.fullmatch(text) is not None,
    accepted="a pod's name such as train-7f9c-x2x4z",
)


def prometheus_pod(environ: Mapping[str, str] | None = None) -> str:
    """The run's pod for dcgm-exporter's per-pod series: RADT_PROMETHEUS_POD, else in a pod its host name (Kubernetes sets
    HOSTNAME to the pod's name), else '' (none known: no share is read)."""
    environ = os.environ if environ is None else environ
    given = PROMETHEUS_POD.get().strip()
    if given:
        return given
    return environ.get("HOSTNAME", "").strip() if environ.get("KUBERNETES_SERVICE_HOST") else ""


MEMORY_POINTS = Setting(
    "RADT_MEMORY_POINTS",
    int,
    1_000_000,
    "points kept in memory while neither the store nor the spool file can take them (about 200 bytes each); newer ones are dropped and counted",
    high=1_000_000_000,
    unit="a number of points",
)
FINISH_TIMEOUT = Setting(
    "RADT_FINISH_TIMEOUT",
    float,
    30.0,
    "seconds for each store call of `radt sync` (a spool batch, a run's last writes: logs, tags, status) and for a run's last writes "
    "where no --flush-timeout bounds them",
    low=0.1,
    high=DAY,
    unit="seconds",
)
READ_THREADS = Setting(
    "RADT_READ_THREADS",
    int,
    2,
    "PostgreSQL connections one dashboard chart reads a large selection of runs on at once (each part on its own server core); 0 and 1 read on one",
    high=64,
    unit="a number of connections",
)
REQUEST_TIMEOUT = Setting(
    "RADT_REQUEST_TIMEOUT",
    float,
    20.0,
    "seconds one dashboard request may read the store and draw; past it the view answers with a message, and a "
    "PostgreSQL that does not answer at all (frozen) is cut then, 1 s later (keep it under gunicorn's --timeout, 30 in "
    "the README); 0 means no deadline",
)
READY_TIMEOUT = Setting(
    "RADT_READY_TIMEOUT",
    float,
    2.0,
    "seconds the dashboard's -/ready waits for the store before it answers 503 (a probe's own timeout is a second or a "
    "few); probes that come while one check waits share it",
    low=0.1,
    high=600,
    unit="seconds",
)
REQUEST_BODY_MB = Setting(
    "RADT_REQUEST_BODY_MB",
    float,
    8.0,
    "megabytes one dashboard request's body may hold (a browser's callback requests hold a few kB); a larger one is "
    "answered 413 before it is read, so that no viewer can make a worker read and parse a body of gigabytes",
    low=0.1,
    unit="megabytes",
)
CACHE = Setting(
    "RADT_CACHE",
    str,
    "simple",
    "the dashboard's cache: simple (one process), null (none), or a redis:// URL that several gunicorn workers share; `radt dashboard --cache` wins",
    check=lambda text: text in ("simple", "null") or re.fullmatch(r"rediss?://\S+", text) is not None,
    accepted="simple, null or a redis:// URL",
)

# --- recording: sampling, delivery, scheduling -------------------------------------------------------------------
MIN_INTERVAL = 0.1  # the shortest sampling interval radt takes (seconds): below it the sampler's own cost shows in the run
INTERVAL = Setting(
    "RADT_INTERVAL",
    float,
    1.0,
    "seconds between samples of a run's hardware metrics (`--interval` wins); also the step of logs without timestamps that `radt import` reads",
    low=MIN_INTERVAL,
    high=3600,
    unit="seconds",
)
FLUSH_TIMEOUT = Setting(
    "RADT_FLUSH_TIMEOUT",
    float,
    60.0,
    "seconds a run keeps trying an unreachable store when it ends, before the points left go to the spool for `radt sync` (`--flush-timeout` wins)",
    high=DAY,
    unit="seconds",
)
SCRIPT_LOG_POLL = Setting(
    "RADT_SCRIPT_LOG_POLL", float, 0.2, "seconds between reads of a script's metrics file while it runs", low=0.01, high=60, unit="seconds"
)
SLURM_POLL = Setting("RADT_SLURM_POLL", float, 1.0, "seconds between squeue calls while `radt --slurm` watches its jobs", low=0.05, high=3600, unit="seconds")
PARENT_SETTLE = Setting(
    "RADT_PARENT_SETTLE",
    float,
    1.0,
    "seconds between two looks at an experiment's parent runs when radts started together create one (longer than an MLflow server takes to create a run)",
    low=0.01,
    high=600,
    unit="seconds",
)
SETTLE_WAIT = Setting(
    "RADT_SETTLE_WAIT",
    float,
    60.0,
    "seconds a radt waits for another radt's new parent run to be settled before it goes with what it sees (its creator gone)",
    low=0.1,
    high=DAY,
    unit="seconds",
)

# --- dashboard: periods ------------------------------------------------------------------------------------------
LIVE_POLL = Setting(
    "RADT_LIVE_POLL",
    float,
    1.0,
    "seconds between the Live page's looks at the store for running runs and their latest values",
    low=0.1,
    high=600,
    unit="seconds",
)
LIVE_REDRAW = Setting(
    "RADT_LIVE_REDRAW",
    float,
    5.0,
    "seconds between redraws of Explore's charts while a drawn run is still running (the user's zoom kept)",
    low=0.2,
    high=3600,
    unit="seconds",
)
LIVE_FINDINGS_WINDOW = Setting(
    "RADT_LIVE_FINDINGS_WINDOW",
    float,
    5.0,
    "minutes of a running run that Live's findings are over: long enough for the rules' shares (30 ten-second rollup buckets), "
    "short enough to say what the run does now",
    low=1,
    high=24 * 60,
    unit="minutes",
)

# --- dashboard: its cache -----------------------------------------------------------------------------------------
FINISHED_TIMEOUT = 3600  # seconds a finished run's cached series live: they never change
RUNNING_TIMEOUT = 2  # a running run's series grow every sample
LISTING_TIMEOUT = 5  # experiments and runs lists
ZOOM_TIMEOUT = 60  # a zoomed window of a run: redraws of the same zoom hit; each new zoom is another entry, gone after a minute
RESPONSE_TIMEOUT = 600  # a whole draw response of ended runs (app/web/responses.py); checked against the store on every hit
CACHE_RETRY_S = 5.0  # a Redis cache that failed is left alone this long before a call tries it again (each would wait its timeout)
CACHE_TIMEOUT = Setting(
    "RADT_CACHE_TIMEOUT",
    float,
    1.0,
    "seconds the dashboard waits on a Redis cache (RADT_CACHE) for one read or write; past it, or while Redis is down, "
    "views are drawn without the cache, which is tried again 5 s later",
    low=0.05,
    high=60,
    unit="seconds",
)
CACHE_ENTRIES = Setting(
    "RADT_CACHE_ENTRIES",
    int,
    2000,
    "entries the one-process (simple) dashboard cache keeps before it drops the oldest",
    low=1,
    high=10_000_000,
    unit="a number of entries",
)
RESPONSE_CACHE = Setting(
    "RADT_RESPONSE_CACHE", int, 1, "1: keep the explore chart's whole response for views of ended runs (app/web/responses.py); 0: draw every time", high=1
)
CLUSTER_ROWS = Setting(
    "RADT_CLUSTER_ROWS",
    int,
    500,
    "jobs the Cluster page lists, the most idle GPU-hours first (the totals above it count every job; narrow by user, account or partition to see the rest)",
    low=1,
    high=100_000,
    unit="a number of jobs",
)
FRAME_ANCESTORS = Setting(
    "RADT_FRAME_ANCESTORS",
    str,
    "'self'",
    "the sites whose pages may show the dashboard in a frame (CSP frame-ancestors): 'self' (default: only the dashboard's own "
    "address), or origins such as 'self' https://portal.example.org, or 'none'; another site framing it could trick a user's clicks",
    check=is_frame_ancestors,
    accepted="'none', or 'self' and http(s) origins separated by spaces, e.g. 'self' https://portal.example.org",
)
URL_PREFIX = Setting(
    "RADT_URL_PREFIX",
    str,
    "/",
    "the path the dashboard is served under, for a reverse proxy that passes it on (https://host/radt/ -> /radt/); every page, "
    "asset, callback and link of the dashboard stays under it; `radt dashboard --url-prefix` wins",
    check=is_url_prefix,
    accepted="a URL path of letters, digits and . _ ~ - between '/', e.g. /radt/ or /tools/radt/",
)
COMPRESS = Setting("RADT_COMPRESS", int, 1, "1: gzip the dashboard's responses for browsers that accept it; 0: send them as they are", high=1)

# --- the diagnosis (radt/diagnosis.py): each threshold with the reason for its value -------------------------------------
IDLE_LEVEL = Setting(
    "RADT_IDLE_LEVEL",
    float,
    0.01,
    "idle_gpus: a GPU whose graphics engine activity (GRACT; SMACT, or GPU util / 100, where that is all there is) stays below this is idle: "
    "1 % is below any kernel's footprint (one thread block of one thread still shows GRACT 0.9) and above a sensor's noise",
    high=1,
    unit="a ratio (0-1)",
)
IDLE_SHARE = Setting(
    "RADT_IDLE_SHARE",
    float,
    0.5,
    "idle_gpus: a GPU idle for at least this share of the run is named; half the run idle is a GPU the job did not need, not a pause",
    high=1,
    unit="a ratio (0-1)",
)
GAP_LEVEL = Setting(
    "RADT_GAP_LEVEL",
    float,
    0.05,
    "input_starved: SMACT below this is a gap (the SMs wait); 5 % leaves room for the copies and tiny kernels a waiting step still runs",
    high=1,
    unit="a ratio (0-1)",
)
GAP_SHARE = Setting(
    "RADT_GAP_SHARE",
    float,
    0.25,
    "input_starved: the share of the run's 10-second windows that hold a gap while the GPU works in others, from which gaps recur; "
    "a quarter of the windows is more than checkpoints, evaluation passes and a loader's hiccups at epoch ends explain",
    high=1,
    unit="a ratio (0-1)",
)
STARVED_LOSS = Setting(
    "RADT_STARVED_LOSS",
    float,
    0.15,
    "input_starved: named when the gaps cost the GPU at least this share of its time (each window's shortfall below the GPU's busy "
    "level); under 15 % more workers rarely pay for their memory",
    high=1,
    unit="a ratio (0-1)",
)
CPU_BUSY_CORES = Setting(
    "RADT_CPU_BUSY_CORES",
    float,
    0.9,
    "input_starved: the run's processes use at least this many cores during the gaps (or the host's CPU is at least 90 %): a Python "
    "data loader's main thread is one core, so 0.9 of one says it is busy while the GPU waits",
    high=4096,
    unit="cores",
)
SMALL_KERNEL_GRACT = Setting("RADT_SMALL_KERNEL_GRACT", float, 0.5, "small_kernels: the engine is busy (GRACT at least this) ...", high=1, unit="a ratio (0-1)")
SMALL_KERNEL_SMACT = Setting(
    "RADT_SMALL_KERNEL_SMACT",
    float,
    0.2,
    "small_kernels: ... while SMACT stays below this: kernels run but keep few SMs busy (one block of one thread: GRACT 0.9, SMACT 0.001)",
    high=1,
    unit="a ratio (0-1)",
)
LOW_OCCUPANCY_SMACT = Setting("RADT_LOW_OCCUPANCY_SMACT", float, 0.5, "low_occupancy: the SMs are busy (SMACT at least this) ...", high=1, unit="a ratio (0-1)")
LOW_OCCUPANCY_SMOCC = Setting(
    "RADT_LOW_OCCUPANCY_SMOCC",
    float,
    0.15,
    "low_occupancy: ... with SMOCC below this: few warps resident per SM, so memory latency is not hidden (NVIDIA's guidance puts healthy kernels above ~25 %)",
    high=1,
    unit="a ratio (0-1)",
)
MEMORY_BOUND_DRAM = Setting(
    "RADT_MEMORY_BOUND_DRAM",
    float,
    0.5,
    "memory_bound: DRAM activity at least this (half the peak bandwidth in use on average) ...",
    high=1,
    unit="a ratio (0-1)",
)
MEMORY_BOUND_SMACT = Setting(
    "RADT_MEMORY_BOUND_SMACT",
    float,
    0.7,
    "memory_bound: ... while SMACT stays below this: the SMs wait on memory more than they compute",
    high=1,
    unit="a ratio (0-1)",
)
TENSOR_LEVEL = Setting(
    "RADT_TENSOR_LEVEL",
    float,
    0.01,
    "no_tensor_cores: tensor activity below this while SMACT is at least RADT_TENSOR_SMACT, on a GPU with tensor cores: fp32 matmuls leave "
    "the tensor pipes at 0, bf16/fp16 ones keep them well above 1 %",
    high=1,
    unit="a ratio (0-1)",
)
TENSOR_SMACT = Setting(
    "RADT_TENSOR_SMACT", float, 0.3, "no_tensor_cores: the SMs busy enough (SMACT at least this) for the tensor pipes to matter", high=1, unit="a ratio (0-1)"
)
THROTTLE_SHARE = Setting(
    "RADT_THROTTLE_SHARE",
    float,
    0.1,
    "throttled: the clocks held down by power, temperature or the hardware for at least this share of the run; shorter bursts are a boost clock's normal life",
    high=1,
    unit="a ratio (0-1)",
)
STRAGGLER_LAG = Setting(
    "RADT_STRAGGLER_LAG",
    float,
    0.2,
    "straggler: a GPU (or node) whose SMACT is this share below the median of the run's others is named; data-parallel ranks wait for "
    "the slowest, so 20 % less work on one is 20 % of every other rank's time",
    high=1,
    unit="a ratio (0-1)",
)
SHARE_BELOW = Setting(
    "RADT_SHARE_BELOW",
    float,
    0.5,
    "could_share: a one-GPU run or job whose SMACT mean is below this leaves half its GPU's SMs to another",
    high=1,
    unit="a ratio (0-1)",
)
GRID_INTENSITY = Setting(
    "RADT_GRID_INTENSITY",
    float,
    400.0,
    "gCO2eq per kWh of the grid the GPUs draw from, for a run's carbon: 400 is roughly the world average of 2024 (Ember); set your site's",
    high=2000,
    unit="gCO2eq/kWh",
)
PUE = Setting(
    "RADT_PUE",
    float,
    1.2,
    "power usage effectiveness of the data centre (facility energy / IT energy) that a run's GPU energy is multiplied by for its carbon; "
    "1.2 is a modern HPC site's, 1.58 the industry's mean (Uptime Institute 2023)",
    low=1,
    high=5,
    unit="a ratio (at least 1)",
)
GPU_HOUR_PRICE = Setting(
    "RADT_GPU_HOUR_PRICE",
    float,
    2.0,
    "the price of one GPU-hour for a run's cost (what a cloud charges, or your centre's internal rate); 2.0 is a rough on-demand cloud price for an A100",
    high=1000,
    unit="a price per GPU-hour",
)
CURRENCY = Setting("RADT_CURRENCY", str, "USD", "the currency RADT_GPU_HOUR_PRICE is in, as reports and the dashboard print it")

# radt's exit status when the script succeeded but points were lost (neither written nor kept on disk);
# EX_TEMPFAIL of sysexits.h. A failing script's own exit code wins; the message says the loss either way.
POINTS_LOST_EXIT = 75
