"""Creating a store is serialised: radts started at the same moment on a store that does not exist yet (a Slurm array,
a CSV's first runs, a sweep's workers) all record; none meets another's half-made schema (issue #52, item 11).
"""

from __future__ import annotations

import fcntl
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa
from mlflow import MlflowClient

from radt import rollups, summarytable
from tests.support import postgres
from tests.support.polling import wait_for
from tests.support.radtproc import radt_env, run_radt

TOGETHER = 8
# `radt ARGS` once the barrier file appears: radt's modules imported first, so the eight reach the store in the same millisecond
AT_BARRIER = (
    "import os, sys, time; from pathlib import Path; from radt.cli import main; import radt.collectors.cli, radt.collectors.store.tracking; "
    "barrier = Path(sys.argv[1]); Path(sys.argv[2]).touch()\n"
    "while not barrier.exists(): time.sleep(0.001)\n"
    "sys.exit(main(sys.argv[3:]))"
)


def _new_postgres() -> tuple[str, str]:
    """A database just created, empty: no MLflow tables, no radt tables."""
    name = f"{postgres.TEST_PREFIX}new_{uuid.uuid4().hex[:10]}"
    engine = postgres.admin_engine()
    with engine.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    engine.dispose()
    return postgres.pg_url(name), name


def _start_together(uri: str, home: Path, folder: Path) -> list[subprocess.Popen]:
    """TOGETHER `radt -e together -l host tiny.py`, released at once from a barrier."""
    (folder / "tiny.py").write_text("print('tiny')\n")
    barrier = folder / "go"
    env = radt_env(home, uri)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", AT_BARRIER, str(barrier), str(folder / f"ready-{i}"), "-e", "together", "-l", "host", "tiny.py"],
            env=env,
            cwd=folder,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(TOGETHER)
    ]
    wait_for(lambda: all((folder / f"ready-{i}").exists() for i in range(TOGETHER)), timeout=120, what="every radt at the barrier")
    barrier.touch()
    return procs


def _assert_all_recorded(uri: str, procs: list[subprocess.Popen]) -> None:
    outputs = [p.communicate(timeout=300) for p in procs]
    failed = [(p.returncode, err.strip().splitlines()[-3:]) for p, (_out, err) in zip(procs, outputs) if p.returncode != 0]
    assert not failed, f"{len(failed)} of {TOGETHER} radts failed on a new store: {failed}"
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("together")
    runs = client.search_runs([experiment.experiment_id])
    assert sorted(r.info.status for r in runs) == ["FINISHED"] * TOGETHER
    engine = sa.create_engine(uri, poolclass=sa.pool.NullPool)
    with engine.connect() as conn:
        assert {rollups.rollups.name, rollups.series_state.name} <= set(sa.inspect(conn).get_table_names())
    engine.dispose()


def test_eight_radts_started_together_on_a_new_sqlite_file_all_record(radt_home, tmp_path):
    (tmp_path / "new").mkdir()
    uri = f"sqlite:///{tmp_path / 'new' / 'fresh.db'}"
    _assert_all_recorded(uri, _start_together(uri, radt_home, tmp_path))


def test_eight_radts_started_together_on_a_new_postgresql_database_all_record(radt_home, tmp_path, request):
    request.getfixturevalue("pg_template")  # skips (or fails under CI) where PostgreSQL is unreachable
    uri, name = _new_postgres()
    try:
        _assert_all_recorded(uri, _start_together(uri, radt_home, tmp_path))
    finally:
        postgres.drop_databases([name])


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
@pytest.mark.parametrize("make", [rollups.ensure_table, summarytable.ensure_table], ids=["rollups", "summaries"])
def test_radts_own_tables_made_by_eight_processes_at_once(make, backend, tmp_path, request):
    """radt's tables beside MLflow's, created by every writer and dashboard that finds them missing: the losers find them made."""
    name = None
    if backend == "sqlite":
        uri = f"sqlite:///{tmp_path / 'store.db'}"
    else:
        request.getfixturevalue("pg_template")
        uri, name = _new_postgres()
    try:
        _make_together(make, uri, tmp_path)
    finally:
        if name:
            postgres.drop_databases([name])


def _make_together(make, uri: str, tmp_path: Path) -> None:
    code = (
        "import sys, time; from pathlib import Path; import sqlalchemy as sa; from radt import rollups, summarytable\n"
        f"make = {make.__module__.rsplit('.', 1)[1]}.ensure_table; engine = sa.create_engine(sys.argv[1])\n"
        "Path(sys.argv[3]).touch()\n"
        "while not Path(sys.argv[2]).exists(): time.sleep(0.001)\n"
        "make(engine)"
    )
    barrier = tmp_path / "go"
    procs = [
        subprocess.Popen([sys.executable, "-c", code, uri, str(barrier), str(tmp_path / f"ready-{i}")], stderr=subprocess.PIPE, text=True)
        for i in range(TOGETHER)
    ]
    wait_for(lambda: all((tmp_path / f"ready-{i}").exists() for i in range(TOGETHER)), timeout=60, what="every process at the barrier")
    barrier.touch()
    errors = [p.communicate(timeout=60)[1] for p in procs]
    failed = [next(line for line in reversed(err.splitlines()) if "Error" in line) for p, err in zip(procs, errors) if p.returncode != 0]
    assert not failed, f"{len(failed)} of {TOGETHER} failed: {failed}"


def test_a_loser_that_fails_on_the_first_table_before_the_winner_made_the_second_makes_it(tmp_path):
    """The race CI met (3 of 8 failed): SQLite commits each CREATE alone, so the winner had made radt_rollups but not yet
    radt_series_state when a loser's CREATE of radt_rollups failed; the loser raised instead of making the second table."""
    uri = f"sqlite:///{tmp_path / 'store.db'}"
    winner, loser = sa.create_engine(uri), sa.create_engine(uri)

    def winner_commits_first_table(target, connection, **kw):  # between the loser's check and its CREATE
        with winner.begin() as conn:
            conn.execute(sa.schema.CreateTable(rollups.rollups))

    sa.event.listen(rollups.rollups, "before_create", winner_commits_first_table, once=True)
    try:
        rollups.ensure_table(loser)
    finally:
        if sa.event.contains(rollups.rollups, "before_create", winner_commits_first_table):
            sa.event.remove(rollups.rollups, "before_create", winner_commits_first_table)
    assert {"radt_rollups", "radt_rollup_series"} <= set(sa.inspect(loser).get_table_names())


def test_a_radt_that_waits_past_the_deadline_for_another_creating_the_store_says_so_in_one_line(radt_home, tmp_path):
    """A creator that hangs (its lock held, no schema yet): the waiter looks again at its deadline, then one line, exit 2."""
    (tmp_path / "tiny.py").write_text("print('tiny')\n")
    db = tmp_path / "fresh.db"
    with open(f"{db}.lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        done = run_radt(["-l", "host", "tiny.py"], radt_env(radt_home, f"sqlite:///{db}", extra={"RADT_STORE_CREATE_TIMEOUT": "1"}), tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"radt: the tracking store sqlite:///{db} is still being created by another process after 1 s (it holds {db}.lock); "
        "let it finish, or raise RADT_STORE_CREATE_TIMEOUT"
    )


def test_a_postgresql_database_that_does_not_exist_is_one_line_naming_the_fix(radt_home, tmp_path, request):
    """radt makes a new database's tables (above), never the database itself: a typo in its name would get an empty store."""
    request.getfixturevalue("pg_template")
    (tmp_path / "tiny.py").write_text("print('tiny')\n")
    name = f"{postgres.TEST_PREFIX}absent_{uuid.uuid4().hex[:10]}"
    done = run_radt(["-l", "host", "tiny.py"], radt_env(radt_home, postgres.pg_url(name)), tmp_path)
    host, port, _ = postgres.address(postgres.pg_url(name))
    user = postgres.pg_url(name).split("://", 1)[1].split("@", 1)[0]
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"radt: the PostgreSQL server of {postgres.pg_url(name)} has no database '{name}'; create it (createdb -h {host} -p {port} -U {user} {name}) "
        "or fix its name in the URI"
    )
