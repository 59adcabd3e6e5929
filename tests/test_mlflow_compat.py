"""MLflow compatibility by what radt touches: a store a newer MLflow migrated keeps radt's SQL path while the tables
and columns radt reads and writes are unchanged (radt/mlflowdb.py KNOWN_GOOD, schema_difference), and one whose
columns changed is said in one line and written through MLflow's client.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import tomllib
import uuid

import pytest
import sqlalchemy as sa
from alembic.migration import MigrationContext
from alembic.operations import Operations
from mlflow import MlflowClient

from radt import mlflowdb
from radt.collectors.store import sqltracking, tracking
from radt.collectors.store.sqltracking import SqlTracking
from radt.collectors.store.stores import MlflowMetricStore, SqlMetricStore, open_metric_store
from radt.collectors.store.tracking import StoreError
from radt.points import Point
from tests.support.paths import REPO
from tests.support.radtproc import radt_env

UNKNOWN = "0a1b2c3d4e5f"  # a revision neither radt nor the installed MLflow knows: an MLflow newer than both
MLFLOW_3_18 = "f4a9b2c7d1e6"
PROBE = "import json, sys; from radt.cli import main; code = main(sys.argv[1:]); print(json.dumps({'code': code, 'mlflow': 'mlflow' in sys.modules}))"
pytestmark = [
    pytest.mark.dialects,  # the store's schema and radt's SQL path, per dialect
    pytest.mark.filterwarnings("ignore:Unnamed CHECK constraint:UserWarning"),  # alembic's SQLite table rebuild, as in MLflow's migrations
]
POINTS = [Point("system/cpu_percent", float(i), 1_700_000_000_000 + i * 1000, i) for i in range(5)]


@pytest.fixture(autouse=True)
def _fresh_verdicts(monkeypatch):
    """Each test finds its store anew: pooled PostgreSQL stores come back under the same URL."""
    monkeypatch.setattr(sqltracking, "_INSPECTED", {})
    monkeypatch.setattr(tracking, "_SAID", set())


def _migrate(uri: str, revision: str, alter=None) -> None:
    """The store as a newer MLflow leaves it: a table of its own, `revision` stamped, and `alter(op)` on radt's tables (alembic, as MLflow
    migrates). Each call's new table also keeps the PostgreSQL pool from handing this database, columns changed, to another test."""
    engine = sa.create_engine(uri)
    with engine.begin() as conn:
        op = Operations(MigrationContext.configure(conn))
        op.create_table(f"newer_{uuid.uuid4().hex[:8]}", sa.Column("name", sa.String(128), primary_key=True), sa.Column("created_at", sa.BigInteger))
        if alter:
            alter(op)
        conn.execute(sa.update(mlflowdb.alembic_version).values(version_num=revision))
    engine.dispose()


def _step_as_integer(op: Operations) -> None:
    with op.batch_alter_table("metrics") as batch:
        batch.alter_column("step", type_=sa.Integer, existing_type=sa.BigInteger, existing_nullable=False)


def _source_version_renamed(op: Operations) -> None:
    with op.batch_alter_table("runs") as batch:
        batch.alter_column("source_version", new_column_name="code_version", existing_type=sa.String(50))


def _record(client, uri: str) -> str:
    """A run as radt records one: experiment, run, params, points through the metric store radt opens, the end."""
    experiment_id = tracking.resolve_experiment(client, uri, "compat")
    run = client.create_run(experiment_id, run_name="r")
    run_id = run.info.run_id
    param, _tag = tracking._entities(client)
    client.log_batch(run_id, params=[param("batch", "8")])
    store = open_metric_store(uri)
    try:
        store.write(run_id, POINTS)
    finally:
        store.close()
    client.set_terminated(run_id, "FINISHED")
    return run_id


def test_a_store_at_a_revision_radt_does_not_know_with_its_tables_unchanged_keeps_the_sql_path(store_uri, capfd):
    _migrate(store_uri, UNKNOWN)
    client = tracking.connect(store_uri)
    assert isinstance(client, SqlTracking)
    assert isinstance(open_metric_store(store_uri), SqlMetricStore)
    run_id = _record(client, store_uri)
    run = client.get_run(run_id)
    assert (run.info.status, run.data.params, run.data.metrics) == ("FINISHED", {"batch": "8"}, {"system/cpu_percent": 4.0})
    assert capfd.readouterr().err == ""


def test_a_store_mlflow_3_18_migrated_is_recorded_by_radt_on_mlflow_3_17_without_importing_it(store_uri, radt_home, tmp_path):
    """The lock-out: MLflow 3.18 opened the store (its migrations touch none of radt's tables); a `radt` whose MLflow is older runs on it."""
    _migrate(store_uri, MLFLOW_3_18)
    (tmp_path / "tiny.py").write_text("print('tiny')\n")
    done = subprocess.run(
        [sys.executable, "-c", PROBE, "-l", "host", "tiny.py"], env=radt_env(radt_home, store_uri), cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"code": 0, "mlflow": False}, done.stderr
    assert "pip install" not in done.stderr and "MLflow's client" not in done.stderr, done.stderr
    runs = tracking.find_runs(tracking.connect(store_uri), ["0"], {})
    assert sorted(r.info.status for r in runs) == ["FINISHED"]


@pytest.mark.parametrize(
    ("alter", "named"),
    [(_step_as_integer, "column metrics.step is INTEGER, radt writes BIGINT"), (_source_version_renamed, "column runs.source_version is missing")],
)
def test_a_store_whose_column_radt_writes_changed_is_said_once_and_written_through_mlflows_client(alter, named, store_uri, capfd, monkeypatch):
    monkeypatch.setattr(mlflowdb, "KNOWN_GOOD", frozenset())  # an installed MLflow whose revision radt has not read: the store's tables decide
    _migrate(store_uri, mlflowdb.schema_revisions()[0], alter)
    clients = [tracking.connect(store_uri), tracking.connect(store_uri)]
    assert [type(c) for c in clients] == [MlflowClient, MlflowClient]
    lines = capfd.readouterr().err.splitlines()
    assert len(lines) == 1 and named in lines[0] and lines[0].endswith("radt uses MLflow's client for it"), lines
    assert isinstance(open_metric_store(store_uri), MlflowMetricStore)
    if alter is _step_as_integer:  # MLflow's client writes this store; the renamed column breaks MLflow too
        run_id = _record(clients[0], store_uri)
        history = clients[0].get_metric_history(run_id, "system/cpu_percent")
        assert [(m.step, m.value, m.timestamp) for m in history] == [(p.step, p.value, p.timestamp) for p in POINTS]
        assert clients[0].get_run(run_id).info.status == "FINISHED"


def test_a_store_a_newer_mlflow_changed_radts_columns_in_is_refused_in_one_line(store_uri):
    _migrate(store_uri, UNKNOWN, _source_version_renamed)
    with pytest.raises(
        StoreError, match=r"newer than the installed MLflow knows, and its column runs.source_version is missing; upgrade MLflow .*pip install -U mlflow\)$"
    ) as raised:
        tracking.connect(store_uri)
    assert "\n" not in str(raised.value)


def test_a_known_good_revision_is_not_inspected(tmp_path):
    nowhere = sa.create_engine(f"sqlite:///{tmp_path / 'no' / 'such.db'}")  # any connection fails
    assert [sqltracking.schema_difference(nowhere, revision) for revision in sorted(mlflowdb.KNOWN_GOOD)] == [None] * len(mlflowdb.KNOWN_GOOD)
    with pytest.raises(sa.exc.OperationalError):
        sqltracking.schema_difference(nowhere, UNKNOWN)


def _optional_columns(op: Operations) -> None:
    op.add_column("tags", sa.Column("owner", sa.String(64), nullable=False, server_default="x"))
    op.add_column("params", sa.Column("origin", sa.String(64), nullable=True))


def _required_column(op: Operations) -> None:
    op.add_column("latest_metrics", sa.Column("dataset", sa.String(64), nullable=True))
    with op.batch_alter_table("latest_metrics") as batch:
        batch.alter_column("dataset", existing_type=sa.String(64), nullable=False)


def test_new_columns_radt_need_not_write_leave_its_tables_matching_but_a_required_one_does_not(store_uri):
    engine = sa.create_engine(store_uri)
    try:
        for alter, found in (
            (None, None),
            (_optional_columns, None),
            (_required_column, "column latest_metrics.dataset is new and NOT NULL without a default"),
        ):
            _migrate(store_uri, mlflowdb.SCHEMA_REVISION, alter)
            with engine.connect() as conn:
                assert mlflowdb.schema_difference(conn) == (found and f"{found}, radt does not write it")
    finally:
        engine.dispose()


# --- what radt declares: pyproject.toml and requirements.txt agree, and list what radt imports at run time -----------

RUN_TIME = ("radt", "collectors", "app", "pages", "app.py")
OPTIONAL_IMPORTS = {"torch", "nvtx"}  # imported only inside a training script that has them (radt/__init__.py)
NOT_IMPORTED = {"gunicorn": "the README's server command", "redis": "Flask-Caching's backend for RADT_CACHE=redis://"}


def _declared() -> tuple[dict, dict]:
    """pyproject's dependencies and requirements.txt's, by canonical name."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    pinned = [line.split("#")[0].strip() for line in (REPO / "requirements.txt").read_text().splitlines()]
    by_name = lambda lines: {canonicalize_name(r.name): r for r in map(Requirement, filter(None, lines))}  # noqa: E731
    return by_name(project), by_name(pinned)


def test_pyproject_and_requirements_name_the_same_packages_and_agree_on_versions():
    project, pinned = _declared()
    assert sorted(project) == sorted(pinned)
    for name, requirement in pinned.items():
        exact = [s.version for s in requirement.specifier if s.operator == "=="]
        if exact:  # pyproject takes the checked version, and its floor is that minor release
            floor = next((s.version for s in project[name].specifier if s.operator == ">="), None)
            assert project[name].specifier.contains(exact[0]) and floor == ".".join(exact[0].split(".")[:2]), (name, str(project[name].specifier), exact[0])
        else:
            assert requirement.specifier == project[name].specifier, name
        assert requirement.marker == project[name].marker, name


def test_the_dependencies_are_what_radt_imports_at_run_time():
    from importlib.metadata import packages_distributions

    from packaging.utils import canonicalize_name

    imported = set()
    for folder in RUN_TIME:
        for path in [REPO / folder] if folder.endswith(".py") else (REPO / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module]
                    if isinstance(node, ast.ImportFrom) and not node.level
                    else []
                )
                imported |= {name.split(".")[0] for name in names if name}
    distributions = packages_distributions()
    third_party = imported - set(sys.stdlib_module_names) - {"radt", "__future__"} - OPTIONAL_IMPORTS
    providers = {module: {canonicalize_name(d) for d in distributions.get(module, [module])} for module in third_party}  # mlflow: 3 of them
    project, _pinned = _declared()
    assert sorted(m for m, found in providers.items() if not found & set(project)) == [], "imported at run time, not declared"
    assert sorted(set(project) - set().union(*providers.values()) - set(NOT_IMPORTED)) == [], "declared, never imported at run time"
