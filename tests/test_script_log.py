"""`with radt.run() as run: run.log_metric(...)` never holds the training: the calls go through radt's own
writer (script.jsonl in the run folder, read by radt's process), not MLflow in the script.

Real `python -m radt` processes, a real PostgreSQL behind tests/support/proxy.py (blackholed: it stops
answering without closing anything) and SQLite stores; every wait is on a condition.
"""

from __future__ import annotations

import os
import signal
import textwrap
import time
from pathlib import Path

import sqlalchemy as sa
from mlflow import MlflowClient

from radt.rundir import SCRIPT_ARTIFACTS_DIR, SCRIPT_LOG_FILE, SCRIPT_OFFSET_FILE
from tests.support.polling import gone_within, wait_for
from tests.support.postgres import address
from tests.support.proxy import TcpProxy
from tests.support.radtproc import LiveRadt, radt_env, run_radt

PACED = """
    import os, sys, time, radt
    open("pid", "w").write(str(os.getpid()))
    with radt.run() as run:
        run.log_param("lr", "0.1")
        step = 0
        try:
            while True:
                started = time.monotonic()
                run.log_metric("loss", 1.0 / (step + 1), step=step)
                took = time.monotonic() - started
                with open("steps.txt", "a") as out:
                    out.write(f"{step} {took:.4f}\\n")
                if step == 0:
                    open("mlflow-imported.txt", "w").write(str("mlflow" in sys.modules))
                step += 1
                time.sleep(0.02)  # an iteration
        except KeyboardInterrupt:
            open("interrupted", "w").write(str(step))
"""


def _script(folder: Path, body: str, name: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(body))
    return path


def _steps(folder: Path) -> list[tuple[int, float]]:
    """(step, seconds its log_metric took) for each iteration the script finished."""
    try:
        text = (folder / "steps.txt").read_text()
    except FileNotFoundError:
        return []
    return [(int(step), float(took)) for step, took in (line.split() for line in text.splitlines() if line.count(" ") == 1)]


def _stored_steps(uri: str, run_id: str, key: str = "loss") -> list[int]:
    try:
        return sorted(m.step for m in MlflowClient(uri).get_metric_history(run_id, key))
    except Exception:  # SQLite busy with radt's writer
        return []


def test_log_metric_keeps_its_pace_while_postgres_hangs_and_ctrl_c_is_prompt(pg_uri, radt_home, tmp_path):
    host, port, database = address(pg_uri)
    proxy = TcpProxy(host, port).start()
    env = radt_env(radt_home, f"postgresql://postgres@127.0.0.1:{proxy.port}/{database}", extra={"RADT_STORE_TIMEOUT": "2"})  # a hang seen in 2 s
    _script(tmp_path, PACED, "paced.py")
    radt = LiveRadt(["-e", "paced", "-l", "host", "--interval", "0.2", "--flush-timeout", "3", "paced.py"], env, tmp_path)
    try:
        run_id = radt.run_id()
        wait_for(lambda: len(_stored_steps(pg_uri, run_id)) >= 5, what="the script's first losses in the store")
        proxy.blackhole()  # PostgreSQL stops answering; nothing is closed
        radt.line("store not answering")
        hung_at = len(_steps(tmp_path))
        wait_for(lambda: len(_steps(tmp_path)) >= hung_at + 100, timeout=30, what="100 iterations while the store hangs")
        slowest = max(took for _, took in _steps(tmp_path)[hung_at:])
        pid = int((tmp_path / "pid").read_text())
        interrupted = time.monotonic()
        radt.proc.send_signal(signal.SIGINT)  # Ctrl-C
        stopped = gone_within([pid], 10)
        code = radt.wait(30)
        radt_took = time.monotonic() - interrupted
        proxy.resume()
        synced = run_radt(["sync"], env=env, cwd=tmp_path)
    finally:
        radt.end()
        proxy.stop()
    assert slowest < 0.5, f"a log_metric took {slowest:.2f} s while the store hung"
    assert stopped < 2, f"the script ended {stopped:.1f} s after Ctrl-C"
    assert (tmp_path / "interrupted").exists() and "Traceback" not in radt.stderr, radt.stderr
    assert code == 0 and radt_took < 3 + 5, (code, radt_took)  # the script's own status; --flush-timeout 3 bounds radt's exit
    assert (tmp_path / "mlflow-imported.txt").read_text() == "False", "the script never imports MLflow"
    assert synced.returncode == 0, synced.stderr
    last = _steps(tmp_path)[-1][0]
    stored = _stored_steps(pg_uri, run_id)
    assert stored[: last + 1] == list(range(last + 1)), f"losses missing in the store: {sorted(set(range(last + 1)) - set(stored))[:10]}"
    run = MlflowClient(pg_uri).get_run(run_id)
    assert run.data.params["lr"] == "0.1" and run.info.status == "KILLED"


CALLS = """
    import os, sys, radt
    with radt.run() as run:
        run.log_params({"lr": 0.1, "layers": 3})
        run.set_tag("team", "vision")
        for epoch in range(5):
            run.log_metrics({"loss": 1.0 / (epoch + 1), "acc": epoch / 5}, step=epoch)
            run.log_metric("bad key?", 1.0, step=epoch)  # not a name MLflow takes: radt says so, the training goes on
        open("model.txt", "w").write("weights")
        run.log_artifact("model.txt")
        os.makedirs("plots", exist_ok=True)
        open("plots/a.txt", "w").write("a")
        run.log_artifact("plots", "figures")
    os.remove("model.txt")  # copied at the call: what the script does with it afterwards is its own business
    print("mlflow imported:", "mlflow" in sys.modules, flush=True)
"""


def test_params_tags_metrics_and_artifacts_reach_the_run_without_mlflow_in_the_script(radt_home, tmp_path, empty_sqlite):
    store = empty_sqlite(tmp_path / "s.db")
    _script(tmp_path, CALLS, "calls.py")
    result = run_radt(["-e", "calls", "-l", "host", "calls.py"], env=radt_env(radt_home, store), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "mlflow imported: False" in result.stdout
    assert "Traceback" not in result.stderr
    said = [line for line in result.stderr.splitlines() if "bad key?" in line]
    assert len(said) == 1 and said[0].startswith("radt: the script's invalid metric key 'bad key?'"), result.stderr
    client = MlflowClient(store)
    run = client.search_runs([client.get_experiment_by_name("calls").experiment_id], "tags.`radt.role` = 'run'")[0]
    run_id = run.info.run_id
    assert run.info.status == "FINISHED"
    assert run.data.params["lr"] == "0.1" and run.data.params["layers"] == "3" and run.data.tags["team"] == "vision"
    assert _stored_steps(store, run_id) == [0, 1, 2, 3, 4] and _stored_steps(store, run_id, "acc") == [0, 1, 2, 3, 4]
    assert "bad key?" not in run.data.metrics
    engine = sa.create_engine(store)
    with engine.connect() as conn:
        system = conn.execute(sa.text("select count(*) from metrics where run_uuid = :r and key like 'system/%'"), {"r": run_id}).scalar_one()
    engine.dispose()
    assert int(run.data.tags["radt.points"]) == system, "radt.points counts the system points, as `radt sync` does"
    assert {f.path for f in client.list_artifacts(run_id)} >= {"model.txt", "figures"}
    assert [f.path for f in client.list_artifacts(run_id, "figures")] == ["figures/plots"]
    assert Path(client.download_artifacts(run_id, "model.txt", str(tmp_path / "down"))).read_text() == "weights"
    run_dir = radt_home / "runs" / run_id
    assert int((run_dir / SCRIPT_OFFSET_FILE).read_text()) == (run_dir / SCRIPT_LOG_FILE).stat().st_size, "all of it handed on"
    assert not any((run_dir / SCRIPT_ARTIFACTS_DIR).iterdir()), "the copies go once uploaded"


LOGGING = """
    import os, time, radt
    with radt.run() as run:
        step = 0
        while True:
            run.log_metric("loss", 1.0 / (step + 1), step=step)
            with open("steps.txt", "a") as out:
                out.write(f"{step} 0\\n")
            step += 1
            time.sleep(0.01)
"""


def test_what_a_sigkilled_radt_had_not_read_is_sent_by_sync(radt_home, tmp_path, empty_sqlite):
    store = empty_sqlite(tmp_path / "s.db")
    env = radt_env(radt_home, store)
    _script(tmp_path, LOGGING, "train_forever.py")
    radt = LiveRadt(["-e", "killed", "-l", "host", "train_forever.py"], env, tmp_path)
    try:
        run_id = radt.run_id()
        wait_for(lambda: _stored_steps(store, run_id), what="the script's first loss in the store")
        os.kill(radt.pid, signal.SIGSTOP)  # radt reads nothing more; the script goes on logging
        stopped_at = len(_steps(tmp_path))
        wait_for(lambda: len(_steps(tmp_path)) >= stopped_at + 50, what="50 more iterations")
        radt.proc.kill()  # SIGKILL; its watchdog ends the script
        radt.wait()
        last = _steps(tmp_path)[-1][0]
        before = _stored_steps(store, run_id)
        synced = run_radt(["sync"], env=env, cwd=tmp_path)
    finally:
        radt.end()
    assert len(before) < last, "radt had not handed the last iterations on when it was killed"
    assert synced.returncode == 0, synced.stderr
    stored = _stored_steps(store, run_id)
    assert stored[: last + 1] == list(range(last + 1)), f"losses missing: {sorted(set(range(last + 1)) - set(stored))[:10]}"
    assert MlflowClient(store).get_run(run_id).info.status == "KILLED"
    run_dir = radt_home / "runs" / run_id
    assert int((run_dir / SCRIPT_OFFSET_FILE).read_text()) == (run_dir / SCRIPT_LOG_FILE).stat().st_size


def test_a_disk_that_refuses_the_calls_is_said_once_and_never_raised(tmp_path, monkeypatch, capfd):
    import radt

    (tmp_path / SCRIPT_LOG_FILE).symlink_to("/dev/full")  # every write: ENOSPC
    monkeypatch.setenv("RADT_RUN_DIR", str(tmp_path))
    monkeypatch.setenv("MLFLOW_RUN_ID", "0" * 32)
    with radt.run() as run:
        for step in range(3):
            run.log_metric("loss", 0.5, step=step)
        run.log_param("lr", 0.1)
    said = [line for line in capfd.readouterr().err.splitlines() if line.startswith("radt:")]
    assert run._log.dropped == 4 and said == [f"radt: cannot write {tmp_path / SCRIPT_LOG_FILE} (No space left on device); run.log_* calls are being dropped"]


def test_the_reader_skips_what_is_not_a_whole_call_and_keys_mlflow_refuses(tmp_path):
    from radt.collectors.run.scriptlog import ScriptLog

    (tmp_path / SCRIPT_LOG_FILE).write_text(
        '{"metrics":[["loss",0.5,1000,0],["bad key?",1,1000,0]]}\n'
        '{"metrics":[["loss",0.4,10\n'  # a write cut short, then a fresh line
        '{"params":{"lr":"0.1"}}\n'
        '{"metrics":[["loss",0.3,1002,2]]}\n'
        '{"metrics":[["loss",0.2,1003,3]]'  # still being written
    )
    points, said = [], []
    log = ScriptLog(tmp_path, "r" * 32, None, points.extend, said.append)
    assert log.read() == 4
    assert [(p.key, p.value, p.timestamp, p.step) for p in points] == [("loss", 0.5, 1000, 0), ("loss", 0.3, 1002, 2)]
    assert [record for _, _, record in log.calls] == [{"params": {"lr": "0.1"}}]
    assert len(said) == 2 and "invalid metric key 'bad key?'" in said[0] and "not a whole call" in said[1]
    assert log.offset == (tmp_path / SCRIPT_LOG_FILE).stat().st_size - len('{"metrics":[["loss",0.2,1003,3]]'), "the unfinished line waits"


def test_a_call_longer_than_a_read_is_skipped_and_the_next_is_read(tmp_path, monkeypatch):
    from radt.collectors.run import scriptlog

    monkeypatch.setattr(scriptlog, "READ_BYTES", 64)
    (tmp_path / SCRIPT_LOG_FILE).write_text('{"params":{"notes":"' + "x" * 200 + '"}}\n{"metrics":[["loss",0.5,1000,0]]}\n')
    points, said = [], []
    log = scriptlog.ScriptLog(tmp_path, "r" * 32, None, points.extend, said.append)
    log.read()
    assert [p.key for p in points] == ["loss"] and not log.calls and "skipped a call of 224 bytes" in said[0]
