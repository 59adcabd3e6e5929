"""The test PostgreSQL server (127.0.0.1:5432, user postgres, trust auth; RADT_TEST_PG to change it).

One database with MLflow's schema (the template) serves the whole test run, every xdist worker: made
once under an advisory lock. A test's store is a clone of it. Cloning takes a second and dropping a
database several (PostgreSQL checkpoints on DROP DATABASE), so a test's database is not dropped: when
the test ends it is emptied back to the template's rows and renamed (a process the test left behind
cannot reach it under the old name) and the next test gets it. The test run's databases are dropped
together, once, when the run ends.
"""

from __future__ import annotations

import json
import os
import time
import uuid
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import sqlalchemy as sa

PG_ADMIN = os.environ.get("RADT_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
# the process that runs the whole test run: the xdist controller (a worker's parent), or this process without xdist
RUN = os.getppid() if os.environ.get("PYTEST_XDIST_WORKER") else os.getpid()
RUN_PREFIX = f"radt_{RUN}_"  # every database of this test run
TEMPLATE_DB = f"{RUN_PREFIX}template"
SHARED_PREFIX = f"{RUN_PREFIX}shared_"  # stores filled once and read by every worker
TEST_PREFIX = f"{RUN_PREFIX}test_"  # a test's own store


def pg_url(database: str) -> str:
    return PG_ADMIN.rsplit("/", 1)[0] + "/" + database


def address(uri: str) -> tuple[str, int, str]:
    """(host, port, database) of a postgresql:// URI."""
    rest = uri.split("@", 1)[1]
    hostport, database = rest.split("/", 1)
    host, port = hostport.split(":")
    return host, int(port), database


def through(uri: str, port: int, host: str = "127.0.0.1") -> str:
    """The same database and user, reached at host:port (a proxy in front of the server)."""
    user = uri.split("://", 1)[1].split("@", 1)[0]
    return f"postgresql://{user}@{host}:{port}/{address(uri)[2]}"


@contextmanager
def read_only_user(uri: str, name: str) -> Iterator[str]:
    """The store's URI as a database user `radt_reader_<name>` who may read every table and create none (a shared
    deployment's read-only dashboard user); the user is dropped afterwards."""
    role = f"radt_reader_{name}"
    admin = sa.create_engine(uri, poolclass=sa.pool.NullPool)
    with admin.begin() as conn:
        conn.execute(sa.text(f'CREATE ROLE "{role}" LOGIN'))
        conn.execute(sa.text(f'GRANT SELECT ON ALL TABLES IN SCHEMA public TO "{role}"'))
        conn.execute(sa.text(f'REVOKE CREATE ON SCHEMA public FROM "{role}", PUBLIC'))
    try:
        yield uri.replace("postgres@", f"{role}@", 1)
    finally:
        with admin.begin() as conn:
            conn.execute(sa.text(f'DROP OWNED BY "{role}"'))
            conn.execute(sa.text(f'DROP ROLE "{role}"'))
        admin.dispose()


def admin_engine() -> sa.Engine:
    return sa.create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool, connect_args={"connect_timeout": 3})


def unreachable() -> str | None:
    """Why the server cannot be used, or None."""
    try:
        engine = admin_engine()
        with engine.connect() as conn:
            conn.execute(sa.text("select 1"))
        engine.dispose()
    except Exception as exc:
        return str(exc)
    return None


def init_mlflow_schema(uri: str, artifacts: Path) -> None:
    """MLflow's own migrations on an empty database (seconds: done once per test run)."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    store = SqlAlchemyStore(uri, artifacts.as_uri())
    store.engine.dispose()


def _add_radt_tables(uri: str) -> None:
    """radt's own tables (rollups, stored summaries, imported jobs), which radt's writer and dashboard add to any store they touch: a
    clone of the template has the shape of a store written by radt (tests/support/snapshots.py loads such a store's rows into it)."""
    from radt import jobtable, rollups, summarytable

    engine = sa.create_engine(uri, poolclass=sa.pool.NullPool)
    rollups.ensure_table(engine)
    summarytable.ensure_table(engine)
    jobtable.ensure_table(engine)
    engine.dispose()


def ensure_template(artifacts: Path) -> str:
    """The test run's template database, made by the first process that asks (the others wait for it)."""
    engine = admin_engine()
    lock = zlib.crc32(TEMPLATE_DB.encode())
    with engine.connect() as conn:
        conn.execute(sa.text("select pg_advisory_lock(:k)"), {"k": lock})
        try:
            exists = conn.execute(sa.text("select 1 from pg_database where datname = :n"), {"n": TEMPLATE_DB}).first()
            if not exists:
                conn.execute(sa.text(f'CREATE DATABASE "{TEMPLATE_DB}"'))
                try:
                    init_mlflow_schema(pg_url(TEMPLATE_DB), artifacts)
                    _add_radt_tables(pg_url(TEMPLATE_DB))
                except BaseException:
                    conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{TEMPLATE_DB}" WITH (FORCE)'))
                    raise
        finally:
            conn.execute(sa.text("select pg_advisory_unlock(:k)"), {"k": lock})
    engine.dispose()
    return TEMPLATE_DB


def new_database(template: str, prefix: str = TEST_PREFIX) -> str:
    name = f"{prefix}{uuid.uuid4().hex[:12]}"
    engine = admin_engine()
    with engine.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}" TEMPLATE "{template}"'))
    engine.dispose()
    return name


def drop_databases(names) -> None:
    """DROP DATABASE each, side by side: PostgreSQL checkpoints once for drops that wait together."""
    names = list(names)

    def drop(name: str) -> None:
        engine = admin_engine()
        with engine.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        engine.dispose()

    with ThreadPoolExecutor(max_workers=max(1, min(16, len(names)))) as pool:
        list(pool.map(drop, names))


def drop_run_databases() -> None:
    """Every database of this test run (the controller's last step; the workers have ended)."""
    engine = admin_engine()
    with engine.connect() as conn:
        names = conn.execute(sa.text("SELECT datname FROM pg_database WHERE starts_with(datname, :p)"), {"p": RUN_PREFIX}).scalars().all()
    engine.dispose()
    drop_databases(names)


# the shape of a store: its relations and the migration it is at; a test that changed it gets a fresh database next time
_SHAPE = (
    "SELECT coalesce(json_agg(json_build_array(c.relname, c.relkind) ORDER BY c.relname, c.relkind), '[]')::text"
    " || (SELECT coalesce(string_agg(version_num, ','), '') FROM alembic_version)"
    " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public'"
)


_ROWS: dict[str, tuple[str, str]] = {}  # database -> (its shape, the SQL that gives another database its rows)


def _rows_sql(database: str) -> tuple[str, str]:
    """Read once what `database` holds: its shape, its rows, its sequences; as one script that empties another
    database of the same shape and fills it with them."""
    if database in _ROWS:
        return _ROWS[database]
    engine = sa.create_engine(pg_url(database), poolclass=sa.pool.NullPool)
    with engine.connect() as conn:
        shape = conn.execute(sa.text(_SHAPE)).scalar_one()
        tables = conn.execute(sa.text("SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND tablename <> 'alembic_version'")).scalars().all()
        statements = ["SET LOCAL session_replication_role = replica"]  # no foreign-key triggers while the rows go and come back
        statements += [f'DELETE FROM "{table}"' for table in tables]
        for table in tables:
            rows = conn.execute(sa.text(f'SELECT json_agg(t) FROM "{table}" t')).scalar_one()
            if rows:
                literal = json.dumps(rows).replace("'", "''")
                statements.append(f'INSERT INTO "{table}" SELECT * FROM json_populate_recordset(NULL::"{table}", \'{literal}\')')
        for schema, sequence, last, called in conn.execute(
            sa.text("SELECT schemaname, sequencename, coalesce(last_value, start_value), last_value IS NOT NULL FROM pg_sequences")
        ):
            statements.append(f'SELECT setval(\'"{schema}"."{sequence}"\', {int(last)}, {"true" if called else "false"})')
    engine.dispose()
    _ROWS[database] = shape, ";\n".join(statements)
    return _ROWS[database]


def load_rows(name: str, source: str) -> None:
    """Make database `name` hold exactly the rows (and sequence values) of `source`, a database of the same shape."""
    shape, script = _rows_sql(source)
    engine = sa.create_engine(pg_url(name), poolclass=sa.pool.NullPool)
    try:
        with engine.begin() as conn:
            if conn.execute(sa.text(_SHAPE)).scalar_one() != shape:
                raise RuntimeError(f"{name} is not shaped like {source}")
            with conn.connection.dbapi_connection.cursor() as cursor:
                cursor.execute(script)  # one round trip, no parameters (its % signs are the rows' own)
    finally:
        engine.dispose()


def end_sessions(name: str) -> None:
    """End every session on database `name` (so that it can serve as a template)."""
    engine = admin_engine()
    with engine.connect() as conn:
        conn.execute(sa.text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :n AND pid <> pg_backend_pid()"), {"n": name})
    engine.dispose()


class DatabasePool:
    """A test process's clones of the template: a test takes one, gives it back emptied to the template's rows."""

    def __init__(self, template: str) -> None:
        self.template = template
        self.free: list[str] = []
        self.made: list[str] = []

    def take(self) -> str:
        if self.free:
            return self.free.pop()
        name = new_database(self.template)
        self.made.append(name)
        return name

    def give_back(self, name: str) -> None:
        """Empty `name` to the template's rows under a new name, for the next test; a database that will not, is dropped."""
        fresh = f"{TEST_PREFIX}{uuid.uuid4().hex[:12]}"
        try:
            admin = admin_engine()
            with admin.connect() as conn:
                # end every session on it (a pool the test did not dispose, a process it left behind); then rename, which
                # PostgreSQL refuses while a session remains
                for _ in range(100):
                    conn.execute(sa.text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :n AND pid <> pg_backend_pid()"), {"n": name})
                    try:
                        conn.execute(sa.text(f'ALTER DATABASE "{name}" RENAME TO "{fresh}"'))
                        break
                    except sa.exc.OperationalError:  # a session still ending
                        time.sleep(0.02)
                else:
                    raise RuntimeError(f"sessions on {name} would not end")
            admin.dispose()
            self.made[self.made.index(name)] = fresh
            load_rows(fresh, self.template)
        except Exception:
            gone = fresh if fresh in self.made else name
            self.made.remove(gone)
            drop_databases([gone])
            return
        self.free.append(fresh)

    def close(self) -> None:
        drop_databases(self.made)
        self.made, self.free = [], []
