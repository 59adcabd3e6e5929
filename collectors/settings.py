"""radt's own timeouts and bounds: one place, typed, each with its environment variable and default.

In the style of MLflow's `mlflow/environment_variables.py`: `STORE_TIMEOUT.get()` reads
`RADT_STORE_TIMEOUT` when it is set and the default otherwise; a value that does not parse is a
ValueError naming the variable.
"""

from __future__ import annotations

import os
from typing import Generic, TypeVar

T = TypeVar("T", int, float)


class Setting(Generic[T]):
    """One setting: its environment variable's name, its type and its default."""

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
        if value < 0:
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
RETRY_INTERVAL = Setting("RADT_RETRY_INTERVAL", float, 2.0, "seconds between tries of a store that failed or did not answer")
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

# radt's exit status when the script succeeded but points were lost (neither written nor kept on disk);
# EX_TEMPFAIL of sysexits.h. A failing script's own exit code wins; the message says the loss either way.
POINTS_LOST_EXIT = 75
