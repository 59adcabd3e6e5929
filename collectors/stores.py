"""Where metric points go: MLflow's own tables directly (database URIs) or MLflow's client (servers).

The SQL path writes the same rows MLflow's `log_batch` would, `latest_metrics` included, with
MLflow's own table definitions, in one multi-row statement per batch: about ten times the
points per second of `log_batch`. Both paths are idempotent, so a replayed spool is harmless.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

import sqlalchemy as sa

from app.config import is_database_uri
from collectors.points import Point

MAX_FLOAT = 1.7976931348623157e308
LOG_BATCH_LIMIT = 1000  # MLflow's limit of metrics per log_batch call


class MetricStore(Protocol):
    def write(self, run_id: str, points: Sequence[Point]) -> None: ...

    def close(self) -> None: ...


def sanitize(value: float) -> tuple[float, bool]:
    """MLflow's rule: NaN is stored as 0 with is_nan, infinities as the largest finite float."""
    if math.isnan(value):
        return 0.0, True
    if math.isinf(value):
        return (MAX_FLOAT if value > 0 else -MAX_FLOAT), False
    return value, False


def make_engine(uri: str) -> sa.Engine:
    """An engine that survives a database restart (pre-ping) and waits on SQLite locks."""
    if uri.startswith("postgres://"):
        uri = "postgresql://" + uri[len("postgres://") :]
    if uri.startswith("sqlite"):
        engine = sa.create_engine(uri, connect_args={"timeout": 30})

        @sa.event.listens_for(engine, "connect")
        def _wal(dbapi_connection, _record):  # readers (the dashboard) never block the writer
            try:  # a no-op once the file is in WAL mode; radt switches it before the script starts
                dbapi_connection.execute("PRAGMA journal_mode=WAL")
            except Exception:  # locked by a writer right now: the mode is switched on a later connect
                pass

        return engine
    return sa.create_engine(uri, pool_pre_ping=True, pool_size=2, max_overflow=2, connect_args={"connect_timeout": 5})


class SqlMetricStore:
    """Bulk insert into MLflow's `metrics` and conditional upsert of `latest_metrics`."""

    def __init__(self, uri: str) -> None:
        from mlflow.store.tracking.dbmodels.models import SqlLatestMetric, SqlMetric

        self.engine = make_engine(uri)
        self.metrics = SqlMetric.__table__
        self.latest = SqlLatestMetric.__table__
        dialect = self.engine.dialect.name
        if dialect == "postgresql":
            from sqlalchemy.dialects.postgresql import insert
        elif dialect == "sqlite":
            from sqlalchemy.dialects.sqlite import insert
        else:
            raise ValueError(f"the bulk path supports PostgreSQL and SQLite, not {dialect}")
        self._insert = insert

    def write(self, run_id: str, points: Sequence[Point]) -> None:
        if not points:
            return
        rows = {}
        newest: dict[str, dict] = {}
        for p in points:
            value, is_nan = sanitize(p.value)
            row = {"key": p.key, "value": value, "timestamp": p.timestamp, "step": p.step, "is_nan": is_nan, "run_uuid": run_id}
            rows[(p.key, p.timestamp, p.step, value, is_nan)] = row
            best = newest.get(p.key)
            if best is None or (p.step, p.timestamp, value) > (best["step"], best["timestamp"], best["value"]):
                newest[p.key] = row
        insert_metrics = self._insert(self.metrics).on_conflict_do_nothing()
        upsert = self._insert(self.latest)
        excluded = upsert.excluded
        current = self.latest.c
        upsert = upsert.on_conflict_do_update(
            index_elements=[current.key, current.run_uuid],
            set_={"value": excluded.value, "timestamp": excluded.timestamp, "step": excluded.step, "is_nan": excluded.is_nan},
            where=sa.tuple_(current.step, current.timestamp, current.value) < sa.tuple_(excluded.step, excluded.timestamp, excluded.value),
        )
        with self.engine.begin() as conn:
            if not self._copy_metrics(conn, rows.values()):
                conn.execute(insert_metrics, list(rows.values()))
            # sorted keys: concurrent writers lock latest_metrics rows in one order (no deadlock)
            conn.execute(upsert, [newest[k] for k in sorted(newest)])

    # COPY into a session-local staging table, then one INSERT ... SELECT ... ON CONFLICT DO NOTHING:
    # psycopg 3 sends a multi-row insert as one statement per row, about half this speed.
    _STAGE = "radt_points_stage"
    _COLUMNS = ("key", "value", "timestamp", "step", "is_nan", "run_uuid")

    def _copy_metrics(self, conn: sa.Connection, rows) -> bool:
        """Bulk-load rows with PostgreSQL's COPY (psycopg 3); False where that path is not available."""
        if self.engine.dialect.name != "postgresql" or self.engine.dialect.driver != "psycopg":
            return False
        raw = conn.connection.driver_connection
        columns = ", ".join(f'"{c}"' for c in self._COLUMNS)
        with raw.cursor() as cur:
            cur.execute(
                f"CREATE TEMP TABLE IF NOT EXISTS {self._STAGE} (key varchar(250), value double precision, "
                '"timestamp" bigint, step bigint, is_nan boolean, run_uuid varchar(32)) ON COMMIT DELETE ROWS'
            )
            with cur.copy(f"COPY {self._STAGE} ({columns}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(tuple(row[c] for c in self._COLUMNS))
        stage = sa.table(self._STAGE, *(sa.column(c) for c in self._COLUMNS))
        target = [self.metrics.c[c] for c in self._COLUMNS]
        conn.execute(self._insert(self.metrics).from_select(target, sa.select(*stage.c)).on_conflict_do_nothing())
        return True

    def close(self) -> None:
        self.engine.dispose()


class MlflowMetricStore:
    """MLflow's client `log_batch`, for `http(s)://` stores and databases the bulk path lacks."""

    def __init__(self, uri: str) -> None:
        from mlflow import MlflowClient

        self.client = MlflowClient(tracking_uri=uri)

    def write(self, run_id: str, points: Sequence[Point]) -> None:
        from mlflow.entities import Metric

        metrics = [Metric(p.key, p.value, p.timestamp, p.step) for p in points]
        for start in range(0, len(metrics), LOG_BATCH_LIMIT):
            self.client.log_batch(run_id, metrics=metrics[start : start + LOG_BATCH_LIMIT], synchronous=True)

    def close(self) -> None:
        pass


def open_metric_store(uri: str) -> MetricStore:
    """The fastest store that MLflow reads back as its own for this URI."""
    if is_database_uri(uri) and uri.split(":", 1)[0].split("+")[0] in ("sqlite", "postgresql", "postgres"):
        return SqlMetricStore(uri)
    return MlflowMetricStore(uri)
