"""radt killed with SIGKILL leaves nothing behind: no process of the training tree, no RUNNING run,
no start-gate folder, no MPS daemon, once the next radt command or `radt sync` has run.

Real `python -m radt` processes and real scripts that do what trainings do: fork workers, start
helpers that ignore SIGTERM or leave the session, daemonise. Every wait has a deadline.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from mlflow import MlflowClient

from radt.collectors.experiment.csvfile import ExperimentFile
from tests.support.polling import alive, gone_within, wait_for
from tests.support.radtproc import fake_tools_env, radt_command, radt_env, run_radt

GONE_WITHIN = 5.0  # seconds after radt's death by which no process of its tree may run

# a training script's process tree, all of it alive until someone kills it: a forked worker (as a
# DataLoader's), a helper that ignores SIGTERM, a helper in a session of its own with a child, and a
# daemon whose parent has exited (double fork); the script writes every pid to pids-<name>.json
TREE = textwrap.dedent(
    """
    import json, os, signal, subprocess, sys, time
    name = sys.argv[sys.argv.index("--name") + 1] if "--name" in sys.argv else "run"
    SLEEP = [sys.executable, "-c", "import time; time.sleep(600)"]
    pids = {"script": os.getpid()}
    worker = os.fork()
    if worker == 0:
        while True:
            time.sleep(1)
    pids["worker"] = worker
    stubborn = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
    pids["stubborn"] = stubborn.pid
    session = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; subprocess.Popen(sys.argv[1:]); time.sleep(600)", *SLEEP],
                               start_new_session=True)
    pids["new_session"] = session.pid
    r, w = os.pipe()
    middle = os.fork()
    if middle == 0:
        os.setsid()
        daemon = os.fork()
        if daemon == 0:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            while True:
                time.sleep(1)
        os.write(w, str(daemon).encode())
        os._exit(0)
    os.close(w)
    pids["daemon"] = int(os.read(r, 32))
    os.waitpid(middle, 0)
    children = f"/proc/{session.pid}/task/{session.pid}/children"
    while not open(children).read().split():
        time.sleep(0.01)
    pids["new_session_child"] = int(open(children).read().split()[0])
    tmp = f"pids-{name}.json.tmp"
    open(tmp, "w").write(json.dumps(pids))
    os.rename(tmp, f"pids-{name}.json")
    while True:
        time.sleep(0.05)
    """
)


def _pids(folder: Path, name: str = "run") -> dict[str, int]:
    path = folder / f"pids-{name}.json"
    return wait_for(lambda: path.exists() and json.loads(path.read_text()), timeout=90, what=f"the script {name} to start its tree")


def _run_folder(home: Path) -> Path:
    return wait_for(lambda: next((d for d in (home / "runs").glob("*") if (d / "meta.json").exists()), None), what="the run folder")


def _sampled(store: str, run_id: str, points: int = 2) -> bool:
    try:
        return len(MlflowClient(store).get_metric_history(run_id, "system/cpu_utilization_percentage")) >= points
    except Exception:
        return False


def _watchdogs(radt_pid: int) -> list[psutil.Process]:
    found = []
    for child in psutil.Process(radt_pid).children():
        try:
            if any("watchdog" in part for part in child.cmdline()):
                found.append(child)
        except psutil.Error:  # a child that has just ended (a zombie until radt reaps it) has no command line
            continue
    return found


# radt where no cgroup can be made (no cgroup2, an unprivileged user, a container without delegation): most users' case
WITHOUT_CGROUP = "import sys, radt.collectors.run.runner as r; r.make_cgroup = lambda name: None; from radt.collectors.cli import main; sys.argv[0] = 'radt'; sys.exit(main())"


def _start_tracked_tree(home: Path, folder: Path, store: str, cgroup: bool = True) -> tuple[subprocess.Popen, dict[str, int], str]:
    (folder / "tree.py").write_text(TREE)
    command = radt_command("-e", "orphans", "-l", "host", "--interval", "0.2", "tree.py")
    if not cgroup:
        command[1:3] = ["-c", WITHOUT_CGROUP]
    proc = subprocess.Popen(command, env=radt_env(home, store), cwd=folder)
    pids = _pids(folder)
    run_id = _run_folder(home).name
    wait_for(lambda: _sampled(store, run_id), what="samples of the running tree")
    # radt records the tree (tree.json) as its sampler sees it, at most once a second: wait for that record, which is what
    # the watchdog kills by (a process that left the script's session less than a second before a SIGKILL is caught only by a cgroup)
    wait_for(lambda: _recorded(home / "runs" / run_id, pids.values()), what="radt's record of the whole tree")
    return proc, pids, run_id


def _recorded(run_dir: Path, pids) -> bool:
    try:
        listed = {pid for pid, _start in json.loads((run_dir / "tree.json").read_text()).get("processes", [])}
    except (OSError, ValueError):
        return False
    return set(pids) <= listed


@pytest.mark.parametrize("cgroup", [True, False], ids=["cgroup", "no-cgroup"])
def test_sigkill_of_radt_leaves_no_process_and_sync_ends_the_run_killed(radt_home, tmp_path, cgroup, empty_sqlite):
    store = empty_sqlite(tmp_path / "store.db")
    proc, pids, run_id = _start_tracked_tree(radt_home, tmp_path, store, cgroup)
    watchdog = [p.pid for p in _watchdogs(proc.pid)]
    assert len(watchdog) == 1, "one watchdog per run"

    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    gone_within([*pids.values(), *watchdog], GONE_WITHIN)

    synced = run_radt(["sync"], env=radt_env(radt_home, store), cwd=tmp_path)
    assert synced.returncode == 0, synced.stderr
    run = MlflowClient(store).get_run(run_id)
    assert run.info.status == "KILLED" and run.data.tags["radt.stop_reason"] == "radt_killed"


def test_the_next_radt_finishes_the_job_when_radt_and_its_watchdog_were_killed(radt_home, tmp_path, empty_sqlite):
    store = empty_sqlite(tmp_path / "store.db")
    proc, pids, run_id = _start_tracked_tree(radt_home, tmp_path, store)
    for watchdog in _watchdogs(proc.pid):  # the OOM killer took both
        watchdog.kill()
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)

    (tmp_path / "tiny.py").write_text("print('next training')\n")
    following = run_radt(["-e", "orphans", "-l", "host", "tiny.py"], env=radt_env(radt_home, store), cwd=tmp_path)
    assert following.returncode == 0, following.stderr
    assert not alive(pids.values()), f"left alive: {alive(pids.values())}"
    assert f"run {run_id}" in following.stderr and "KILLED" in following.stderr
    client = MlflowClient(store)
    assert client.get_run(run_id).info.status == "KILLED"
    assert client.get_run(run_id).data.tags["radt.stop_reason"] == "radt_killed"
    stored = sum(len(client.get_metric_history(run_id, k)) for k in client.get_run(run_id).data.metrics if k.startswith("system/"))
    assert client.get_run(run_id).data.tags["radt.points"] == str(stored), "the reaper counts what the killed radt wrote (old: no tag)"
    runs = client.search_runs([client.get_experiment_by_name("orphans").experiment_id])
    assert sorted(r.info.status for r in runs) == ["FINISHED", "KILLED"]


def test_sync_never_touches_a_live_run_nor_a_reused_pid(radt_home, tmp_path, empty_sqlite):
    store = empty_sqlite(tmp_path / "store.db")
    proc, pids, run_id = _start_tracked_tree(radt_home, tmp_path, store)
    # a dead radt's folder whose record names a live process that is not its own (the pid was reused)
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    folder = radt_home / "runs" / ("0" * 32)
    (folder / "logs").mkdir(parents=True)
    meta = json.loads((_run_folder(radt_home) / "meta.json").read_text())
    (folder / "meta.json").write_text(json.dumps({**meta, "run_id": "0" * 32, "pid": dead.pid, "started": time.time() - 3600}))
    (folder / "tree.json").write_text(json.dumps({"radt": [dead.pid, 1], "root": stranger.pid, "processes": [[stranger.pid, 1]]}))
    try:
        synced = run_radt(["sync"], env=radt_env(radt_home, store), cwd=tmp_path)
        assert stranger.poll() is None, "a process whose start time differs from the record's is not the recorded one"
        assert sorted(alive(pids.values())) == sorted(pids.values()), "the live run's tree is untouched"
        assert MlflowClient(store).get_run(run_id).info.status == "RUNNING"
        assert proc.poll() is None
    finally:
        stranger.kill()
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
    assert "Traceback" not in synced.stderr
    gone_within(pids.values(), GONE_WITHIN)


HEADER = "Experiment,Workload,Status,Run,Devices,Collocation,File,Listeners,Params\n"


def test_sigkill_of_a_csv_experiment_leaves_nothing_running_after_sync(radt_home, tmp_path, pg_uri):
    (tmp_path / "tree.py").write_text(TREE)
    (tmp_path / "experiment.csv").write_text(HEADER + "orph,1,,,0,MPS,tree.py,top,--name A\norph,1,,,0,MPS,tree.py,top,--name B\n")
    env = radt_env(radt_home, pg_uri, extra=fake_tools_env(tmp_path))
    scheduler = subprocess.Popen(
        radt_command("--interval", "0.5", "experiment.csv"), cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        trees = {name: _pids(tmp_path, name) for name in ("A", "B")}
        exp = wait_for(
            lambda: (e := ExperimentFile.load(tmp_path / "experiment.csv")) and all(e.get(r, "Status") == "RUNNING" for r in e.rows) and e, what="RUNNING rows"
        )
        radts = psutil.Process(scheduler.pid).children()
        gates = {Path(p.cmdline()[p.cmdline().index("--start-gate") + 1]) for p in radts}
        watchdogs = [w.pid for p in radts for w in _watchdogs(p.pid)]
        assert len(gates) == 1 and all(g.is_dir() for g in gates) and len(watchdogs) == 2
    finally:
        scheduler.send_signal(signal.SIGKILL)
        scheduler.wait(10)
    everything = [pid for tree in trees.values() for pid in tree.values()] + [p.pid for p in radts] + watchdogs
    gone_within(everything, GONE_WITHIN)

    synced = run_radt(["sync"], env=env, cwd=tmp_path)
    assert synced.returncode == 0, synced.stderr
    client = MlflowClient(pg_uri)
    runs = client.search_runs([client.get_experiment_by_name("orph").experiment_id])
    assert len(runs) == 3 and not [r for r in runs if r.info.status == "RUNNING"], [(r.info.run_name, r.info.status) for r in runs]
    parent = next(r for r in runs if r.data.tags.get("radt.role") == "workload")
    assert parent.info.status == "KILLED" and parent.data.tags["radt.stop_reason"] == "radt_killed"
    assert {r.info.run_id for r in runs if r.data.tags.get("radt.role") == "run"} == {exp.get(r, "Run") for r in exp.rows}
    assert not any(g.exists() for g in gates), "the start-gate folder is removed"
    rows = ExperimentFile.load(tmp_path / "experiment.csv")
    assert [rows.get(r, "Status") for r in rows.rows] == ["KILLED", "KILLED"], "the CSV says what happened"
    assert json.loads((tmp_path / "tools-state.json").read_text())["mps"] == [], "the MPS daemon is quit"
