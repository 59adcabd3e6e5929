"""Where metric points go: MLflow's own tables directly (database URIs) or MLflow's client (servers).

The SQL path writes the same rows MLflow's `log_batch` would, `latest_metrics` included, and folds the batch
into radt's rollups in the same transaction (radt/rollups.py), with
radt's copies of MLflow's table definitions (radt/mlflowdb.py, no MLflow import), in one multi-row statement per batch: about ten times the
points per second of `log_batch`. Both paths are idempotent, so a replayed spool is harmless.

Every call has a deadline (settings.STORE_TIMEOUT): PostgreSQL's statement_timeout, connect_timeout
and TCP keepalives, SQLite's busy timeout, the MLflow client's HTTP timeout. The writer also waits
for a call from another thread (writer.call_with_deadline) and `reset()`s the store after one that
overran, since a partitioned network can leave a socket waiting with no timeout firing.
"""

from __future__ import annotations

import logging
import math
import operator
import re
from collections.abc import Mapping, Sequence
from typing import Protocol

import sqlalchemy as sa

from radt import mlflowdb, rollups, summarytable
from radt.collectors.store.sqltracking import known_difference, make_engine
from radt.points import Point
from radt.settings import is_database_uri

MAX_FLOAT = mlflowdb.MAX_FLOAT
LOG_BATCH_LIMIT = 1000  # MLflow's limit of metrics per log_batch call
COUNT_FROM = 100  # points in a batch from which the insert counts new rows in a savepoint instead of RETURNING them


class MetricStore(Protocol):
    batch_points: int  # points per write() call the writer sends when it has more queued (catching up, replaying a spool)

    def write(self, run_id: str, points: Sequence[Point]) -> None: ...

    def write_runs(self, batches: Mapping[str, Sequence[Point]]) -> None: ...

    def close(self) -> None: ...

    def reset(self) -> None:
        """Drop connections that may be stuck (a call overran its deadline); the next write opens fresh ones."""


class StoreUnavailable(ConnectionError):
    """The store refused or failed a write; the message is one line for the user."""


class StoreNotAnswering(StoreUnavailable):
    """The store took the request and sent no reply in time (a frozen or overloaded `mlflow server`): not answering,
    as the writer's own deadline says, rather than unreachable."""


def sanitize(value: float) -> tuple[float, bool]:
    """MLflow's rule: NaN is stored as 0 with is_nan, infinities as the largest finite float."""
    if math.isnan(value):
        return 0.0, True
    if math.isinf(value):
        return (MAX_FLOAT if value > 0 else -MAX_FLOAT), False
    return value, False


def _primary_key(row) -> tuple:
    """MLflow's primary key of a metrics row (value as stored: NaN as 0 with is_nan)."""
    return (row["key"], row["timestamp"], row["step"], float(row["value"]), bool(row["is_nan"]), row["run_uuid"])


class SqlMetricStore:
    """Bulk insert into MLflow's `metrics` and conditional upsert of `latest_metrics`."""

    # a call's fixed cost (lock, reads, the rollups' merge of the buckets a batch continues) is ~20 % of a 1,000-point
    # call and under 10 % from 5,000 (bench/ingest.py); 10,000 points take ~0.3 s, far inside STORE_TIMEOUT
    batch_points = 10_000

    def __init__(self, uri: str, *, fold_rollups: bool = True) -> None:
        self.uri = uri
        self.engine = make_engine(uri)
        self.fold_rollups = fold_rollups  # False: MLflow's rows only (bench/ingest.py's baseline)
        self.metrics = mlflowdb.metrics
        self.latest = mlflowdb.latest_metrics
        insert = mlflowdb.dialect_insert(self.engine.dialect.name, "radt's bulk metric writes")
        self._tables = False  # radt's rollup tables checked (made on the first write: opening never connects)
        # the statements, built once: building and keying them cost a live writer's call more than running them
        upsert = insert(self.latest)
        current, excluded = self.latest.c, upsert.excluded
        self._latest_upsert = upsert.on_conflict_do_update(
            index_elements=[current.key, current.run_uuid],
            set_={"value": excluded.value, "timestamp": excluded.timestamp, "step": excluded.step, "is_nan": excluded.is_nan},
            where=sa.tuple_(current.step, current.timestamp, current.value) < sa.tuple_(excluded.step, excluded.timestamp, excluded.value),
        )
        m = self.metrics.c
        stage = sa.table(self._STAGE, *(sa.column(c) for c in self._COLUMNS))
        self._staged_insert = insert(self.metrics).from_select([m[c] for c in self._COLUMNS], sa.select(*stage.c)).on_conflict_do_nothing()
        self._param_insert = insert(self.metrics).on_conflict_do_nothing()
        returned = (m.key, m.value, m.timestamp, m.step, m.is_nan)
        self._staged_counted = self._staged_insert.execution_options(preserve_rowcount=True)  # else -1 for an INSERT
        self._staged_returning = self._staged_insert.returning(*returned)
        self._param_returning = self._param_insert.returning(*returned)

    def write(self, run_id: str, points: Sequence[Point]) -> None:
        self.write_runs({run_id: points})

    def write_runs(self, batches: Mapping[str, Sequence[Point]]) -> None:
        """Several runs' points in one transaction: an import of many short jobs pays one commit and one lock round for a
        batch of runs, not one per run (each run's rows, latest values and rollups as `write` makes them)."""
        batches = {run_id: points for run_id, points in batches.items() if points}
        if not batches:
            return
        if self.fold_rollups and not self._tables:
            rollups.ensure_table(self.engine)
            self._tables = True
        with self.engine.begin() as conn:
            if self.fold_rollups:
                rollups.lock_runs(conn, list(batches))  # PostgreSQL; SQLite's write lock is the first insert
            for run_id in sorted(batches):  # sorted: concurrent writers lock rows in one order (no deadlock)
                self._write_in(conn, run_id, batches[run_id])

    def _write_in(self, conn: sa.Connection, run_id: str, points: Sequence[Point]) -> None:
        """One run's points, its latest values, rollups and stale summary, in the caller's transaction."""
        rows = {}
        newest: dict[str, dict] = {}
        for p in points:
            value, is_nan = sanitize(p.value)
            row = {"key": p.key, "value": value, "timestamp": p.timestamp, "step": p.step, "is_nan": is_nan, "run_uuid": run_id}
            rows[(p.key, p.timestamp, p.step, value, is_nan)] = row
            best = newest.get(p.key)
            if best is None or (p.step, p.timestamp, value) > (best["step"], best["timestamp"], best["value"]):
                newest[p.key] = row
        upsert = self._latest_upsert
        latest = [newest[k] for k in sorted(newest)]  # sorted keys: concurrent writers lock latest_metrics rows in one order (no deadlock)
        if not self.fold_rollups:
            self._insert_metrics(conn, list(rows.values()), returning=False)
            conn.execute(upsert, latest)
            summarytable.invalidate(conn, run_id)
            return
        # only the points the store did not hold go into the rollups: a batch sent twice (a spool replayed
        # after a write whose answer was lost) is stored once and counted once
        new = self._insert_metrics(conn, list(rows.values()), returning=True)
        before, covered = rollups.latest_and_covered(conn, run_id, sorted(newest))
        conn.execute(upsert, latest)
        after = dict(before)
        for key, row in newest.items():
            mine = (row["step"], row["timestamp"], row["value"], row["is_nan"])
            if key not in before or mine[:3] > before[key][:3]:  # the upsert's rule
                after[key] = mine
        rollups.fold_batch(conn, run_id, new, before, after, covered)
        summarytable.invalidate(conn, run_id)  # any point radt adds drops the run's stored summary (radt_summaries)

    def _insert_metrics(self, conn: sa.Connection, rows: list[dict], returning: bool) -> rollups.Stored | None:
        """Insert the rows MLflow's `metrics` does not hold yet; with `returning`, those inserted, as rollups.Stored."""
        if self._copy_metrics(conn, rows):
            stmt = self._staged_insert
            if not returning:
                conn.execute(stmt)
                return None
            if len(rows) < COUNT_FROM:  # RETURNING a few rows costs less than the savepoint's two round trips
                return rollups.Stored.of_rows(conn.execute(self._staged_returning).all())
            # nearly always every row is new: counted, not sent back (RETURNING 20,000 rows cost a fifth of the
            # insert); a replayed batch the store partly held is inserted again, returning what it adds
            with conn.begin_nested() as savepoint:
                added = conn.execute(self._staged_counted).rowcount
                if added == len(rows):
                    return rollups.Stored.of_dicts(rows)
                savepoint.rollback()
            return rollups.Stored.of_rows(conn.execute(self._staged_returning).all())
        stmt = self._param_insert
        if returning and rows is not None and not conn.dialect.insert_returning:  # SQLite before 3.35
            held = self._held(conn, rows)
            conn.execute(stmt, rows)
            return rollups.Stored.of_dicts([r for r in rows if _primary_key(r) not in held])
        result = conn.execute(self._param_returning if returning else stmt, rows)
        return rollups.Stored.of_rows(result.all()) if returning else None

    def _held(self, conn: sa.Connection, rows: list[dict]) -> set[tuple]:
        """Primary keys of these rows (one run) that the store already holds: for a SQLite without RETURNING."""
        m = self.metrics.c
        keys = sorted({r["key"] for r in rows})
        stamps = [r["timestamp"] for r in rows]
        query = sa.select(m.key, m.timestamp, m.step, m.value, m.is_nan, m.run_uuid).where(
            m.run_uuid == rows[0]["run_uuid"], m.key.in_(keys), m.timestamp.between(min(stamps), max(stamps))
        )
        return {_primary_key(dict(r._mapping)) for r in conn.execute(query)}

    # COPY into a session-local staging table, then one INSERT ... SELECT ... ON CONFLICT DO NOTHING:
    # psycopg 3 sends a multi-row insert as one statement per row, about half this speed.
    _STAGE = "radt_points_stage"
    _COLUMNS = ("key", "value", "timestamp", "step", "is_nan", "run_uuid")
    _IN_COLUMNS = operator.itemgetter(*_COLUMNS)
    _COPY_TYPES = ["varchar", "float8", "int8", "int8", "bool", "varchar"]

    def _copy_metrics(self, conn: sa.Connection, rows) -> bool:
        """Bulk-load rows into the staging table with PostgreSQL's COPY (psycopg 3); False where that path is not available."""
        if self.engine.dialect.name != "postgresql" or self.engine.dialect.driver != "psycopg":
            return False
        raw = conn.connection.driver_connection
        columns = ", ".join(f'"{c}"' for c in self._COLUMNS)
        with raw.cursor() as cur:
            ddl = (
                f"CREATE TEMP TABLE IF NOT EXISTS {self._STAGE} (key varchar(250), value double precision, "
                '"timestamp" bigint, step bigint, is_nan boolean, run_uuid varchar(32)) ON COMMIT DELETE ROWS'
            )
            transaction = conn.get_transaction()
            if conn.info.get(self._STAGE) is transaction:  # an earlier run of this transaction (write_runs) staged its rows
                cur.execute(f"TRUNCATE {self._STAGE}")
            elif self.fold_rollups and self._tables:  # with rollups, their staging table in the same round trip
                cur.execute(f"{ddl}; {rollups.STAGE_DDL}")
                rollups.staged(conn)
            else:
                cur.execute(ddl)
            conn.info[self._STAGE] = transaction  # ON COMMIT DELETE ROWS empties it when this transaction ends
            with cur.copy(f"COPY {self._STAGE} ({columns}) FROM STDIN (FORMAT BINARY)") as copy:
                copy.set_types(self._COPY_TYPES)  # binary: a third of text's client CPU per row
                for row in map(self._IN_COLUMNS, rows):
                    copy.write_row(row)
        return True

    def close(self) -> None:
        self.engine.dispose()

    def reset(self) -> None:
        # a connection stuck in a call stays with the thread that waits on it; new calls get a new pool
        self.engine = make_engine(self.uri)


def quiet_http_logs() -> None:
    """radt's process only: urllib3's retry warnings and MLflow's request logs would print a stack per
    failed call; the writer says the server is unreachable in one line instead."""
    for name in ("urllib3", "mlflow.utils.rest_utils", "mlflow.utils.request_utils"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


_CAUSE = re.compile(
    r"\[Errno -?\d+\] [^'\")\]]+|Connection (?:refused|aborted|reset by peer|broken)|Read timed out|RemoteDisconnected|Remote end closed connection"
)


def http_store_error(uri: str, exc: Exception) -> StoreUnavailable:
    """One line instead of a page of urllib3: 'mlflow server http://h:p unreachable ([Errno 111] Connection refused)',
    or StoreNotAnswering's '... sent no reply (Read timed out)' for a server that took the request."""
    text = str(exc)
    found = _CAUSE.search(text)
    if found and found.group(0) == "Read timed out":
        return StoreNotAnswering(f"mlflow server {uri} sent no reply (Read timed out)")
    if found:
        return StoreUnavailable(f"mlflow server {uri} unreachable ({found.group(0).strip()})")
    first = text.strip().splitlines()[0][:200] if text.strip() else type(exc).__name__
    return StoreUnavailable(f"mlflow server {uri}: {first}")


class MlflowMetricStore:
    """MLflow's client `log_batch`, for `http(s)://` stores and databases the bulk path lacks."""

    batch_points = 2000  # under a second even through a busy `mlflow server` (3k points/s), well inside the deadline

    def __init__(self, uri: str) -> None:
        from mlflow import MlflowClient

        from radt.collectors.store.tracking import _limit_http_retries

        _limit_http_retries()  # RADT_STORE_TIMEOUT and RADT_HTTP_RETRIES for radt's own client (as connect() does)
        quiet_http_logs()
        self.uri = uri
        self.client = MlflowClient(tracking_uri=uri)

    def write(self, run_id: str, points: Sequence[Point]) -> None:
        from mlflow.entities import Metric
        from mlflow.exceptions import MlflowException

        metrics = [Metric(p.key, p.value, p.timestamp, p.step) for p in points]
        for start in range(0, len(metrics), LOG_BATCH_LIMIT):
            try:
                self.client.log_batch(run_id, metrics=metrics[start : start + LOG_BATCH_LIMIT], synchronous=True)
            except (MlflowException, OSError) as exc:
                if not self.uri.startswith(("http://", "https://")):
                    raise
                raise http_store_error(self.uri, exc) from exc

    def write_runs(self, batches: Mapping[str, Sequence[Point]]) -> None:
        """Several runs' points: a run at a time (MLflow's log_batch takes one run)."""
        for run_id, points in batches.items():
            if points:
                self.write(run_id, points)

    def close(self) -> None:
        pass

    def reset(self) -> None:
        from mlflow import MlflowClient

        self.client = MlflowClient(tracking_uri=self.uri)


def open_metric_store(uri: str) -> MetricStore:
    """The fastest store that MLflow reads back as its own for this URI (MLflow's client where tracking.connect()
    found the store's tables unlike radt's)."""
    if is_database_uri(uri) and uri.split(":", 1)[0].split("+")[0] in ("sqlite", "postgresql", "postgres") and not known_difference(uri):
        return SqlMetricStore(uri)
    return MlflowMetricStore(uri)


def stored_points(uri: str, run_id: str, node: str | None = None) -> int:
    """The run's system points (a node's part: its own) in the store: what its radt wrote before it died and
    what sync sent since, each once (a SIGKILLed radt never wrote its count, and a spooled batch may be in twice)."""
    prefix = f"system/{node}/" if node else "system/"
    store = open_metric_store(uri)
    try:
        if isinstance(store, SqlMetricStore):
            metrics = store.metrics
            like = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            count = sa.select(sa.func.count()).select_from(metrics).where(metrics.c.run_uuid == run_id, metrics.c.key.like(like, escape="\\"))
            with store.engine.connect() as conn:
                return conn.execute(count).scalar_one()
        client = store.client  # an mlflow server: each of the run's system keys' history
        keys = [key for key in client.get_run(run_id).data.metrics if key.startswith(prefix)]
        return sum(len(client.get_metric_history(run_id, key)) for key in keys)
    finally:
        store.close()
