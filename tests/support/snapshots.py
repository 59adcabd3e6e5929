"""A store filled once per test run, then copied into each test's own fresh store.

Filling a store through MLflow's client (the way each writer did) costs a second per test; the read-side
tests only need the same rows in a store of their own. The first test process that asks fills one store
per builder and store kind under a lock; every test then gets those rows in its own `store_uri` (SQLite:
the file copied over it; PostgreSQL: the rows and sequence values loaded into it), so a test that writes
or deletes changes nothing for the next one.
"""

from __future__ import annotations

import pickle
import re
import shutil
import sqlite3
from collections.abc import Callable
from contextlib import AbstractContextManager, closing
from pathlib import Path
from typing import Any

import pytest

from tests.support import postgres, state


class Snapshots:
    """`restore(builder, uri)`: the rows `builder(uri)` would write, put into the empty store at `uri`; returns what builder returned."""

    def __init__(self, shared: Path, lock: Callable[[str], AbstractContextManager[Path]], sqlite_template: Path, pg_template: Callable[[], str]) -> None:
        self.shared, self.lock = shared, lock
        self.sqlite_template, self.pg_template = sqlite_template, pg_template
        self.made: dict[tuple[str, str], tuple[str, Any]] = {}

    def restore(self, builder: Callable[[str], Any], uri: str) -> Any:
        kind = "postgresql" if uri.startswith("postgresql") else "sqlite"
        source, info = self._made(builder, kind)
        if kind == "sqlite":
            shutil.copy(source, uri[len("sqlite:///") :])  # before anything in the test opened it
        else:
            postgres.load_rows(postgres.address(uri)[2], source)
        return info

    def _made(self, builder: Callable[[str], Any], kind: str) -> tuple[str, Any]:
        key = re.sub(r"\W", "_", f"{builder.__module__}.{builder.__qualname__}-{kind}")
        if (key, kind) not in self.made:
            with self.lock(f"snapshot-{key}") as shared:
                described = shared / f"snapshot-{key}.pickle"
                if not described.exists():
                    described.write_bytes(pickle.dumps(self._fill(builder, kind, key)))
                self.made[key, kind] = pickle.loads(described.read_bytes())
        return self.made[key, kind]

    def _fill(self, builder: Callable[[str], Any], kind: str, key: str) -> tuple[str, Any]:
        home = self.shared / f"snapshot-home-{key}"
        home.mkdir(exist_ok=True)
        with state.kept_environ(), pytest.MonkeyPatch.context() as mp:  # whatever radt sets in this process while it writes, undone
            mp.setenv("RADT_HOME", str(home))
            mp.delenv("MLFLOW_TRACKING_URI", raising=False)
            if kind == "sqlite":
                building, path = self.shared / f"snapshot-{key}-building.db", self.shared / f"snapshot-{key}.db"
                shutil.copy(self.sqlite_template, building)
                info = builder(f"sqlite:///{building}")
                with closing(sqlite3.connect(building)) as source, closing(sqlite3.connect(path)) as copy:
                    source.backup(copy)  # one file holding every committed row (the builder's may still sit in its write-ahead log)
                return str(path), info
            name = postgres.new_database(self.pg_template(), prefix=postgres.SHARED_PREFIX)
            info = builder(postgres.pg_url(name))
            postgres.end_sessions(name)  # the client's pooled connections: nothing reads it but load_rows from here on
            return name, info
