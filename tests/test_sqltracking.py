"""radt's own SQL path to MLflow's tables (collectors/store/sqltracking.py, radt/mlflowdb.py): what it writes reads
back through MLflow's client exactly as what MLflow's client writes for the same calls, and `radt train.py`,
`radt -w` and `radt experiment.csv` on a database store never import MLflow (five seconds a run).
"""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa
from mlflow import MlflowClient

from radt import mlflowdb
from radt.collectors.run.finish import complete_run
from radt.collectors.store import tracking
from radt.collectors.store.sqltracking import SqlTracking
from radt.collectors.store.tracking import StoreError
from tests.support import postgres
from tests.support.radtproc import QUICK_PERIODS, radt_env

pytestmark = pytest.mark.dialects  # the SQL radt issues differs per dialect: SQLite and the real PostgreSQL

WORKLOAD = "w 'one' two"  # a quote: MLflow's filter takes it between double quotes, and radt's SQL reads that literal as MLflow does
PROBE = (
    "import json, sys; from radt.cli import main; code = main(sys.argv[1:]); "
    "print(json.dumps({'code': code, 'loaded': sorted(m for m in ('mlflow', 'pandas', 'plotly', 'dash', 'numpy', 'requests') if m in sys.modules)}))"
)  # requests: only a prometheus listener needs it (a run's end imported it for every run: ~35 ms of radt's end cost)
RANDOM_NAME = re.compile(r"^[a-z]+-[a-z]+-\d{1,4}$")


def _flow(client, uri: str, tmp_path: Path, label: str) -> dict[str, str]:
    """What two `radt -w` runs of one workload started together do, through `client`: experiment, parent, letters,
    params, tags, logs as artifacts, statuses, the parent's worst status. Returns the ids by role."""
    experiment_id = tracking.resolve_experiment(client, uri, f"parity {label}")
    ids = {"experiment": experiment_id}
    for number, name in enumerate(("train A", None), start=1):
        run_id, ids["parent"] = tracking.create_run(
            client,
            experiment_id,
            tracking.NewRun(
                command=["python", "train.py", "--lr", "0.1", "--fp16", "x" * 7000],
                script="train.py",
                script_args=["--lr", "0.1", "--fp16", "x" * 7000],  # a value past MLflow's 6000 characters is cut the same way
                run_name=name,
                workload=WORKLOAD,
                letter="",
                devices="0",
                collocation="-",
                listeners=["nvml", "host"],
                settings={"radt.interval": "1", "max_epoch": "None"},
            ),
        )
        ids[f"run{number}"] = run_id
        tracking.set_tags(client, run_id, {"radt.gpus": "[]", "long": "y" * 9000})
    for number, status in ((1, "FINISHED"), (2, "FAILED")):
        run_id = ids[f"run{number}"]
        run_dir = tmp_path / label / run_id
        (run_dir / "logs" / "deep").mkdir(parents=True)
        (run_dir / "logs" / "stdout.log").write_text(f"epoch {number}\n")
        (run_dir / "logs" / "deep" / "inventory.json").write_text("{}")
        pending = {"status": status, "end_time": 1_700_000_000_000 + number, "tags": {"radt.exit_code": str(number - 1)}, "parent_id": ids["parent"]}
        complete_run(client, run_dir, run_id, pending)
        if number == 1:
            assert MlflowClient(uri).get_run(ids["parent"]).info.status == "RUNNING", "the second run still runs"
    client.log_text(ids["run1"], "out of memory\n", "radt/notes/oom.txt")
    return ids


def _normal(value, ids: dict[str, str]):
    """`value` with the flow's ids as their roles, so that the two flows compare."""
    if isinstance(value, str):
        for role, run_id in ids.items():
            if role != "experiment":
                value = value.replace(run_id, f"<{role}>")
        return value
    if isinstance(value, dict):
        return {_normal(k, ids): _normal(v, ids) for k, v in value.items()}
    return value


def _seen_by_mlflow(uri: str, ids: dict[str, str]) -> dict:
    """Everything MLflow's client reads of the flow's runs, ids and times aside."""
    reader = MlflowClient(uri)
    experiment = reader.get_experiment(ids["experiment"])
    assert experiment.creation_time and experiment.creation_time == experiment.last_update_time
    seen = {"experiment": (experiment.lifecycle_stage, experiment.tags, experiment.artifact_location.rsplit("/", 1)[0])}
    for role in ("parent", "run1", "run2"):
        run = reader.get_run(ids[role])
        info = run.info
        assert info.artifact_uri == f"{experiment.artifact_location}/{info.run_id}/artifacts"
        assert info.start_time and info.end_time and info.end_time >= (1_700_000_000_000 if role != "parent" else 0)
        name = "<random>" if RANDOM_NAME.match(info.run_name) else info.run_name
        tags = {k: ("<random>" if v == info.run_name and name == "<random>" else v) for k, v in run.data.tags.items()}
        artifacts = sorted((f.path, f.is_dir, f.file_size) for f in reader.list_artifacts(info.run_id, "radt"))
        deep = sorted((f.path, f.file_size) for f in reader.list_artifacts(info.run_id, "radt/deep"))
        seen[role] = _normal(
            {
                "info": (name, info.status, info.lifecycle_stage, info.user_id, info.experiment_id == ids["experiment"]),
                "tags": tags,
                "params": run.data.params,
                "metrics": run.data.metrics,
                "artifacts": (artifacts, deep),
            },
            ids,
        )
    exp = [ids["experiment"]]
    searches = {
        "parents": reader.search_runs(exp, f"tags.`radt.workload` = {tracking.search_literal(WORKLOAD)} and tags.`radt.role` = 'workload'"),
        "children": reader.search_runs(exp, f"tags.`mlflow.parentRunId` = '{ids['parent']}'"),
        "failed": reader.search_runs(exp, f"tags.`mlflow.parentRunId` = '{ids['parent']}' and attributes.status = 'FAILED'"),
        "letters": reader.search_runs(exp, "tags.`radt.letter` = 'B'"),
    }
    seen["searches"] = {k: [_normal(r.info.run_id, ids) for r in v] for k, v in searches.items()}
    return seen


def _rows(uri: str, ids: dict[str, str]) -> dict:
    """The rows of `runs` and `experiments` as stored, ids, names, times and locations aside."""
    engine = sa.create_engine(uri)
    skip = {"run_uuid", "name", "start_time", "end_time", "artifact_uri", "experiment_id"}
    with engine.connect() as conn:
        runs = {
            role: {
                k: v for k, v in conn.execute(sa.select(mlflowdb.runs).where(mlflowdb.runs.c.run_uuid == ids[role])).mappings().one().items() if k not in skip
            }
            for role in ("parent", "run1", "run2")
        }
        experiment = conn.execute(sa.select(mlflowdb.experiments).where(mlflowdb.experiments.c.experiment_id == int(ids["experiment"]))).mappings().one()
    engine.dispose()
    return {"runs": runs, "experiment": {k: v for k, v in experiment.items() if k in ("workspace", "lifecycle_stage")}}


def test_a_workload_written_by_radts_sql_reads_back_as_one_written_by_mlflows_client(store_uri, radt_home, tmp_path):
    ours = tracking.connect(store_uri)
    assert isinstance(ours, SqlTracking), "a database store at MLflow's schema takes radt's SQL path"
    theirs = MlflowClient(store_uri)
    mine = _flow(ours, store_uri, tmp_path, "radt")
    reference = _flow(theirs, store_uri, tmp_path, "mlflow")
    seen, expected = _seen_by_mlflow(store_uri, mine), _seen_by_mlflow(store_uri, reference)
    for key in expected:
        assert seen[key] == expected[key], key
    assert seen["run2"]["info"][0] == "<random>" and seen["run1"]["tags"]["radt.letter"] == "A" and seen["run2"]["tags"]["radt.letter"] == "B"
    assert seen["parent"]["info"][1] == "FAILED", "the worst status of its runs"
    assert len(seen["run1"]["params"]["fp16"]) == 6000 and len(seen["run1"]["tags"]["long"]) == 8000
    assert _rows(store_uri, mine) == _rows(store_uri, reference)
    assert (radt_home / "artifacts" / "parity_radt" / mine["run1"] / "artifacts" / "radt" / "notes" / "oom.txt").read_text() == "out of memory\n"


def test_radts_search_answers_mlflows_filters_as_mlflow_does(store_uri, radt_home, tmp_path):
    ours = tracking.connect(store_uri)
    ids = _flow(ours, store_uri, tmp_path, "search")
    theirs = MlflowClient(store_uri)
    filters = [
        f"tags.`radt.workload` = {tracking.search_literal(WORKLOAD)} and tags.`radt.role` = 'workload'",
        f"tags.`mlflow.parentRunId` = '{ids['parent']}' and attributes.status = 'FAILED'",
        f"tags.`mlflow.parentRunId` = '{ids['parent']}'",
        "tags.`radt.role` = 'run'",
        "attributes.status = 'FINISHED'",
        "",
    ]
    for text in filters:
        assert [r.info.run_id for r in ours.search_runs([ids["experiment"]], text)] == [r.info.run_id for r in theirs.search_runs([ids["experiment"]], text)], (
            text
        )
    with pytest.raises(ValueError, match="tag and status equalities only"):
        ours.search_runs([ids["experiment"]], "metrics.loss < 1")


@pytest.mark.parametrize("command", ["single", "workload", "csv"])
def test_radt_on_a_database_store_never_imports_mlflow(command, store_uri, radt_home, tmp_path):
    (tmp_path / "tiny.py").write_text("print('tiny')\n")
    args = {"single": ["-l", "host", "tiny.py"], "workload": ["-w", "7", "-e", "quick", "-l", "host", "tiny.py"], "csv": ["experiment.csv"]}[command]
    (tmp_path / "experiment.csv").write_text(
        "Experiment,Workload,Status,Run,Devices,Collocation,File,Listeners,Params\nquick,1,,,-,-,tiny.py,host,--a 1\nquick,1,,,-,-,tiny.py,host,--a 2\n"
    )
    done = subprocess.run([sys.executable, "-c", PROBE, *args], env=radt_env(radt_home, store_uri), cwd=tmp_path, capture_output=True, text=True, timeout=180)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"code": 0, "loaded": []}, done.stderr
    client = MlflowClient(store_uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert runs and all(r.info.status == "FINISHED" for r in runs), [(r.info.run_name, r.info.status) for r in runs]
    tracked = [r for r in runs if r.data.tags.get("radt.role") == "run"]
    assert len(tracked) == (1 if command == "single" else 1 if command == "workload" else 2)
    assert all("radt/stdout.log" in {f.path for f in client.list_artifacts(r.info.run_id, "radt")} for r in tracked)


def _empty_postgres() -> tuple[str, str]:
    name = f"{postgres.TEST_PREFIX}empty_{uuid.uuid4().hex[:10]}"
    engine = postgres.admin_engine()
    with engine.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    engine.dispose()
    return postgres.pg_url(name), name


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_new_store_gets_mlflows_schema_once_then_radt_writes_it_without_mlflow(backend, radt_home, tmp_path, request):
    (tmp_path / "tiny.py").write_text("print('tiny')\n")
    name = None
    if backend == "sqlite":
        (tmp_path / "new").mkdir()
        uri = f"sqlite:///{tmp_path / 'new' / 'fresh.db'}"
    else:
        request.getfixturevalue("pg_template")  # skips (or fails under CI) where PostgreSQL is unreachable
        uri, name = _empty_postgres()
    try:
        env = radt_env(radt_home, uri)
        runs = [subprocess.run([sys.executable, "-c", PROBE, "-l", "host", "tiny.py"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)]
        runs.append(subprocess.run([sys.executable, "-c", PROBE, "-l", "host", "tiny.py"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120))
        results = [json.loads(r.stdout.strip().splitlines()[-1]) for r in runs]
        assert [r["code"] for r in results] == [0, 0], [r.stderr for r in runs]
        assert results[1]["loaded"] == [], "the second run finds the schema and writes it through radt's SQL"
        assert "INFO" not in runs[0].stderr, runs[0].stderr
        engine = sa.create_engine(uri)
        with engine.connect() as conn:
            assert conn.execute(sa.select(mlflowdb.alembic_version.c.version_num)).scalar() == mlflowdb.schema_revisions()[0]
        engine.dispose()
        client = MlflowClient(uri)
        assert client.get_experiment("0").artifact_location == (radt_home / "artifacts").as_uri() + "/0"
        assert sorted(r.info.status for r in client.search_runs(["0"])) == ["FINISHED", "FINISHED"]
    finally:
        if name:
            postgres.drop_databases([name])


def test_a_store_at_an_older_schema_is_refused_in_one_line(store_uri, radt_home):
    """A newer schema radt's tables still describe is written (tests/test_mlflow_compat.py); an older one is upgraded first."""
    engine = sa.create_engine(store_uri)
    with engine.begin() as conn:
        conn.execute(sa.update(mlflowdb.alembic_version).values(version_num="75868b020152"))
    engine.dispose()
    head = mlflowdb.schema_revisions()[0]
    with pytest.raises(
        StoreError, match=rf"has an older MLflow schema \(75868b020152, this MLflow writes {head}\); back it up, then run: mlflow db upgrade '.*'$"
    ) as raised:
        tracking.connect(store_uri)
    assert "\n" not in str(raised.value)


def test_radts_tables_are_mlflows_and_its_revision_the_installed_one():
    from mlflow.store.db.base_sql_model import Base
    from mlflow.store.db.utils import _get_latest_schema_revision
    from mlflow.store.tracking.dbmodels import models  # noqa: F401 - fills Base.metadata

    pg = sa.dialects.postgresql.dialect()
    for name, table in mlflowdb.metadata.tables.items():
        if name == "alembic_version":
            continue
        theirs = Base.metadata.tables[name]
        assert [c.name for c in table.c] == [c.name for c in theirs.c], name
        for column in theirs.c:
            mine = table.c[column.name]
            assert (str(mine.type.compile(dialect=pg)), mine.nullable, mine.primary_key) == (
                str(column.type.compile(dialect=pg)),
                column.nullable,
                column.primary_key,
            ), f"{name}.{column.name}"
        assert table.primary_key.name == theirs.primary_key.name
        assert sorted(fk.target_fullname for fk in table.foreign_keys) == sorted(fk.target_fullname for fk in theirs.foreign_keys)
    assert mlflowdb.schema_revisions()[0] == _get_latest_schema_revision()
    assert mlflowdb.SCHEMA_REVISION in mlflowdb.KNOWN_GOOD


def test_run_names_are_mlflows():
    from mlflow.utils.name_utils import _GENERATOR_NOUNS, _GENERATOR_PREDICATES

    for _ in range(200):
        name = mlflowdb.random_run_name()
        adjective, noun, number = name.split("-")
        assert adjective in _GENERATOR_PREDICATES and noun in _GENERATOR_NOUNS and 0 <= int(number) <= 1000 and len(name) <= 20


@pytest.mark.parametrize("value", ['it\'s "quoted"', "back\\slash'", "plain"])
def test_a_workload_of_any_name_finds_its_parent_through_either_client(value, store_uri, radt_home):
    """Runs of one workload join one parent whatever its name: a name MLflow's filter cannot say is matched by radt."""
    for client in (tracking.connect(store_uri), MlflowClient(store_uri)):
        experiment_id = client.create_experiment(f"names {type(client).__name__}")
        first = tracking.find_or_create_workload(client, experiment_id, value)
        tracking.find_or_create_workload(client, experiment_id, value + " other")
        assert tracking.find_or_create_workload(client, experiment_id, value) == first
        found = tracking.find_runs(client, [experiment_id], {"radt.workload": value, "radt.role": "workload"}, status="RUNNING")
        assert [r.info.run_id for r in found] == [first]


def _lagging_clock(start: int = 2_000_000_000_000):
    """A clock that each call puts 7 ms earlier: every radt that starts later is on a host whose clock lags more."""
    ticks = itertools.count(start, -7)
    lock = threading.Lock()

    def now() -> int:
        with lock:
            return next(ticks)

    return now


@pytest.mark.parametrize("client_kind", ["radt", "mlflow"])
def test_radts_started_together_on_hosts_whose_clocks_differ_share_one_parent(client_kind, store_uri, radt_home, monkeypatch):
    """Four `-w` runs of one workload starting at once, each dated earlier than the one before (clock skew between
    nodes): one parent run, and every radt got its id (two parents named "workload 7" were seen under CI load)."""
    from radt.collectors.store import sqltracking

    monkeypatch.setenv("RADT_PARENT_SETTLE", QUICK_PERIODS["RADT_PARENT_SETTLE"])  # the period radts racing through a server keep
    clock = _lagging_clock()
    monkeypatch.setattr(sqltracking, "now_ms", clock)
    monkeypatch.setattr("mlflow.tracking._tracking_service.client.get_current_time_millis", clock)
    connect = tracking.connect if client_kind == "radt" else MlflowClient
    experiment_id = connect(store_uri).create_experiment(f"skewed clocks {client_kind}")
    clients = [connect(store_uri) for _ in range(4)]
    for attempt in range(4):
        workload = f"workload {attempt}"
        barrier = threading.Barrier(len(clients))
        got: list[str] = []

        def start(client, barrier: threading.Barrier, got: list[str], workload: str) -> None:
            barrier.wait()
            got.append(tracking.find_or_create_workload(client, experiment_id, workload))

        threads = [threading.Thread(target=start, args=(client, barrier, got, workload)) for client in clients]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        parents = tracking.find_runs(clients[0], [experiment_id], {"radt.workload": workload, "radt.role": "workload"})
        assert len(parents) == 1, f"{workload}: {len(parents)} parent runs"
        assert got == [parents[0].info.run_id] * len(clients)
