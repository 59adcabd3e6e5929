"""Where radt keeps things: the tracking store URI and the local run directories.

`MLFLOW_TRACKING_URI` wins; without it radt uses an embedded SQLite file under `RADT_HOME`
(default `~/.radt`), so `radt train.py` and `python app.py` find the same store from any folder.
"""

from __future__ import annotations

import os
from pathlib import Path


def radt_home() -> Path:
    home = Path(os.environ.get("RADT_HOME") or Path.home() / ".radt").expanduser()
    home.mkdir(parents=True, exist_ok=True)
    return home


def default_store_uri() -> str:
    return f"sqlite:///{radt_home() / 'mlflow.db'}"


def tracking_uri(explicit: str | None = None) -> str:
    """The store to use: an explicit --store, else MLFLOW_TRACKING_URI, else the embedded default."""
    return explicit or os.environ.get("MLFLOW_TRACKING_URI") or default_store_uri()


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
