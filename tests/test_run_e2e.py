"""`radt train.py ...` end to end, as a user runs it: real MLflow, real SQLite/PostgreSQL (through a real `mlflow server`:
tests/test_artifacts_shared.py, on its server).

The only fake is the absence of a GPU: these runs use the host listener on CPU scripts.
Every wait is on a condition (a file, a row in the store, a line on stderr), never a fixed sleep.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import textwrap
from importlib import metadata
from pathlib import Path

import psutil
import pytest
import sqlalchemy as sa
from mlflow import MlflowClient

from tests.support.polling import wait_for
from tests.support.ports import free_port
from tests.support.postgres import address
from tests.support.proxy import TcpProxy
from tests.support.radtproc import radt_command, radt_env, run_radt

TRAIN = textwrap.dedent(
    """
    import argparse, os, sys, time
    import mlflow
    import radt

    p = argparse.ArgumentParser()
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--epoch-seconds", type=float, default=0.6)
    a = p.parse_args()
    print("visible:", os.environ.get("CUDA_VISIBLE_DEVICES"), flush=True)
    with radt.run() as run:
        for epoch in range(a.epochs):
            t = time.time()
            time.sleep(a.epoch_seconds)  # an epoch (sleeping: CPU burnt here would only slow the tests beside this one)
            mlflow.log_metric("loss", 1.0 / (epoch + 1), step=epoch)
            run.log_metric("epoch_time", time.time() - t, step=epoch)
            print(f"epoch {epoch} loss {1.0 / (epoch + 1):.3f}", flush=True)
    """
)


def _script(tmp_path: Path, body: str, name: str = "train.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def _only_run(client: MlflowClient, experiment: str):
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None, f"experiment {experiment} was not created"
    runs = [r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("radt.role") == "run"]
    assert len(runs) == 1
    return runs[0]


def _steps(client: MlflowClient, run_id: str, key: str) -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run_id, key))


@pytest.mark.dialects  # the CLI run's PostgreSQL end to end; the others here take SQLite (or pg_uri where the server matters)
def test_tracks_a_script_like_python_would_run_it(store_uri, radt_home, tmp_path):
    _script(tmp_path, TRAIN)
    result = run_radt(
        ["-e", "e2e", "-n", "first", "-l", "top+ps", "--interval", "0.2", "--max-epoch", "2", "train.py", "--batch-size", "256", "--epochs", "6"],
        env=radt_env(radt_home, store_uri),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "epoch 0 loss 1.000" in result.stdout  # the script's output reaches the terminal
    assert "Traceback" not in result.stderr

    client = MlflowClient(store_uri)
    run = _only_run(client, "e2e")
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "first"
    params = run.data.params
    assert params["batch-size"] == "256" and params["epochs"] == "6"
    assert params["command"].endswith("train.py --batch-size 256 --epochs 6")
    assert params["max_epoch"] == "2"
    tags = run.data.tags
    assert tags["radt.listeners"] == "host" and tags["radt.stop_reason"] == "max_epoch"
    assert tags["radt.host"] == socket.gethostname()
    assert tags["radt.version"] == metadata.version("radt"), "which radt recorded the run's numbers"
    # the script's own metrics joined the same run; --max-epoch 2 stopped it after epoch 2
    assert _steps(client, run.info.run_id, "loss") == [0, 1, 2]
    cpu = client.get_metric_history(run.info.run_id, "system/cpu_utilization_percentage")
    assert len(cpu) >= 5
    steps = [m.step for m in sorted(cpu, key=lambda m: m.timestamp)]
    assert steps == sorted(steps) and len(set(steps)) == len(steps), "one increasing step per sample"
    assert all(0 <= m.value <= 100 for m in cpu)
    rss = client.get_metric_history(run.info.run_id, "system/process_memory_rss_megabytes")
    assert rss and max(m.value for m in rss) > 5, "the training process tree's memory is measured"
    latest = run.data.metrics["system/cpu_utilization_percentage"]
    assert latest == max(cpu, key=lambda m: (m.step, m.timestamp)).value
    artifacts = {f.path for f in client.list_artifacts(run.info.run_id, "radt")}
    assert {"radt/stdout.log", "radt/stderr.log", "radt/pip-freeze.txt", "radt/gpu-inventory.json"} <= artifacts
    stdout_log = Path(client.download_artifacts(run.info.run_id, "radt/stdout.log", str(tmp_path)))
    assert "epoch 1 loss" in stdout_log.read_text()
    freeze = Path(client.download_artifacts(run.info.run_id, "radt/pip-freeze.txt", str(tmp_path))).read_text()
    assert "mlflow==" in freeze.lower()


def test_failing_script_ends_failed_with_its_exit_code(store_uri, radt_home, tmp_path):
    _script(tmp_path, "import sys\nprint('about to fail', flush=True)\nraise SystemExit(3)\n", "crash.py")
    result = run_radt(["-e", "crash", "-l", "host", "--interval", "0.2", "crash.py"], env=radt_env(radt_home, store_uri), cwd=tmp_path)
    assert result.returncode == 3
    run = _only_run(MlflowClient(store_uri), "crash")
    assert run.info.status == "FAILED"
    assert run.data.tags["radt.exit_code"] == "3"
    assert f"radt: run {run.info.run_id} FAILED (the script exited with status 3), " in result.stderr, "the last line says why"


def test_a_script_killed_by_a_signal_ends_failed_and_says_which(radt_home, tmp_path, empty_sqlite):
    """A segfault (a CUDA extension, a driver) ended with 'run ... FAILED, 11 points written': nothing said it was a signal."""
    _script(tmp_path, "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n", "segv.py")
    store = empty_sqlite(tmp_path / "store.db")
    result = run_radt(["-e", "segv", "-l", "host", "segv.py"], env=radt_env(radt_home, store), cwd=tmp_path)
    assert result.returncode == 128 + 11, "a shell's status for a signal"
    run = _only_run(MlflowClient(store), "segv")
    assert run.info.status == "FAILED" and run.data.tags["radt.exit_code"] == "-11"
    assert result.stderr.splitlines()[-1].startswith(f"radt: run {run.info.run_id} FAILED (the script was killed by SIGSEGV), "), result.stderr


def test_python_exception_is_logged_and_run_failed(store_uri, radt_home, tmp_path):
    _script(tmp_path, "raise RuntimeError('CUDA out of memory (pretend)')\n", "oom.py")
    result = run_radt(["-e", "oom", "-l", "host", "oom.py"], env=radt_env(radt_home, store_uri), cwd=tmp_path)
    assert result.returncode == 1
    assert "CUDA out of memory (pretend)" in result.stderr  # streamed to the terminal
    client = MlflowClient(store_uri)
    run = _only_run(client, "oom")
    assert run.info.status == "FAILED"
    log = Path(client.download_artifacts(run.info.run_id, "radt/stderr.log", str(tmp_path))).read_text()
    assert "RuntimeError: CUDA out of memory (pretend)" in log


LOOP_FOREVER = """
    import os, subprocess, sys, time
    helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    open("ready.json", "w").write('{"pid": %d, "helper": %d}' % (os.getpid(), helper.pid))
    while True:
        sum(i for i in range(2000))
        time.sleep(0.01)
"""


def _system_points(uri: str, key: str = "system/cpu_utilization_percentage") -> int:
    engine = sa.create_engine(uri.replace("postgresql://", "postgresql+psycopg2://"))
    try:
        with engine.connect() as conn:
            return conn.execute(sa.text("select count(*) from metrics where key = :k"), {"k": key}).scalar()
    except Exception:
        return 0
    finally:
        engine.dispose()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_kills_the_script_and_its_children(store_uri, radt_home, tmp_path, sig):
    _script(tmp_path, LOOP_FOREVER, "loop.py")
    proc = subprocess.Popen(
        radt_command("-e", "interrupt", "-l", "host", "--interval", "0.2", "loop.py"),
        env=radt_env(radt_home, store_uri),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    ready = tmp_path / "ready.json"
    wait_for(lambda: ready.exists() and ready.read_text().endswith("}"), what="the script to start")
    wait_for(lambda: _system_points(store_uri) >= 2, what="samples in the store")
    pids = json.loads(ready.read_text())
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, stderr
    for pid in pids.values():
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, f"pid {pid} outlived radt"
    run = _only_run(MlflowClient(store_uri), "interrupt")
    assert run.info.status == "KILLED"
    assert "Traceback (most recent call last)" not in stderr.split("radt:")[-1]


def test_max_time_stops_a_script_without_the_context_api(radt_home, tmp_path, empty_sqlite):
    store = empty_sqlite(tmp_path / "mt.db")
    _script(tmp_path, LOOP_FOREVER, "loop.py")
    result = run_radt(["-e", "mt", "-l", "host", "--max-time", "0.03", "loop.py"], env=radt_env(radt_home, store), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "--max-time reached" in result.stderr
    run = _only_run(MlflowClient(store), "mt")
    assert run.info.status == "FINISHED" and run.data.tags["radt.stop_reason"] == "max_time"
    assert (run.info.end_time - run.info.start_time) / 1000 < 30
    pids = json.loads((tmp_path / "ready.json").read_text())
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids.values())


def test_manual_mode_samples_from_the_context_on(radt_home, tmp_path, empty_sqlite):
    store = empty_sqlite(tmp_path / "manual.db")
    _script(
        tmp_path,
        """
        import time, radt
        time.sleep(1.5)  # set-up (data loading) radt must not sample
        entered = time.time()
        with radt.run() as run:
            open("entered", "w").write(repr(entered))
            t = time.time()
            while time.time() - t < 1.2:
                pass
        """,
        "manual.py",
    )
    result = run_radt(["-e", "manual", "-l", "host", "--interval", "0.2", "--manual", "manual.py"], env=radt_env(radt_home, store), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    entered_ms = float((tmp_path / "entered").read_text()) * 1000
    client = MlflowClient(store)
    run = _only_run(client, "manual")
    history = client.get_metric_history(run.info.run_id, "system/system_memory_usage_megabytes")
    assert len(history) >= 3
    assert min(m.timestamp for m in history) >= entered_ms - 50, "no sample before the context was entered"


def test_workload_groups_runs_under_a_parent(store_uri, radt_home, tmp_path):
    _script(tmp_path, "print('hi')\n", "tiny.py")
    env = radt_env(radt_home, store_uri)
    for letter in ("A", "B"):
        result = run_radt(["-e", "wl", "-w", "7", "-l", "host", "--letter", letter, "tiny.py"], env=env, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
    client = MlflowClient(store_uri)
    exp = client.get_experiment_by_name("wl")
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if r.data.tags.get("radt.role") == "workload"]
    children = [r for r in runs if r.data.tags.get("radt.role") == "run"]
    assert len(parents) == 1 and len(children) == 2
    assert parents[0].data.tags["radt.workload"] == "7"
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parents[0].info.run_id}
    assert sorted(c.data.tags["radt.letter"] for c in children) == ["A", "B"]
    assert parents[0].info.status == "FINISHED"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["missing.py"], "script 'missing.py' not found"),
        (["-l", "smi+gpuz", "ok.py"], "unknown listener 'gpuz'"),
        (["-l", "nsys", "ok.py"], "needs 'nsys' on PATH"),
        (["--dry-run", "ok.py"], "--dry-run and --rerun are for CSV experiments"),
        (["--slurm", "ok.py"], "--slurm is for CSV experiments"),
        (["-e", "x", "-d", "0", "exp.csv"], "-e, -d do not apply to a CSV experiment; set Experiment, Workload, Devices and Listeners per row"),
        (["exp.csv", "--epochs", "3"], "a CSV experiment takes no script arguments (--epochs 3); put them in the Params column"),
        (["missing.csv"], "experiment file 'missing.csv' not found"),
        (["-d", "zero", "ok.py"], "bad -d 'zero'"),
        (["--interval", "0.01", "ok.py"], "--interval 0.01 is too short"),
        (["--interval", "fast", "ok.py"], "invalid float value"),
    ],
)
def test_user_mistakes_give_one_line_and_exit_2(radt_home, tmp_path, args, needle):
    _script(tmp_path, "print('ok')\n", "ok.py")
    result = run_radt(args, env=radt_env(radt_home, f"sqlite:///{tmp_path / 'u.db'}"), cwd=tmp_path, timeout=60)
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert needle in lines[0] and "Traceback" not in result.stderr
    assert not (tmp_path / "u.db").exists() or "missing" not in args[0], "nothing is created for a refused command"


def test_unreachable_store_is_one_line(radt_home, tmp_path):
    _script(tmp_path, "print('ok')\n", "ok.py")
    port = free_port()  # a port nobody listens on
    result = run_radt(["ok.py"], env=radt_env(radt_home, f"postgresql://postgres@127.0.0.1:{port}/mlflow"), cwd=tmp_path, timeout=60)
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("radt: cannot reach the tracking store postgresql://postgres@127.0.0.1") and "MLFLOW_TRACKING_URI" in lines[0]


def test_store_outage_mid_run_loses_no_point(pg_uri, radt_home, tmp_path):
    host, port, database = address(pg_uri)
    proxy = TcpProxy(host, port).start()
    via_proxy = f"postgresql://postgres@127.0.0.1:{proxy.port}/{database}"
    _script(
        tmp_path,
        """
        import os, time
        while not os.path.exists("finish"):
            sum(i for i in range(2000))
            time.sleep(0.01)
        """,
        "steady.py",
    )
    proc = subprocess.Popen(
        radt_command("-e", "outage", "-l", "host", "--interval", "0.2", "steady.py"),
        env=radt_env(radt_home, via_proxy),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: _system_points(pg_uri) >= 3, what="first samples")
        proxy.stop()
        spool = wait_for(lambda: next(radt_home.glob("runs/*/spool.jsonl"), None), what="samples spooled to disk")
        wait_for(lambda: len(spool.read_text().splitlines()) >= 3, what="several spooled batches")
        during = _system_points(pg_uri)
        proxy = TcpProxy(host, port, port=proxy.port).start()
        wait_for(lambda: _system_points(pg_uri) > during + 3, what="replay after the store came back")
        (tmp_path / "finish").write_text("")
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
        proxy.stop()
    assert proc.returncode == 0, stderr
    assert "store unreachable" in stderr and "store is back" in stderr
    client = MlflowClient(pg_uri)
    run = _only_run(client, "outage")
    assert run.info.status == "FINISHED"
    steps = _steps(client, run.info.run_id, "system/system_memory_usage_megabytes")
    assert steps == list(range(len(steps))) and len(steps) >= 10, "every tick is in the store exactly once"
    assert not list(radt_home.glob("runs/*/spool.jsonl"))


def test_store_down_at_exit_waits_for_radt_sync(pg_uri, radt_home, tmp_path):
    host, port, database = address(pg_uri)
    proxy = TcpProxy(host, port).start()
    via_proxy = f"postgresql://postgres@127.0.0.1:{proxy.port}/{database}"
    _script(tmp_path, "import os, time\nwhile not os.path.exists('finish'):\n    time.sleep(0.02)\n", "wait.py")
    env = radt_env(radt_home, via_proxy)
    proc = subprocess.Popen(
        radt_command("-e", "later", "-l", "host", "--interval", "0.2", "--flush-timeout", "1", "wait.py"),
        env=env,
        cwd=tmp_path,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: _system_points(pg_uri, "system/system_memory_usage_megabytes") >= 2, what="first samples")
        proxy.stop()
        wait_for(lambda: next(radt_home.glob("runs/*/spool.jsonl"), None), what="spooling")
        (tmp_path / "finish").write_text("")
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0
    assert "radt sync" in stderr
    assert next(radt_home.glob("runs/*/pending.json"), None) is not None
    proxy = TcpProxy(host, port, port=proxy.port).start()
    try:
        synced = run_radt(["sync"], env=env, cwd=tmp_path)
    finally:
        proxy.stop()
    assert synced.returncode == 0, synced.stderr
    client = MlflowClient(pg_uri)
    run = _only_run(client, "later")
    assert run.info.status == "FINISHED"
    steps = _steps(client, run.info.run_id, "system/system_memory_usage_megabytes")
    assert steps == list(range(len(steps)))
    assert not list(radt_home.glob("runs/*/pending.json")) and not list(radt_home.glob("runs/*/spool.jsonl"))


def test_radt_killed_hard_takes_the_script_along_and_sync_closes_the_run(radt_home, tmp_path, empty_sqlite):
    store = empty_sqlite(tmp_path / "hard.db")
    _script(tmp_path, LOOP_FOREVER, "loop.py")
    env = radt_env(radt_home, store)
    proc = subprocess.Popen(radt_command("-e", "hard", "-l", "host", "--interval", "0.2", "loop.py"), env=env, cwd=tmp_path, stderr=subprocess.DEVNULL)
    ready = tmp_path / "ready.json"
    wait_for(lambda: ready.exists() and ready.read_text().endswith("}"), what="the script to start")
    script_pid = json.loads(ready.read_text())["pid"]
    proc.kill()  # SIGKILL: radt gets no chance to clean up
    proc.wait(30)
    wait_for(lambda: not psutil.pid_exists(script_pid) or psutil.Process(script_pid).status() == psutil.STATUS_ZOMBIE, what="the script to die with radt")
    synced = run_radt(["sync"], env=env, cwd=tmp_path)
    assert synced.returncode == 0, synced.stderr
    client = MlflowClient(store)
    run = _only_run(client, "hard")
    assert run.info.status == "KILLED" and run.data.tags["radt.stop_reason"] == "radt_killed"
    assert "radt/stdout.log" in {f.path for f in client.list_artifacts(run.info.run_id, "radt")}
    again = run_radt(["sync"], env=env, cwd=tmp_path)
    assert again.returncode == 0 and "marked KILLED" not in again.stderr
    assert again.stderr.splitlines() == [f"radt sync: nothing waits in {radt_home / 'runs'}; every run recorded here has reached its store"], "said, not silent"
