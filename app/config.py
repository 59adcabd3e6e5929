"""Where radt keeps things: the tracking store URI and the local run directories.

`MLFLOW_TRACKING_URI` wins; without it radt uses an embedded SQLite file under `RADT_HOME`
(default `~/.radt`), so `radt train.py` and `python app.py` find the same store from any folder.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

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
