"""MLflow's tracking calls that radt makes, as SQL on MLflow's own tables: a run starts and ends without
importing MLflow (five seconds of a two-core machine, per run).

`SqlTracking` answers the `MlflowClient` methods radt's callers use (experiments, runs, tags, params,
status, the searches of a workload's runs, artifacts in a local folder) and writes the rows MLflow's
`SqlAlchemyStore` writes for the same call: ids, the run's name and `mlflow.runName` tag, its artifact
URI, times, limits. `open_sql_tracking()` hands it out only for a SQLite or PostgreSQL store whose tables are
the ones radt/mlflowdb.py describes (a revision known good, or any other whose tables are found the same);
tracking.connect() sends every other store through MLflow.
"""

from __future__ import annotations

import contextlib
import math
import os
import posixpath
import re
import shutil
import tempfile
import time
import urllib.parse
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

import sqlalchemy as sa

from radt import artifacts, settings
from radt import mlflowdb as db
from radt.runmodel import RUN_NAME_TAG, USER_TAG
from radt.settings import artifact_root

DIALECTS = ("sqlite", "postgresql")  # the dialects whose upsert this module uses


class TrackingError(RuntimeError):
    """A call MLflow would refuse too: no such run or experiment, a deleted one, a bad key, a taken name."""


class NotFound(TrackingError):
    """No such run or experiment."""


class AlreadyExists(TrackingError):
    """An experiment of that name exists."""


class SchemaMismatch(RuntimeError):
    """The store's schema is not one radt's tables describe; `revision` is the store's (None: no MLflow tables),
    `difference` what differs in radt's tables (None: not inspected, the revision decides)."""

    def __init__(self, revision: str | None, difference: str | None = None) -> None:
        super().__init__(f"MLflow schema revision {revision or 'none'}: {difference or 'radt does not write it'}")
        self.revision = revision
        self.difference = difference


class KeyValue(NamedTuple):
    """A param or tag, as MlflowClient.log_batch takes them (mlflow.entities.Param and RunTag have these fields)."""

    key: str
    value: str


@dataclass
class RunInfo:
    run_id: str
    run_name: str | None
    experiment_id: str
    user_id: str | None
    status: str
    start_time: int | None
    end_time: int | None
    lifecycle_stage: str
    artifact_uri: str | None

    @property
    def run_uuid(self) -> str:
        return self.run_id


@dataclass
class RunData:
    tags: dict[str, str] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class Run:
    info: RunInfo
    data: RunData


@dataclass
class Experiment:
    experiment_id: str
    name: str
    artifact_location: str | None
    lifecycle_stage: str
    tags: dict[str, str]
    creation_time: int | None
    last_update_time: int | None


# --- engines --------------------------------------------------------------------------------------


def make_engine(uri: str) -> sa.Engine:
    """An engine that survives a database restart (pre-ping) and never waits past settings.STORE_TIMEOUT.

    SQLite waits that long on a lock; PostgreSQL ends a statement after it (statement_timeout), gives
    up connecting after it, and TCP keepalives/tcp_user_timeout end a connection whose peer vanished."""
    timeout = settings.STORE_TIMEOUT.get()
    if uri.startswith("postgres://"):
        uri = "postgresql://" + uri[len("postgres://") :]
    if uri.startswith("sqlite"):
        engine = sa.create_engine(uri, connect_args={"timeout": timeout})

        @sa.event.listens_for(engine, "connect")
        def _wal(dbapi_connection, _record):  # readers (the dashboard) never block the writer
            try:  # a no-op once the file is in WAL mode; radt switches it before the script starts
                dbapi_connection.execute("PRAGMA journal_mode=WAL")
            except Exception:  # locked by a writer right now: the mode is switched on a later connect
                pass

        return engine
    if not uri.startswith("postgresql"):  # MySQL, SQL Server: the driver's own connect timeout; the writer's deadline does the rest
        return sa.create_engine(uri, pool_pre_ping=True, pool_size=2, max_overflow=2, connect_args={"connect_timeout": math.ceil(timeout)})
    engine = sa.create_engine(uri, pool_pre_ping=True, pool_size=2, max_overflow=2, connect_args=pg_deadlines(timeout))

    @sa.event.listens_for(engine, "connect")
    def _statement_timeout(dbapi_connection, _record):  # a SET, not libpq's `options`, which PgBouncer refuses
        with dbapi_connection.cursor() as cursor:
            cursor.execute(f"SET statement_timeout = {max(1, int(timeout * 1000))}")
        dbapi_connection.commit()

    return engine


def pg_deadlines(timeout: float) -> dict:
    """libpq settings so that connecting, and a connection whose peer vanished, never wait much past `timeout` seconds."""
    return {
        "connect_timeout": max(2, math.ceil(timeout)),  # libpq's minimum is 2 s
        "keepalives": 1,
        "keepalives_idle": max(1, math.ceil(timeout)),
        "keepalives_interval": 1,
        "keepalives_count": 3,
        "tcp_user_timeout": max(1, int(timeout * 1000)),  # sent data not acknowledged within this: the connection is dead
    }


def store_revision(engine: sa.Engine) -> str | None:
    """The store's MLflow schema revision (alembic_version); None for a database without MLflow's tables. Raises if unreachable."""
    with engine.connect() as conn:
        if not sa.inspect(conn).has_table("alembic_version"):
            return None
        return conn.execute(sa.select(db.alembic_version.c.version_num)).scalar()


# store URL -> (its revision, what differs in radt's tables or None) as last found: one inspection per store per process
_INSPECTED: dict[str, tuple[str, str | None]] = {}


def _store_key(url: sa.URL) -> str:
    return url.render_as_string(hide_password=False)


def schema_difference(engine: sa.Engine, revision: str) -> str | None:
    """What differs between the store's tables and radt's (None: radt's rows fit); a revision in KNOWN_GOOD is not inspected."""
    key = _store_key(engine.url)
    if revision in db.KNOWN_GOOD:
        _INSPECTED[key] = (revision, None)
    elif _INSPECTED.get(key, ("", None))[0] != revision:
        with engine.connect() as conn:
            _INSPECTED[key] = (revision, db.schema_difference(conn))
    return _INSPECTED[key][1]


def known_difference(uri: str) -> str | None:
    """What this process last found different in the store at `uri` (None: nothing, or not looked at), without connecting."""
    if uri.startswith("postgres://"):
        uri = "postgresql://" + uri[len("postgres://") :]
    return _INSPECTED.get(_store_key(sa.make_url(uri)), ("", None))[1]


def open_sql_tracking(uri: str, engine: sa.Engine) -> SqlTracking:
    """SqlTracking on `engine` when radt's tables fit the store (SchemaMismatch otherwise; any other error: unreachable).

    A store older than the installed MLflow is refused by revision alone (MLflow's client would refuse it too);
    a newer one, or one the installed MLflow writes, by what its tables hold."""
    revision = store_revision(engine)
    if engine.dialect.name not in DIALECTS or revision is None:
        raise SchemaMismatch(revision)
    head, known = db.schema_revisions()
    if revision in known and revision != head:
        raise SchemaMismatch(revision)
    difference = schema_difference(engine, revision)
    if difference:
        raise SchemaMismatch(revision, difference)
    return SqlTracking(uri, engine)


# --- MLflow's rules -------------------------------------------------------------------------------


def now_ms() -> int:
    return int(time.time() * 1000)


def path_not_unique(name: str) -> bool:
    norm = posixpath.normpath(name)
    return norm != str(name) or norm == "." or norm.startswith("..") or norm.startswith("/")


def check_key(key: str, what: str) -> str:
    """MLflow's rule for param and tag keys (mlflow/utils/validation.py)."""
    if key is None or not re.match(r"^[/\w.\- :]*$", key):
        raise TrackingError(f"invalid {what} key {key!r}: names may only contain alphanumerics, underscores, dashes, periods, spaces, colons and slashes")
    if path_not_unique(key):
        raise TrackingError(f"invalid {what} key {key!r}: it would resolve to {posixpath.normpath(key)!r} as a path")
    if len(key) > db.MAX_KEY_LENGTH:
        raise TrackingError(f"{what} key {key[:40]!r}... is longer than MLflow's {db.MAX_KEY_LENGTH} characters")
    return key


def append_to_uri_path(uri: str, *paths: str) -> str:
    """`paths` appended to the path of `uri`, as MLflow's mlflow.utils.uri.append_to_uri_path does."""
    path = ""
    for sub in paths:
        path = _join(path, sub)
    parsed = urllib.parse.urlparse(uri)
    if not parsed.scheme:
        return _join(uri, path)
    prefix = ""
    if not parsed.path.startswith("/"):
        prefix = parsed.scheme + ":"
        parsed = parsed._replace(scheme="")
    return prefix + urllib.parse.urlunparse(parsed._replace(path=_join(parsed.path, path)))


def _join(prefix: str, suffix: str) -> str:
    return suffix if not prefix else posixpath.join(prefix, suffix.lstrip("/"))


def local_artifact_dir(artifact_uri: str) -> str | None:
    """The folder of a `file:` (or scheme-less) artifact URI; None for any other (s3:, mlflow-artifacts:, ...)."""
    return artifacts.local_dir(artifact_uri)


# --- the client -----------------------------------------------------------------------------------


class SqlTracking:
    """The MlflowClient calls radt makes, on MLflow's tables through SQLAlchemy Core (bound parameters only)."""

    def __init__(self, uri: str, engine: sa.Engine) -> None:
        self.tracking_uri = uri
        self.engine = engine
        self._insert = db.dialect_insert(engine.dialect.name, "radt's SQL writes")

    def close(self) -> None:
        self.engine.dispose()

    # experiments ------------------------------------------------------------------------------

    def get_experiment(self, experiment_id: str) -> Experiment:
        with self.engine.connect() as conn:
            return self._experiment(conn, db.experiments.c.experiment_id == _experiment_int(experiment_id), experiment_id)

    def get_experiment_by_name(self, name: str) -> Experiment | None:
        with self.engine.connect() as conn:
            try:
                return self._experiment(conn, db.experiments.c.name == name, name)
            except NotFound:
                return None

    def _experiment(self, conn: sa.Connection, where, label: str) -> Experiment:
        row = conn.execute(sa.select(db.experiments).where(where)).mappings().first()
        if row is None:
            raise NotFound(f"no experiment {label!r} in the store")
        t = db.experiment_tags.c
        tags = dict(conn.execute(sa.select(t.key, t.value).where(t.experiment_id == row["experiment_id"])).all())
        return Experiment(
            str(row["experiment_id"]), row["name"], row["artifact_location"], row["lifecycle_stage"], tags, row["creation_time"], row["last_update_time"]
        )

    def create_experiment(self, name: str, artifact_location: str | None = None, tags: Mapping[str, str] | None = None) -> str:
        """A new active experiment; its artifacts in `artifact_location`, else RADT_HOME/artifacts/<id>."""
        if not name or len(name) > db.MAX_EXPERIMENT_NAME_LENGTH:
            raise TrackingError(f"invalid experiment name {name[:40]!r}: give 1 to {db.MAX_EXPERIMENT_NAME_LENGTH} characters")
        for key, value in (tags or {}).items():
            _check_experiment_tag(key, value)
        created = now_ms()
        row = {"name": name, "workspace": db.DEFAULT_WORKSPACE, "artifact_location": artifact_location, "lifecycle_stage": db.ACTIVE}
        row.update(creation_time=created, last_update_time=created)
        try:
            with self.engine.begin() as conn:
                experiment_id = conn.execute(sa.insert(db.experiments).values(**row)).inserted_primary_key[0]
                if not artifact_location:
                    location = append_to_uri_path(artifact_root().as_uri(), str(experiment_id))
                    conn.execute(sa.update(db.experiments).where(db.experiments.c.experiment_id == experiment_id).values(artifact_location=location))
                if tags:
                    conn.execute(sa.insert(db.experiment_tags), [{"experiment_id": experiment_id, "key": k, "value": str(v)} for k, v in tags.items()])
        except sa.exc.IntegrityError as exc:
            raise AlreadyExists(f"experiment {name!r} already exists") from exc
        return str(experiment_id)

    def set_experiment_tag(self, experiment_id: str, key: str, value) -> None:
        value = str(value)
        _check_experiment_tag(key, value)
        with self.engine.begin() as conn:
            self._active_experiment(conn, experiment_id)
            t = db.experiment_tags
            stmt = self._insert(t).values(experiment_id=_experiment_int(experiment_id), key=key, value=value)
            conn.execute(stmt.on_conflict_do_update(index_elements=[t.c.key, t.c.experiment_id], set_={"value": stmt.excluded.value}))

    def rename_experiment(self, experiment_id: str, new_name: str) -> None:
        with self.engine.begin() as conn:
            self._active_experiment(conn, experiment_id)
            self._update_experiment(conn, experiment_id, name=new_name, last_update_time=now_ms())

    def delete_experiment(self, experiment_id: str) -> None:
        """The experiment and all of its runs marked deleted (`mlflow gc` removes them for good)."""
        with self.engine.begin() as conn:
            self._active_experiment(conn, experiment_id)
            stamp = now_ms()
            self._update_experiment(conn, experiment_id, lifecycle_stage=db.DELETED, last_update_time=stamp)
            r = db.runs.c
            conn.execute(sa.update(db.runs).where(r.experiment_id == _experiment_int(experiment_id)).values(lifecycle_stage=db.DELETED, deleted_time=stamp))

    def restore_experiment(self, experiment_id: str) -> None:
        with self.engine.begin() as conn:
            if self._experiment(conn, db.experiments.c.experiment_id == _experiment_int(experiment_id), experiment_id).lifecycle_stage != db.DELETED:
                raise NotFound(f"no deleted experiment {experiment_id}")
            self._update_experiment(conn, experiment_id, lifecycle_stage=db.ACTIVE, last_update_time=now_ms())
            r = db.runs.c
            conn.execute(sa.update(db.runs).where(r.experiment_id == _experiment_int(experiment_id)).values(lifecycle_stage=db.ACTIVE, deleted_time=None))

    def _active_experiment(self, conn: sa.Connection, experiment_id: str) -> Experiment:
        experiment = self._experiment(conn, db.experiments.c.experiment_id == _experiment_int(experiment_id), experiment_id)
        if experiment.lifecycle_stage != db.ACTIVE:
            raise TrackingError(f"experiment {experiment_id} is {experiment.lifecycle_stage}; restore it in MLflow first")
        return experiment

    def _update_experiment(self, conn: sa.Connection, experiment_id: str, **values) -> None:
        conn.execute(sa.update(db.experiments).where(db.experiments.c.experiment_id == _experiment_int(experiment_id)).values(**values))

    # runs -------------------------------------------------------------------------------------

    def create_run(self, experiment_id: str, start_time: int | None = None, tags: Mapping[str, str] | None = None, run_name: str | None = None) -> Run:
        """A RUNNING run as MlflowClient.create_run makes it: its user from the mlflow.user tag, a random name when none is given."""
        with self.engine.begin() as conn:
            return self._create_run(conn, experiment_id, start_time, tags, run_name)

    def find_or_create_run(
        self, experiment_id: str, tags: Mapping[str, str], run_name: str | None = None, identity: Iterable[str] | None = None
    ) -> tuple[Run, bool]:
        """The first active run of the experiment with these tags (those named in `identity`, default all), or a new one with them: (run, created).

        One radt at a time per experiment (a row lock on the experiment on PostgreSQL, the write lock on
        SQLite), so radts started together on any number of hosts, whatever their clocks, find one run."""
        with self.engine.begin() as conn:
            e = db.experiments.c
            conn.execute(sa.update(db.experiments).where(e.experiment_id == _experiment_int(experiment_id)).values(last_update_time=e.last_update_time))
            keys = list(tags) if identity is None else list(identity)
            found = self._runs(conn, *self._where([experiment_id], {k: tags[k] for k in keys}))
            if found:
                return min(found, key=lambda run: (run.info.start_time or 0, run.info.run_id)), False
            return self._create_run(conn, experiment_id, None, tags, run_name), True

    def _create_run(self, conn: sa.Connection, experiment_id: str, start_time: int | None, tags: Mapping[str, str] | None, run_name: str | None) -> Run:
        tags = {k: str(v) for k, v in (tags or {}).items()}
        name_tag = tags.get(RUN_NAME_TAG)
        if run_name and name_tag and run_name != name_tag:
            raise TrackingError(f"run_name {run_name!r} and the mlflow.runName tag {name_tag!r} differ; give one of them")
        run_name = run_name or name_tag or db.random_run_name()
        tags.setdefault(RUN_NAME_TAG, run_name)
        run_id = uuid.uuid4().hex
        experiment = self._active_experiment(conn, experiment_id)
        row = {
            "run_uuid": run_id,
            "name": run_name,
            "source_type": "UNKNOWN",
            "source_name": "",
            "entry_point_name": "",
            "user_id": tags.get(USER_TAG, "unknown"),
            "status": "RUNNING",
            "start_time": start_time or now_ms(),
            "end_time": None,
            "deleted_time": None,
            "source_version": "",
            "lifecycle_stage": db.ACTIVE,
            "artifact_uri": append_to_uri_path(experiment.artifact_location or "", run_id, "artifacts"),
            "experiment_id": int(experiment.experiment_id),
        }
        conn.execute(sa.insert(db.runs).values(**row))
        conn.execute(sa.insert(db.tags), [{"run_uuid": run_id, "key": k, "value": _tag_value(v)} for k, v in tags.items()])
        return Run(_run_info(row), RunData(tags={k: _tag_value(v) for k, v in tags.items()}))

    def get_run(self, run_id: str) -> Run:
        with self.engine.connect() as conn:
            found = self._runs(conn, db.runs.c.run_uuid == run_id)
        if not found:
            raise NotFound(f"Run with id={run_id} not found")
        return found[0]

    def search_runs(self, experiment_ids: Iterable[str], filter_string: str = "", max_results: int = 1000) -> list[Run]:
        """MlflowClient.search_runs for the filters radt writes: `tags.`k` = 'v'` and `attributes.status = 'S'`, joined by `and`."""
        tags, status = parse_filter(filter_string)
        return self.find_runs(experiment_ids, tags=tags, status=status, max_results=max_results)

    def find_runs(self, experiment_ids: Iterable[str], tags: Mapping[str, str] | None = None, status: str | None = None, max_results: int = 1000) -> list[Run]:
        """Active runs of the experiments with these tag values (and status), newest first, as MLflow orders them."""
        with self.engine.connect() as conn:
            return self._runs(conn, *self._where(experiment_ids, tags, status), limit=max_results)

    @staticmethod
    def _where(experiment_ids: Iterable[str], tags: Mapping[str, str] | None = None, status: str | None = None) -> list:
        """Conditions for active runs of the experiments with these tag values (and status)."""
        r, t = db.runs.c, db.tags.c
        where = [r.experiment_id.in_([_experiment_int(e) for e in experiment_ids]), r.lifecycle_stage == db.ACTIVE]
        if status:
            where.append(r.status == status)
        for key, value in (tags or {}).items():
            where.append(sa.exists().where(t.run_uuid == r.run_uuid, t.key == key, t.value == value))
        return where

    def _runs(self, conn: sa.Connection, *where, limit: int | None = None) -> list[Run]:
        r = db.runs.c
        stmt = sa.select(db.runs).where(*where).order_by(r.start_time.desc(), r.run_uuid)
        rows = conn.execute(stmt.limit(limit) if limit else stmt).mappings().all()
        if not rows:
            return []
        found = {row["run_uuid"]: Run(_run_info(row), RunData()) for row in rows}
        ids = list(found)
        for table, attribute in ((db.tags, "tags"), (db.params, "params")):
            for run_id, key, value in conn.execute(sa.select(table.c.run_uuid, table.c.key, table.c.value).where(table.c.run_uuid.in_(ids))):
                getattr(found[run_id].data, attribute)[key] = value
        m = db.latest_metrics.c
        for run_id, key, value, is_nan in conn.execute(sa.select(m.run_uuid, m.key, m.value, m.is_nan).where(m.run_uuid.in_(ids))):
            found[run_id].data.metrics[key] = math.nan if is_nan else value
        for run in found.values():
            if not run.info.run_name:  # MLflow names a run without a name by its mlflow.runName tag
                run.info.run_name = run.data.tags.get(RUN_NAME_TAG)
        return list(found.values())

    def _active_run(self, conn: sa.Connection, run_id: str) -> dict:
        row = conn.execute(sa.select(db.runs).where(db.runs.c.run_uuid == run_id)).mappings().first()
        if row is None:
            raise NotFound(f"Run with id={run_id} not found")
        if row["lifecycle_stage"] != db.ACTIVE:
            raise TrackingError(f"The run {run_id} must be in the 'active' state. Current state is {row['lifecycle_stage']}.")
        return dict(row)

    def log_batch(self, run_id: str, params: Iterable = (), tags: Iterable = (), synchronous: bool | None = None) -> None:
        """Params (a key's first value stays; another value is refused, as MLflow does) and tags (the last value wins), in one transaction.

        Any number of each (MlflowClient splits a batch into MLflow's limit of 100 per call; one transaction here)."""
        params = [KeyValue(check_key(p.key, "param"), str(p.value)[: db.MAX_PARAM_VALUE_LENGTH]) for p in params]
        tags = {check_key(t.key, "tag"): _tag_value(t.value) for t in tags}
        if len({p.key for p in params}) != len(params):
            raise TrackingError("a batch holds one value per param key")
        with self.engine.begin() as conn:
            self._active_run(conn, run_id)
            if params:
                self._log_params(conn, run_id, params)
            if RUN_NAME_TAG in tags:
                conn.execute(sa.update(db.runs).where(db.runs.c.run_uuid == run_id).values(name=tags[RUN_NAME_TAG]))
            if tags:
                self._set_tags(conn, run_id, tags)

    def _log_params(self, conn: sa.Connection, run_id: str, params: list[KeyValue]) -> None:
        p = db.params.c
        existing = dict(conn.execute(sa.select(p.key, p.value).where(p.run_uuid == run_id, p.key.in_([k for k, _ in params]))).all())
        changed = [(k, existing[k], v) for k, v in params if k in existing and existing[k] != v]
        if changed:
            raise TrackingError(f"Changing param values is not allowed: {changed[:3]} for run {run_id}")
        new = [{"run_uuid": run_id, "key": k, "value": v} for k, v in params if k not in existing]
        if new:
            conn.execute(sa.insert(db.params), new)

    def _set_tags(self, conn: sa.Connection, run_id: str, tags: Mapping[str, str]) -> None:
        t = db.tags
        stmt = self._insert(t)
        stmt = stmt.on_conflict_do_update(index_elements=[t.c.key, t.c.run_uuid], set_={"value": stmt.excluded.value})
        conn.execute(stmt, [{"run_uuid": run_id, "key": k, "value": tags[k]} for k in sorted(tags)])  # one lock order for concurrent writers

    def set_tag(self, run_id: str, key: str, value, synchronous: bool | None = None) -> None:
        self.log_batch(run_id, tags=[KeyValue(key, str(value))])

    def delete_tag(self, run_id: str, key: str) -> None:
        """The tag removed, as MlflowClient.delete_tag does (a stale gap tag after a good import); NotFound if the run has none."""
        with self.engine.begin() as conn:
            self._active_run(conn, run_id)
            if conn.execute(sa.delete(db.tags).where(db.tags.c.run_uuid == run_id, db.tags.c.key == key)).rowcount == 0:
                raise NotFound(f"No tag with name: {key} in run with id {run_id}")

    def set_terminated(self, run_id: str, status: str | None = None, end_time: int | None = None) -> None:
        """The run's status (FINISHED by default) and end time (now by default)."""
        self._update_run(run_id, status=status or "FINISHED", end_time=end_time or now_ms())

    def update_run(self, run_id: str, status: str | None = None, name: str | None = None) -> None:
        """A new status and/or name; the end time stays (MlflowClient.update_run)."""
        if status is None and name is None:
            return
        values = {"status": status} if status else {}
        self._update_run(run_id, name=name, **values)

    def _update_run(self, run_id: str, name: str | None = None, **values) -> None:
        if values.get("status") not in (None, *db.RUN_STATUSES):
            raise TrackingError(f"unknown run status {values['status']!r}; one of {', '.join(db.RUN_STATUSES)}")
        with self.engine.begin() as conn:
            self._active_run(conn, run_id)
            if name:
                values["name"] = name
                self._set_tags(conn, run_id, {RUN_NAME_TAG: name})
            conn.execute(sa.update(db.runs).where(db.runs.c.run_uuid == run_id).values(**values))

    def delete_run(self, run_id: str) -> None:
        """Marked deleted, as MlflowClient.delete_run does (radt deletes only a run it has just created, which has no assessments)."""
        with self.engine.begin() as conn:
            if conn.execute(sa.update(db.runs).where(db.runs.c.run_uuid == run_id).values(lifecycle_stage=db.DELETED, deleted_time=now_ms())).rowcount == 0:
                raise NotFound(f"Run with id={run_id} not found")

    # artifacts --------------------------------------------------------------------------------

    def log_artifact(self, run_id: str, local_path: str, artifact_path: str | None = None) -> None:
        """A file (or a folder, under its own name) into the run's artifacts, as MLflow's LocalArtifactRepository copies it."""
        if os.path.isdir(local_path):
            name = os.path.basename(os.path.normpath(local_path))
            self.log_artifacts(run_id, local_path, posixpath.join(artifact_path, name) if artifact_path is not None else name)
            return
        root, remote = self._artifact_root(run_id)
        if root is None:
            remote.log_artifact(local_path, artifact_path)
            return
        folder = _artifact_folder(root, artifact_path)
        destination = os.path.join(folder, os.path.basename(local_path))
        try:
            if os.path.samefile(local_path, destination):
                return
        except FileNotFoundError:
            pass
        fd, staged = tempfile.mkstemp(dir=folder, prefix=".artifact.uploading.")
        try:
            with os.fdopen(fd, "wb") as out, open(local_path, "rb") as source:
                shutil.copyfileobj(source, out)
            shutil.copystat(local_path, staged)
            os.replace(staged, destination)  # readers never see half a file
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.remove(staged)
            raise

    def log_artifacts(self, run_id: str, local_dir: str, artifact_path: str | None = None) -> None:
        """Every file under `local_dir` into the run's artifacts (shutil.copy2 per file, as MLflow does)."""
        root, remote = self._artifact_root(run_id)
        if root is None:
            remote.log_artifacts(local_dir, artifact_path)
            return
        folder = _artifact_folder(root, artifact_path)
        for dirpath, dirnames, filenames in os.walk(local_dir):
            for name in dirnames:
                os.makedirs(os.path.join(folder, os.path.relpath(os.path.join(dirpath, name), local_dir)), exist_ok=True)
            for name in filenames:
                source = os.path.join(dirpath, name)
                shutil.copy2(source, os.path.join(folder, os.path.relpath(source, local_dir)))

    def log_text(self, run_id: str, text: str, artifact_file: str) -> None:
        norm = posixpath.normpath(artifact_file)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, posixpath.basename(norm))
            with open(path, "w", encoding="utf-8") as out:
                out.write(text)
            self.log_artifact(run_id, path, posixpath.dirname(norm) or None)

    def _artifact_root(self, run_id: str):
        """(local folder, None) for a file: artifact URI; (None, MLflow's repository) for any other, for this call only."""
        with self.engine.connect() as conn:
            uri = conn.execute(sa.select(db.runs.c.artifact_uri).where(db.runs.c.run_uuid == run_id)).scalar()
        if uri is None:
            raise NotFound(f"Run with id={run_id} not found")
        folder = local_artifact_dir(uri)
        if folder is not None:
            return folder, None
        # a host-less mlflow-artifacts: location (an mlflow server made the experiment) goes to the server RADT_ARTIFACT_URI names
        return None, artifacts.repository(uri, self.tracking_uri, artifacts.server_of(settings.ARTIFACT_URI.get()))


def _artifact_folder(root: str, artifact_path: str | None) -> str:
    if artifact_path and path_not_unique(artifact_path):
        raise TrackingError(f"invalid artifact path {artifact_path!r}: it would resolve to {posixpath.normpath(artifact_path)!r}")
    folder = os.path.join(root, os.path.normpath(artifact_path)) if artifact_path else root
    os.makedirs(folder, exist_ok=True)
    return folder


def _experiment_int(experiment_id) -> int:
    try:
        return int(experiment_id)
    except (TypeError, ValueError):
        raise NotFound(f"no experiment with id {experiment_id!r}") from None


def _tag_value(value) -> str | None:
    return None if value is None else str(value)[: db.MAX_TAG_VALUE_LENGTH]


def _check_experiment_tag(key: str, value: str) -> None:
    check_key(key, "experiment tag")
    if len(value) > db.MAX_EXPERIMENT_TAG_VALUE_LENGTH:
        raise TrackingError(f"experiment tag {key!r} is longer than MLflow's {db.MAX_EXPERIMENT_TAG_VALUE_LENGTH} characters")


def _run_info(row: Mapping) -> RunInfo:
    return RunInfo(
        run_id=row["run_uuid"],
        run_name=row["name"],
        experiment_id=str(row["experiment_id"]),
        user_id=row["user_id"],
        status=row["status"],
        start_time=row["start_time"],
        end_time=row["end_time"],
        lifecycle_stage=row["lifecycle_stage"],
        artifact_uri=row["artifact_uri"],
    )


# `tags.`radt.role` = 'workload'`, `tags.role = "it's"`, `attributes.status = 'RUNNING'`: a literal is the text between
# its quotes as it stands, as MLflow's filter parser (sqlparse) reads it (`\'`, `\\` and `''` do not end it; nothing is unescaped)
_CONDITION = re.compile(
    r"\s*(?:tags\.(?:`(?P<quoted>[^`]+)`|(?P<plain>[\w.\-/:]+))|(?:attributes?|attr|run)\.(?P<attr>status))\s*=\s*"
    r"(?:'(?P<single>(?:''|\\\\|\\'|[^'])*)'|\"(?P<double>(?:\"\"|\\\\|\\\"|[^\"])*)\")\s*",
    re.I,
)


def parse_filter(text: str) -> tuple[dict[str, str], str | None]:
    """The tag equalities and status of a search filter as radt writes them; ValueError for anything else."""
    tags: dict[str, str] = {}
    status = None
    rest = (text or "").strip()
    while rest:
        found = _CONDITION.match(rest)
        if not found:
            raise ValueError(f"radt's SQL path searches runs by tag and status equalities only, not {rest!r}")
        value = found["single"] if found["single"] is not None else found["double"]
        if found["attr"]:
            status = value
        else:
            tags[found["quoted"] or found["plain"]] = value
        rest = rest[found.end() :]
        joined = re.match(r"and\s+", rest, re.I)
        if rest and not joined:
            raise ValueError(f"radt's SQL path searches runs by tag and status equalities only, not {rest!r}")
        rest = rest[joined.end() :] if joined else rest
    return tags, status
