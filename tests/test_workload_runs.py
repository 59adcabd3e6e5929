"""`radt -w NAME train.py`: runs of one workload, started by hand, side by side or one after another.

Each run gets its own letter (A, B, ...) even when both start in the same second; the workload's
parent run stays RUNNING while any of its runs runs, and ends with the worst status of its runs
(FAILED > KILLED > FINISHED), whatever order they end in.
"""

from __future__ import annotations

import subprocess

import pytest
from mlflow import MlflowClient

from tests.support.polling import wait_for
from tests.support.radtproc import DEFAULT_PERIODS, radt_command, radt_env, run_radt

WAIT_FOR_GO = """
import os, sys, time
open(sys.argv[1] + f"-started-{os.getpid()}", "w").close()  # the run exists, with its letter, once its script runs
while not os.path.exists(sys.argv[1]):
    time.sleep(0.02)
"""


def _workload(client: MlflowClient, experiment: str):
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if r.data.tags.get("radt.role") == "workload"]
    children = [r for r in runs if r.data.tags.get("radt.role") == "run"]
    assert len(parents) == 1, [r.info.run_name for r in parents]
    return parents[0], children


@pytest.mark.dialects  # radts racing for one parent: each database's own locking
def test_runs_started_together_get_their_own_letters_and_the_parent_waits_for_both(store_uri, radt_home, tmp_path):
    (tmp_path / "wait.py").write_text(WAIT_FOR_GO)
    go = tmp_path / "go"
    env = radt_env(radt_home, store_uri, extra=DEFAULT_PERIODS)  # the parents' real settle period (1 s), which the race is about
    started = [
        subprocess.Popen(
            radt_command("-e", "side by side", "-w", "7", "-l", "host", "wait.py", str(go)), env=env, cwd=tmp_path, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    try:
        wait_for(lambda: len(list(tmp_path.glob("go-started-*"))) == 2, what="both scripts running")
        parent, children = _workload(MlflowClient(store_uri), "side by side")
        assert sorted(c.data.tags["radt.letter"] for c in children) == ["A", "B"]
        assert parent.info.status == "RUNNING"
    finally:
        go.touch()
        errors = [p.communicate(timeout=120)[1] for p in started]
    assert [p.returncode for p in started] == [0, 0], errors
    parent, children = _workload(MlflowClient(store_uri), "side by side")
    assert sorted(c.data.tags["radt.letter"] for c in children) == ["A", "B"], "a letter, once taken, stays"
    assert (parent.info.status, [c.info.status for c in children]) == ("FINISHED", ["FINISHED", "FINISHED"])


def test_the_parent_ends_with_the_worst_status_of_its_runs(store_uri, radt_home, tmp_path):
    (tmp_path / "fail.py").write_text("raise SystemExit(3)\n")
    (tmp_path / "ok.py").write_text("print('ok')\n")
    env = radt_env(radt_home, store_uri)
    client = MlflowClient(store_uri)

    failed = run_radt(["-e", "worst", "-w", "1", "-l", "host", "fail.py"], env=env, cwd=tmp_path)
    assert failed.returncode == 3, failed.stderr
    assert _workload(client, "worst")[0].info.status == "FAILED"

    later = run_radt(["-e", "worst", "-w", "1", "-l", "host", "ok.py"], env=env, cwd=tmp_path)
    assert later.returncode == 0, later.stderr
    parent, children = _workload(client, "worst")
    assert sorted(c.data.tags["radt.letter"] for c in children) == ["A", "B"], "the later run takes the next letter"
    assert sorted(c.info.status for c in children) == ["FAILED", "FINISHED"]
    assert parent.info.status == "FAILED", "a run that ends well does not hide the one that failed"


def test_a_run_joining_an_ended_workload_reopens_it(radt_home, tmp_path, sqlite_template):
    import shutil

    store = tmp_path / "store.db"
    shutil.copy(sqlite_template, store)
    uri = f"sqlite:///{store}"
    (tmp_path / "ok.py").write_text("print('ok')\n")
    (tmp_path / "wait.py").write_text(WAIT_FOR_GO)
    env = radt_env(radt_home, uri)
    assert run_radt(["-e", "again", "-w", "w", "-l", "host", "ok.py"], env=env, cwd=tmp_path).returncode == 0
    client = MlflowClient(uri)
    assert _workload(client, "again")[0].info.status == "FINISHED"
    go = tmp_path / "go"
    joining = subprocess.Popen(
        radt_command("-e", "again", "-w", "w", "-l", "host", "wait.py", str(go)), env=env, cwd=tmp_path, stderr=subprocess.PIPE, text=True
    )
    try:
        wait_for(lambda: list(tmp_path.glob("go-started-*")), what="the second run's script")
        assert _workload(client, "again")[0].info.status == "RUNNING", "a workload with a running run is RUNNING"
    finally:
        go.touch()
        _, err = joining.communicate(timeout=120)
    assert joining.returncode == 0, err
    assert _workload(client, "again")[0].info.status == "FINISHED"
