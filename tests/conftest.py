"""The suite's fixtures (helpers live in tests/support): a fresh MLflow store per test (SQLite; SQLite and the real
PostgreSQL where the dialect matters: the `dialects` marker), an isolated RADT_HOME, the real tool logs, headless
Chromium, the browser tests' store and dashboard; around every test, the process-wide state a test may change, put
back; and the markers of the slow kinds (`browser`, `slurm`, `prometheus`, `e2e`), set by what a test uses, so that
`-m "not browser and not slurm and not prometheus and not e2e"` is the fast inner loop.

PostgreSQL at 127.0.0.1:5432 (user postgres, trust auth) is required under CI (CI=true): there
an unreachable server fails the tests instead of skipping them.
"""

from __future__ import annotations

import fcntl
import functools
import gc
import json
import os
import shutil
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support import postgres, prometheus, state
from tests.support.browser import chromium_with_cache, dashboard, new_page
from tests.support.paths import FIXTURES
from tests.support.radtproc import QUICK_PERIODS, radt_env
from tests.support.snapshots import Snapshots

# radt's fixed periods short in this process too, as in every process radt_env starts: a workload parent made through
# MLflow's client waited its 1 s settle twice (8 s of sleep to build test_aggregates' store, ~100 s in the suite).
# The tests given DEFAULT_PERIODS keep each period at its default.
os.environ.update(QUICK_PERIODS)
# The test process's own store builders (snapshots, the browser store) create workload parents that nothing races:
# through MLflow's client each waited the settle meant for radts started together (0.3 s, 2.4 s of one snapshot's
# 3.5). The test of that race sets the period back (test_sqltracking).
os.environ["RADT_PARENT_SETTLE"] = "0.01"

# The test process's own garbage collector: a pytest worker holds MLflow, Dash, Plotly, pandas and Playwright, and at
# CPython's default (a collection every 700 allocations, a full one every 7,000) it spent 15 % of the in-process tests'
# CPU walking those objects again and again (the inner loop 69.5 -> 58.9 s of CPU, docs/development.md). Garbage with
# cycles is still collected, only less often. radt's own processes keep their settings (the recorder freezes its heap).
gc.set_threshold(100_000, 50, 100)


def _run_folder(tmp_path_factory) -> Path:
    """A folder shared by every xdist worker of this test run (their basetemps share a parent; without xdist this run's own basetemp)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@contextmanager
def _once_per_run(tmp_path_factory, name: str):
    """The test run's shared folder, and an exclusive lock on NAME there: what the first holder leaves, the others find."""
    shared = _run_folder(tmp_path_factory)
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
def cluster() -> dict[str, str]:
    """The one-node Slurm of tests/support/slurm.py (munged, slurmctld, slurmd), started once for the test run."""
    from tests.support import slurm

    return slurm.cluster()


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


@pytest.fixture(scope="session")
def snapshots(tmp_path_factory, sqlite_template, request) -> Snapshots:
    """Stores filled once per test run, copied into a test's own store: `snapshots.restore(builder, store_uri)`."""
    return Snapshots(
        _run_folder(tmp_path_factory), functools.partial(_once_per_run, tmp_path_factory), sqlite_template, lambda: request.getfixturevalue("pg_template")
    )


@pytest.fixture
def radt_home(tmp_path, tmp_path_factory, monkeypatch) -> Path:
    """An empty RADT_HOME of the test's own, but for its cache folder: radt keeps one `pip freeze` per interpreter
    there (finish.freeze), and the whole run shares it. The first run to end takes the freeze, the others copy
    it, as on a user's machine, instead of half a second of CPU in every test that tracks a run."""
    home = tmp_path / "radt-home"
    home.mkdir()
    cache = _run_folder(tmp_path_factory) / "radt-home-cache"
    cache.mkdir(exist_ok=True)
    (home / "cache").symlink_to(cache, target_is_directory=True)
    monkeypatch.setenv("RADT_HOME", str(home))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    return home


@pytest.fixture
def store_uri(request, tmp_path, sqlite_template, radt_home) -> str:
    """A fresh, empty MLflow store: SQLite, and the real PostgreSQL too for a test marked `dialects` (pytest_generate_tests)."""
    if request.param == "sqlite":
        path = tmp_path / "store.db"
        shutil.copy(sqlite_template, path)
        yield f"sqlite:///{path}"
        return
    yield from _pg_store(request.getfixturevalue("pg_pool"))


@pytest.fixture
def empty_sqlite(sqlite_template):
    """`empty_sqlite(path)`: a SQLite store at PATH holding MLflow's schema and nothing else (a copy of the template); its URI.

    For the tests of what radt does with a SQLite file it is given, not of how it creates one (tests/test_sqltracking.py
    tests that): creating a store runs MLflow's migrations, 4 s of CPU in the first `radt` process of each such test."""

    def make(path: Path) -> str:
        shutil.copy(sqlite_template, path)
        return f"sqlite:///{path}"

    return make


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
    """One headless Chromium per test process (Playwright's sync API allows one running instance), with one profile
    whose cache its pages share; each page's cookies and storage are cleared when it closes (support/browser.new_page)."""
    with chromium_with_cache() as b:
        yield b


@pytest.fixture
def page(browser):
    """A page of its own for one test."""
    with new_page(browser) as p:
        yield p


@pytest.fixture(scope="session")
def filled_store(request, tmp_path_factory, sqlite_template):
    """A store holding `radt demo`, a three-hour run and the real 5-GPU logs (tests/support/stores.py), written once
    per store kind for all xdist workers (they only read it); the PostgreSQL one is dropped when the whole run ends.
    SQLite, and PostgreSQL for a test marked `dialects` or parametrized `["postgresql"]` (pytest_generate_tests)."""
    from tests.support.stores import fill_browser_store

    kind = request.param
    with _once_per_run(tmp_path_factory, f"browser-{kind}") as shared:
        described = shared / f"browser-{kind}.json"
        if not described.exists():
            home = shared / f"browser-home-{kind}"
            home.mkdir(exist_ok=True)
            with state.kept_environ(), pytest.MonkeyPatch.context() as mp:  # whatever radt sets in this process while it writes, undone
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


# --- store kinds and markers ----------------------------------------------------------------------------------

STORE_KINDS = ("sqlite", "postgresql")
STORE_FIXTURES = ("store_uri", "filled_store")


def _parametrized(metafunc, name: str) -> bool:
    """Whether the test parametrizes NAME itself (`@pytest.mark.parametrize("store_uri", ["sqlite"], indirect=True)`)."""
    for mark in metafunc.definition.iter_markers("parametrize"):
        names = mark.args[0] if mark.args else mark.kwargs.get("argnames", ())
        names = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
        if name in names:
            return True
    return False


def pytest_generate_tests(metafunc):
    """A store test runs on SQLite; one marked `dialects` (its SQL differs per dialect) also on the real PostgreSQL.
    End-to-end and browser tests take SQLite, and each area keeps its PostgreSQL one by the marker or `pg_uri`."""
    for name in STORE_FIXTURES:
        if name in metafunc.fixturenames and not _parametrized(metafunc, name):
            kinds = STORE_KINDS if metafunc.definition.get_closest_marker("dialects") else STORE_KINDS[:1]
            metafunc.parametrize(name, kinds, indirect=True)


# what puts a test in a slow kind: a fixture it uses (its own or through others), or a name its code (or a helper of
# its module that it calls, or one of its fixtures) refers to
KIND_FIXTURES = {"browser": {"browser"}, "slurm": {"cluster"}, "prometheus": set(), "e2e": set()}
KIND_NAMES = {
    "browser": {"chromium"},
    "slurm": {"cluster"},  # slurm.cluster(), the fixture's own call
    "prometheus": {"prom", "Prometheus", "serving"},
    "e2e": {"run_radt", "LiveRadt", "radt_command", "subprocess", "dashboard", "MlflowServer", "mlflow_server"},
}


def _names(function, module, seen: set) -> set[str]:
    """The global names FUNCTION's code refers to, with those of the module's own functions it calls, transitively."""
    code = getattr(function, "__code__", None)
    if code is None or code in seen:
        return set()
    seen.add(code)
    found: set[str] = set()
    stack = [code]
    while stack:
        current = stack.pop()
        found.update(current.co_names)
        stack.extend(c for c in current.co_consts if hasattr(c, "co_names"))
    for name in list(found):
        helper = getattr(module, name, None)
        if callable(helper) and getattr(helper, "__module__", None) == module.__name__:
            found |= _names(getattr(helper, "__wrapped__", helper), module, seen)
    return found


def pytest_collection_modifyitems(config, items):
    """Each test marked with the slow kinds it belongs to (KIND_FIXTURES, KIND_NAMES)."""
    for item in items:
        function = getattr(item, "function", None)
        if function is None or not hasattr(item, "_fixtureinfo"):
            continue
        module = item.module
        seen: set = set()
        names = _names(function, module, seen)
        for defs in item._fixtureinfo.name2fixturedefs.values():  # the fixtures it uses, its own and through others
            for fixturedef in defs:
                home = sys.modules.get(getattr(fixturedef.func, "__module__", ""))
                if home is not None and home.__name__.startswith("tests."):
                    names |= _names(fixturedef.func, home, seen)
        for kind, fixtures in KIND_FIXTURES.items():
            if fixtures & set(item.fixturenames) or KIND_NAMES[kind] & names:
                item.add_marker(kind)


def pytest_collection_finish(session):
    """A Prometheus started now, where the tests selected need one: its ~5 s before a first scrape pass while the
    first tests run (support/prometheus.taken). In each xdist worker, which collects all and runs some."""
    if any(item.get_closest_marker("prometheus") for item in session.items):
        prometheus.warm_up()
    gc.collect()
    gc.freeze()  # what collection imported lives to the end: no full collection walks it again


@pytest.fixture(scope="session", autouse=True)
def _mlflow_schema_head_once():
    """MLflow's client checks every store it opens against its newest schema revision, which it finds by parsing its
    alembic script folder each time (27 ms; ~200 stores a worker). The answer depends only on the MLflow installed, so
    the test processes ask once; the check itself (the store's revision against it) still runs for every store."""
    from mlflow.store.db import utils

    original = utils._get_latest_schema_revision
    utils._get_latest_schema_revision = functools.cache(original)
    yield
    utils._get_latest_schema_revision = original


# --- process-wide state, put back after every test -------------------------------------------------------


@pytest.fixture(autouse=True)
def _process_state():
    """What a test may change in this process for the tests after it (os.environ, the working directory, signal
    handlers, logging levels, the dashboard's store and cache, Dash's page registry: tests/support/state.py),
    put back as it was; a test's own monkeypatch undoes its changes first."""
    with state.kept():
        yield


def pytest_sessionfinish(session, exitstatus):
    """Drop this test run's databases (the template, the shared stores, what a worker left), once, in the process
    that ran them all: the xdist controller, or this process without xdist."""
    if hasattr(session.config, "workerinput"):
        return  # an xdist worker: the controller cleans up when every worker has ended
    try:
        postgres.drop_run_databases()
    except Exception:
        pass  # PostgreSQL unreachable: the tests that needed it have said so


@pytest.fixture
def nvml(monkeypatch):
    """install(config) -> FakeNvml answering pynvml's functions (tests/fakes/fake_nvml.py), on a clock the test moves."""
    import pynvml

    from tests.fakes.fake_nvml import FakeNvml, ManualClock

    def install(config) -> FakeNvml:
        fake = FakeNvml.from_config(config, nvml=pynvml, clock=ManualClock())
        fake.install(pynvml, monkeypatch.setattr)
        return fake

    return install
