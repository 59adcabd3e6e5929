"""Shared fixtures: a fresh MLflow store per test on SQLite and on the real PostgreSQL, an isolated
RADT_HOME, the real tool logs, and a helper that runs the `radt` command as a user would.

PostgreSQL at 127.0.0.1:5432 (user postgres, trust auth) is required under CI (CI=true): there
an unreachable server fails the tests instead of skipping them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(os.environ.get("RADT_FIXTURES", REPO / "tests" / "fixtures" / "real-tool-logs"))  # a copy of shared/fixtures (see its README)
FAKE_BIN = REPO / "tests" / "fakes" / "bin"
FAKE_NVML_DIR = REPO / "tests" / "fakes" / "nvml_shadow"
PG_ADMIN = os.environ.get("RADT_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
TEMPLATE_DB = f"radt_tmpl_{os.getpid()}"
SHARED_PG_PREFIX = f"radt_shared_{os.getppid() if os.environ.get('PYTEST_XDIST_WORKER') else os.getpid()}_"  # one test run's shared stores


def _pg_url(database: str) -> str:
    return PG_ADMIN.rsplit("/", 1)[0] + "/" + database


def _pg_admin_engine() -> sa.Engine:
    return sa.create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 3})


def _init_mlflow_schema(uri: str, artifacts: Path) -> None:
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    store = SqlAlchemyStore(uri, artifacts.as_uri())
    store.engine.dispose()


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory) -> Path:
    """One SQLite file with MLflow's schema, copied for each test (migrations take seconds)."""
    root = tmp_path_factory.mktemp("sqlite-template")
    path = root / "mlflow.db"
    _init_mlflow_schema(f"sqlite:///{path}", root / "artifacts")
    return path


@pytest.fixture(scope="session")
def pg_template():
    """A PostgreSQL database with MLflow's schema, cloned per test with CREATE DATABASE ... TEMPLATE."""
    try:
        engine = _pg_admin_engine()
        with engine.connect() as conn:
            conn.execute(sa.text("select 1"))
    except Exception as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"PostgreSQL at {PG_ADMIN} is unreachable under CI: {exc}")
        pytest.skip(f"PostgreSQL unreachable ({exc}); start it with pg_ctlcluster")
    with engine.connect() as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{TEMPLATE_DB}"'))
        conn.execute(sa.text(f'CREATE DATABASE "{TEMPLATE_DB}"'))
    _init_mlflow_schema(_pg_url(TEMPLATE_DB), Path("/tmp/radt-test-artifacts"))
    yield TEMPLATE_DB
    with engine.connect() as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{TEMPLATE_DB}" WITH (FORCE)'))
    engine.dispose()


@pytest.fixture
def radt_home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "radt-home"
    home.mkdir()
    monkeypatch.setenv("RADT_HOME", str(home))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    return home


def _new_pg_database(template: str, prefix: str = "radt_test_") -> str:
    name = f"{prefix}{uuid.uuid4().hex[:12]}"
    engine = _pg_admin_engine()
    with engine.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}" TEMPLATE "{template}"'))
    engine.dispose()
    return name


def _drop_pg_database(name: str) -> None:
    engine = _pg_admin_engine()
    with engine.connect() as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def store_uri(request, tmp_path, sqlite_template, radt_home) -> str:
    """A fresh, empty MLflow store: every store test runs on SQLite and on the real PostgreSQL."""
    if request.param == "sqlite":
        path = tmp_path / "store.db"
        shutil.copy(sqlite_template, path)
        yield f"sqlite:///{path}"
        return
    template = request.getfixturevalue("pg_template")
    name = _new_pg_database(template)
    yield _pg_url(name)
    _drop_pg_database(name)


@pytest.fixture
def pg_uri(tmp_path, radt_home, request) -> str:
    """A fresh PostgreSQL store, for the tests that need the real server specifically."""
    template = request.getfixturevalue("pg_template")
    name = _new_pg_database(template)
    yield _pg_url(name)
    _drop_pg_database(name)


def radt_env(home: Path, store: str | None = None, fake_gpus: str = "null", fake_bin: bool = False, extra: dict | None = None) -> dict[str, str]:
    """The environment a user's shell would give `radt`, with fakes only at the hardware boundary.

    `fake_gpus`: the GPUs the fake NVML (tests/fakes/fake_nvml.py) answers for, as JSON; the default
    "null" is a machine without the NVIDIA driver, so a developer's real GPU never changes what a test sees.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "RADT_", "PYTEST_"))}
    env["RADT_HOME"] = str(home)
    env["PYTHONPATH"] = str(REPO)
    # MLflow 3.17's telemetry thread can unset its session variable while a request in the script reads it
    # (KeyError '_MLFLOW_TELEMETRY_SESSION_ID', seen once under load); CI=true turns it off the same way
    env["MLFLOW_DISABLE_TELEMETRY"] = "true"
    if store:
        env["MLFLOW_TRACKING_URI"] = store
    # a pynvml that answers like a real driver with these GPUs (or like a machine without one)
    env["PYTHONPATH"] = os.pathsep.join([str(FAKE_NVML_DIR), str(REPO)])
    env["RADT_FAKE_NVML"] = fake_gpus
    if fake_bin:
        env["PATH"] = os.pathsep.join([str(FAKE_BIN), env.get("PATH", "")])
    env.update(extra or {})
    return env


def radt_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "radt", *args]


def run_radt(args: list[str], env: dict, cwd: Path, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(radt_command(*args), env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, **kw)


@pytest.fixture(scope="session")
def browser():
    """One headless Chromium per test process (Playwright's sync API allows one running instance)."""
    from tests.browser import chromium

    with chromium() as b:
        yield b


@pytest.fixture
def fixtures_dir() -> Path:
    if not FIXTURES.is_dir():
        pytest.fail(f"real tool logs not found at {FIXTURES}; set RADT_FIXTURES")
    return FIXTURES


def pytest_sessionfinish(session, exitstatus):
    """Drop the databases shared by xdist workers, once, in the process that ran them all."""
    if hasattr(session.config, "workerinput"):
        return  # an xdist worker: the controller (or a run without xdist) cleans up
    try:
        engine = _pg_admin_engine()
        with engine.connect() as conn:
            names = conn.execute(sa.text("SELECT datname FROM pg_database WHERE datname LIKE :p"), {"p": SHARED_PG_PREFIX + "%"}).scalars().all()
            for name in names:
                conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        engine.dispose()
    except sa.exc.SQLAlchemyError:
        pass  # PostgreSQL unreachable: the tests that needed it have said so
