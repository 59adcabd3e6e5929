"""The suite's fixtures (helpers live in tests/support): a fresh MLflow store per test on SQLite and on the
real PostgreSQL, an isolated RADT_HOME, the real tool logs, headless Chromium, the browser tests'
store and dashboard; and, around every test, the process-wide state a test may change, put back.

PostgreSQL at 127.0.0.1:5432 (user postgres, trust auth) is required under CI (CI=true): there
an unreachable server fails the tests instead of skipping them.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import signal
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support import postgres
from tests.support.browser import chromium, dashboard, new_page
from tests.support.paths import FIXTURES
from tests.support.radtproc import radt_env


@contextmanager
def _once_per_run(tmp_path_factory, name: str):
    """A folder shared by every xdist worker of this test run (their basetemps share a parent; without xdist this
    run's own basetemp), and an exclusive lock on NAME there: what the first holder leaves, the others find."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    with open(shared / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield shared


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory) -> Path:
    """One SQLite file with MLflow's schema for the whole test run, copied for each test (migrations take seconds)."""
    with _once_per_run(tmp_path_factory, "sqlite-template") as shared:
        path = shared / "sqlite-template" / "mlflow.db"
        if not path.exists():
            path.parent.mkdir(exist_ok=True)
            building = path.with_suffix(".building")
            building.unlink(missing_ok=True)
            postgres.init_mlflow_schema(f"sqlite:///{building}", path.parent / "artifacts")
            building.rename(path)
    return path


@pytest.fixture(scope="session")
def pg_template() -> str:
    """The test run's PostgreSQL database with MLflow's schema, which every test store is a clone of."""
    reason = postgres.unreachable()
    if reason:
        if os.environ.get("CI") == "true":
            pytest.fail(f"PostgreSQL at {postgres.PG_ADMIN} is unreachable under CI: {reason}")
        pytest.skip(f"PostgreSQL unreachable ({reason}); start it with pg_ctlcluster")
    return postgres.ensure_template(Path("/tmp/radt-test-artifacts"))


@pytest.fixture(scope="session")
def pg_pool(pg_template):
    """This test process's clones of the template, each emptied and renamed between tests (dropped at the end)."""
    pool = postgres.DatabasePool(pg_template)
    yield pool
    pool.close()


@pytest.fixture
def radt_home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "radt-home"
    home.mkdir()
    monkeypatch.setenv("RADT_HOME", str(home))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    return home


@pytest.fixture(params=["sqlite", "postgresql"])
def store_uri(request, tmp_path, sqlite_template, radt_home) -> str:
    """A fresh, empty MLflow store: every store test runs on SQLite and on the real PostgreSQL."""
    if request.param == "sqlite":
        path = tmp_path / "store.db"
        shutil.copy(sqlite_template, path)
        yield f"sqlite:///{path}"
        return
    yield from _pg_store(request.getfixturevalue("pg_pool"))


@pytest.fixture
def pg_uri(radt_home, pg_pool) -> str:
    """A fresh PostgreSQL store, for the tests that need the real server specifically."""
    yield from _pg_store(pg_pool)


def _pg_store(pool: postgres.DatabasePool):
    name = pool.take()
    try:
        yield postgres.pg_url(name)
    finally:
        pool.give_back(name)


@pytest.fixture
def fixtures_dir() -> Path:
    if not FIXTURES.is_dir():
        pytest.fail(f"real tool logs not found at {FIXTURES}; set RADT_FIXTURES")
    return FIXTURES


# --- the browser tests -------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def browser():
    """One headless Chromium per test process (Playwright's sync API allows one running instance)."""
    with chromium() as b:
        yield b


@pytest.fixture
def page(browser):
    """A page of its own for one test."""
    with new_page(browser) as p:
        yield p


@pytest.fixture(scope="session", params=["sqlite", "postgresql"])
def filled_store(request, tmp_path_factory, sqlite_template):
    """A store holding `radt demo`, a three-hour run and the real 5-GPU logs (tests/support/stores.py), written once
    per store kind for all xdist workers (they only read it); the PostgreSQL one is dropped when the whole run ends."""
    from tests.support.stores import fill_browser_store

    kind = request.param
    with _once_per_run(tmp_path_factory, f"browser-{kind}") as shared:
        described = shared / f"browser-{kind}.json"
        if not described.exists():
            home = shared / f"browser-home-{kind}"
            home.mkdir(exist_ok=True)
            with _kept_environ(), pytest.MonkeyPatch.context() as mp:  # whatever radt sets in this process while it writes, undone
                mp.setenv("RADT_HOME", str(home))
                mp.delenv("MLFLOW_TRACKING_URI", raising=False)
                if kind == "sqlite":
                    shutil.copy(sqlite_template, home / "store.db")
                    uri = f"sqlite:///{home / 'store.db'}"
                else:
                    uri = postgres.pg_url(postgres.new_database(request.getfixturevalue("pg_template"), prefix=postgres.SHARED_PREFIX))
                ids = fill_browser_store(uri)
            described.write_text(json.dumps({"uri": uri, "home": str(home), "kind": kind, **ids}))
        info = json.loads(described.read_text())
    info["home"] = Path(info["home"])
    return info


@pytest.fixture(scope="session")
def served(filled_store):
    """`python app.py` on the browser tests' store, for every browser test of this process on that store kind."""
    with dashboard(filled_store["uri"], radt_env(filled_store["home"])) as base:
        yield base


# --- process-wide state, put back after every test -------------------------------------------------------


@contextmanager
def _kept_environ():
    """os.environ as it was, whatever the code inside sets (radt's connect() adds MLflow's HTTP limits)."""
    saved = dict(os.environ)
    try:
        yield
    finally:
        for name in (set(os.environ) | set(saved)) - {"PYTEST_CURRENT_TEST"}:  # pytest's own, which it sets per phase
            if name not in saved:
                del os.environ[name]
            elif os.environ.get(name) != saved[name]:
                os.environ[name] = saved[name]


SIGNALS = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP]


def _dashboard_state() -> dict[str, dict | None]:
    """The dashboard's read engine and store (radt.app.state.STATE) and its cache (radt.app.cache.CACHE), where imported."""
    state, cache = sys.modules.get("radt.app.state"), sys.modules.get("radt.app.cache")
    return {
        "state": {k: dict(v) if isinstance(v, dict) else v for k, v in vars(state.STATE).items()} if state else None,
        "cache": dict(vars(cache.CACHE)) if cache else None,
    }


def _restore_dashboard_state(saved: dict[str, dict | None]) -> None:
    """As saved; what the test imported first goes back to how it was made (a dashboard pointed at no store)."""
    state, cache = sys.modules.get("radt.app.state"), sys.modules.get("radt.app.cache")
    if state is not None:
        before = saved["state"] if saved["state"] is not None else vars(type(state.STATE)())
        engine = state.STATE.engine
        if engine is not None and engine is not before.get("engine"):
            engine.dispose()  # the test's connections go with it
        vars(state.STATE).clear()
        vars(state.STATE).update(before)
    if cache is not None:
        before = saved["cache"] if saved["cache"] is not None else vars(type(cache.CACHE)())
        vars(cache.CACHE).clear()
        vars(cache.CACHE).update(before)


def _logging_levels() -> dict[str, int]:
    loggers = [(name, logger) for name, logger in logging.Logger.manager.loggerDict.items() if isinstance(logger, logging.Logger)]
    return {"": logging.getLogger().level, **{name: logger.level for name, logger in loggers}}


def _added_env() -> set | None:
    tracking = sys.modules.get("radt.collectors.tracking")
    return set(tracking.ADDED_ENV) if tracking is not None and hasattr(tracking, "ADDED_ENV") else None


@pytest.fixture(autouse=True)
def _process_state():
    """What a test may change in this process for the tests after it: os.environ (radt's connect() sets MLflow's
    HTTP limits, an export BROWSER_PATH), the working directory, signal handlers, logging levels, the dashboard's
    store and cache, Dash's page registry. Each is put back as it was (a test's own monkeypatch undoes first)."""
    cwd = os.getcwd()
    handlers = {sig: signal.getsignal(sig) for sig in SIGNALS}
    levels, added = _logging_levels(), _added_env()
    dashboard_state = _dashboard_state()
    dash = sys.modules.get("dash")
    pages = dict(dash.page_registry) if dash is not None else None
    with _kept_environ():
        yield
    if os.getcwd() != cwd:
        os.chdir(cwd)
    for sig, handler in handlers.items():
        if signal.getsignal(sig) is not handler and handler is not None:
            signal.signal(sig, handler)
    for name, level in _logging_levels().items():
        if level != levels.get(name, logging.NOTSET):
            logging.getLogger(name or None).setLevel(levels.get(name, logging.NOTSET))
    tracking = sys.modules.get("radt.collectors.tracking")
    if tracking is not None and hasattr(tracking, "ADDED_ENV"):
        tracking.ADDED_ENV.clear()
        tracking.ADDED_ENV.update(added or ())
    _restore_dashboard_state(dashboard_state)
    dash = sys.modules.get("dash")
    if dash is not None and dict(dash.page_registry) != (pages or {}):
        dash.page_registry.clear()
        dash.page_registry.update(pages or {})


def pytest_sessionfinish(session, exitstatus):
    """Drop this test run's databases (the template, the shared stores, what a worker left), once, in the process
    that ran them all: the xdist controller, or this process without xdist."""
    if hasattr(session.config, "workerinput"):
        return  # an xdist worker: the controller cleans up when every worker has ended
    try:
        postgres.drop_run_databases()
    except Exception:
        pass  # PostgreSQL unreachable: the tests that needed it have said so
