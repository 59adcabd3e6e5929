"""`radt monitor` end to end: a real `python -m radt monitor` process sampling this machine into a
real store (SQLite and PostgreSQL), stopped with a signal; GPUs are faked only below pynvml.

Every wait is on a condition in the store (the run exists, it holds enough points), never a
fixed sleep.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import threading
from datetime import date, timedelta

import pytest
from mlflow import MlflowClient

from tests.fakes.fake_nvml import A100, H100
from tests.support.polling import wait_for
from tests.support.ports import free_port
from tests.support.postgres import address, through
from tests.support.proxy import TcpProxy
from tests.support.radtproc import radt_command, radt_env, run_radt

CPU = "system/cpu_utilization_percentage"
MEMORY = "system/system_memory_usage_megabytes"  # sampled from the first tick on (CPU % from the second)
GPUS = json.dumps([{**H100, "load": 0.7}, {**A100, "load": 0.0}])  # one busy GPU, one idle


def _monitor_runs(client: MlflowClient, experiment: str = "monitor") -> list:
    exp = client.get_experiment_by_name(experiment)
    return client.search_runs([exp.experiment_id]) if exp is not None else []


def _recording(client: MlflowClient, points: int, exclude: set[str] = frozenset(), experiment: str = "monitor"):
    """The RUNNING monitor run once it holds `points` CPU samples (None before)."""
    for run in _monitor_runs(client, experiment):
        if run.info.status == "RUNNING" and run.info.run_id not in exclude and len(client.get_metric_history(run.info.run_id, CPU)) >= points:
            return run
    return None


def _start(home, store, *args: str, preexec_fn=None, **env) -> subprocess.Popen:
    return subprocess.Popen(
        radt_command("monitor", "--interval", "0.2", *args),
        env=radt_env(home, store, **env),
        cwd=home,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=preexec_fn,
    )


def test_monitor_records_idle_and_busy_gpus_until_sigint(store_uri, radt_home):
    proc = _start(radt_home, store_uri, fake_gpus=GPUS)
    client = MlflowClient(store_uri)
    try:
        running = wait_for(lambda: _recording(client, 3), what="3 CPU samples in the monitor run", process=proc)
    finally:
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr

    runs = _monitor_runs(client)
    assert [r.info.run_id for r in runs] == [running.info.run_id]
    run = runs[0]
    host = socket.gethostname()
    assert run.info.status == "FINISHED" and run.info.end_time is not None
    assert run.info.run_name == f"{host} {date.today().isoformat()}"
    tags = run.data.tags
    assert tags["radt.monitor"] == "true" and tags["radt.role"] == "run" and tags["radt.host"] == host
    assert tags["radt.listeners"] == "nvml+host" and tags["radt.devices"] == "all" and tags["radt.letter"] == "-"
    assert tags["radt.command"].startswith("radt monitor --interval 0.2") and tags["radt.stop_reason"] == "sigint"
    assert run.data.params["radt.interval"] == "0.2"

    metrics = run.data.metrics
    # both GPUs, the busy one and the idle one, with the catalogue keys of a training run
    assert metrics["system/gpu_0_utilization_percentage"] > 0 and metrics["system/gpu_1_utilization_percentage"] == 0
    assert "system/gpu_0_sm_active" in metrics and "system/system_memory_usage_megabytes" in metrics
    # no training process: no process-tree series (host CPU/RSS, a run's GPU memory)
    assert not [k for k in metrics if "process_" in k], sorted(metrics)
    history = sorted(client.get_metric_history(run.info.run_id, MEMORY), key=lambda m: m.timestamp)
    assert [m.step for m in history] == list(range(len(history)))  # one step per tick from 0, as MLflow's charts want
    assert int(tags["radt.points"]) >= len(history) >= 3
    assert {a.path for a in client.list_artifacts(run.info.run_id, "radt")} >= {"radt/gpu-inventory.json", "radt/radt-sources.json"}


@pytest.mark.parametrize("store_uri", ["sqlite"], indirect=True)  # signals: one store kind is enough
def test_a_closed_terminal_ends_the_days_run_and_nohup_keeps_it_recording(store_uri, radt_home):
    """`radt monitor` in an ssh session that drops gets SIGHUP: its default killed radt mid-run (the run left RUNNING, the
    samples in memory lost). It ends the run like Ctrl-C now; started under nohup (SIGHUP ignored) it keeps recording."""
    client = MlflowClient(store_uri)
    ignore_hangups = lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN)  # noqa: E731  (what `nohup` does before it execs)
    nohup = _start(radt_home, store_uri, "-l", "host", "-e", "nohup", preexec_fn=ignore_hangups)
    try:
        first = wait_for(lambda: _recording(client, 2, experiment="nohup"), what="the nohup monitor's run", process=nohup)
        nohup.send_signal(signal.SIGHUP)
        seen = len(client.get_metric_history(first.info.run_id, CPU))
        wait_for(lambda: len(client.get_metric_history(first.info.run_id, CPU)) >= seen + 3, what="samples after the SIGHUP", process=nohup)
    finally:
        nohup.send_signal(signal.SIGINT)
        _, nohup_err = nohup.communicate(timeout=60)
    assert nohup.returncode == 0, nohup_err
    assert client.get_run(first.info.run_id).data.tags["radt.stop_reason"] == "sigint"

    hung_up = _start(radt_home, store_uri, "-l", "host")
    try:
        running = wait_for(lambda: _recording(client, 3), what="3 CPU samples in the monitor run", process=hung_up)
    finally:
        hung_up.send_signal(signal.SIGHUP)
        _, stderr = hung_up.communicate(timeout=60)
    assert hung_up.returncode == 0, stderr
    assert "radt monitor: SIGHUP received, ending the run" in stderr and "Traceback" not in stderr
    run = client.get_run(running.info.run_id)
    assert run.info.status == "FINISHED" and run.data.tags["radt.stop_reason"] == "sighup"
    assert int(run.data.tags["radt.points"]) == sum(len(client.get_metric_history(run.info.run_id, key)) for key in run.data.metrics), (
        "every sample taken is stored"
    )


@pytest.mark.parametrize("store_uri", ["sqlite"], indirect=True)  # a refusal before any store work: one kind is enough
def test_a_second_monitor_of_the_same_host_is_refused(store_uri, radt_home):
    client = MlflowClient(store_uri)
    first = _start(radt_home, store_uri, "-l", "host")
    try:
        running = wait_for(lambda: _recording(client, 1), what="the first monitor's run", process=first)
        second = run_radt(["monitor", "-l", "host"], env=radt_env(radt_home, store_uri), cwd=radt_home, timeout=60)
    finally:
        first.send_signal(signal.SIGINT)
        _, stderr = first.communicate(timeout=60)
    assert second.returncode == 2, second.stderr
    assert [line for line in second.stderr.splitlines() if line.strip()] == [
        f"radt monitor: another radt monitor (pid {first.pid}) is recording this host into run {running.info.run_id} of this experiment; "
        "stop it first or choose another -e"
    ]
    assert first.returncode == 0, stderr
    assert [r.info.run_id for r in _monitor_runs(client)] == [running.info.run_id]  # the refused one created nothing
    assert client.get_run(running.info.run_id).info.status == "FINISHED"


def test_restart_after_a_crash_kills_the_stale_run(store_uri, radt_home):
    client = MlflowClient(store_uri)
    crashed = _start(radt_home, store_uri, "-l", "host")
    try:
        stale = wait_for(lambda: _recording(client, 1), what="the first monitor's run", process=crashed)
    finally:
        crashed.kill()  # SIGKILL: no chance to end its run
        crashed.communicate(timeout=30)
    assert client.get_run(stale.info.run_id).info.status == "RUNNING"

    restarted = _start(radt_home, store_uri, "-l", "host")
    try:
        fresh = wait_for(lambda: _recording(client, 2, exclude={stale.info.run_id}), what="the restarted monitor's run", process=restarted)
    finally:
        restarted.send_signal(signal.SIGTERM)
        _, stderr = restarted.communicate(timeout=60)
    assert restarted.returncode == 0, stderr
    assert f"run {stale.info.run_id} ({stale.info.run_name}) lost its radt; marked KILLED" in stderr

    old = client.get_run(stale.info.run_id)
    assert old.info.status == "KILLED" and old.data.tags["radt.stop_reason"] == "radt_killed"
    assert "radt/gpu-inventory.json" in {a.path for a in client.list_artifacts(old.info.run_id, "radt")}  # its logs, as `radt sync` attaches them
    new = client.get_run(fresh.info.run_id)
    assert new.info.status == "FINISHED" and new.data.tags["radt.stop_reason"] == "sigterm"
    assert new.info.run_name == old.info.run_name  # same host, same day
    assert (radt_home / "runs" / stale.info.run_id / "done").exists()  # so `radt sync` does not close it again


def test_store_outage_spools_and_replays_every_sample(pg_uri, radt_home):
    host, port, _database = address(pg_uri)
    proxy = TcpProxy(host, port).start()
    client = MlflowClient(pg_uri)  # the test reads past the proxy; the monitor writes through it

    def points() -> int:
        runs = _monitor_runs(client)
        return len(client.get_metric_history(runs[0].info.run_id, MEMORY)) if runs else 0

    proc = _start(radt_home, through(pg_uri, proxy.port), "-l", "host")
    try:
        wait_for(lambda: points() >= 3, what="first samples", process=proc)
        proxy.stop()
        spool = wait_for(lambda: next(radt_home.glob("runs/*/spool.jsonl"), None), what="samples spooled to disk", process=proc)
        wait_for(lambda: len(spool.read_text().splitlines()) >= 3, what="several spooled batches", process=proc)
        during = points()
        proxy = TcpProxy(host, port, port=proxy.port).start()
        wait_for(lambda: points() > during + 3, what="the replay once the store is back", process=proc)
    finally:
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
        proxy.stop()
    assert proc.returncode == 0, stderr
    assert "store unreachable" in stderr and "store is back" in stderr
    run = _monitor_runs(client)[0]
    assert run.info.status == "FINISHED"
    steps = [m.step for m in sorted(client.get_metric_history(run.info.run_id, MEMORY), key=lambda m: m.timestamp)]
    assert steps == list(range(len(steps))), "every tick is in the store exactly once"
    assert not list(radt_home.glob("runs/*/spool.jsonl")) and not list(radt_home.glob("runs/*/pending.json"))


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["-l", "host+gpuz"], "radt monitor: unknown listener 'gpuz'"),
        (["--interval", "0.05"], "radt monitor: --interval 0.05 is too short"),
        (["--interval", "often"], "invalid float value: 'often'"),
        (["--interval", "nan"], "radt monitor: --interval nan is not a finite number; use 0.1 seconds or more"),
        (["--flush-timeout", "inf"], "radt monitor: --flush-timeout inf is not 0 or more seconds"),
        (["-d", "first"], "radt monitor: bad -d 'first'"),
        (["--rollover", "weekly"], "invalid choice: 'weekly'"),
        (["-d", "0+2"], "radt monitor: GPU 2 does not exist on this machine (GPUs: 0 to 1); fix -d"),
    ],
)
def test_user_mistakes_give_one_line_and_exit_2(radt_home, tmp_path, args, needle):
    store = tmp_path / "never.db"
    result = run_radt(["monitor", *args], env=radt_env(radt_home, f"sqlite:///{store}", fake_gpus=GPUS), cwd=tmp_path, timeout=60)
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0], result.stderr
    assert "Traceback" not in result.stderr and not store.exists()


def test_unreachable_store_is_one_line(radt_home, tmp_path):
    port = free_port()  # a port nobody listens on
    result = run_radt(["monitor", "-l", "host"], env=radt_env(radt_home, f"postgresql://postgres@127.0.0.1:{port}/mlflow"), cwd=tmp_path, timeout=60)
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("radt monitor: cannot reach the tracking store postgresql://postgres@127.0.0.1"), result.stderr


def test_daily_rollover_finishes_the_day_and_starts_the_next_run(store_uri, radt_home):
    """The monitor's own loop, in this process, with the calendar day as the only thing moved by hand."""
    from radt.collectors.monitor.machine import Monitor, MonitorSetup

    today = [date(2026, 3, 1)]
    monitor = Monitor(MonitorSetup(store_uri, "monitor", ["host"], None, 0.1, 30.0, ["-l", "host"]), today=lambda: today[0])
    monitor.end_stale_runs()
    monitor.begin()
    stop = threading.Event()
    loop = threading.Thread(target=monitor.run_until, args=(stop, "daily"), daemon=True)
    loop.start()
    client = MlflowClient(store_uri)
    try:
        first = wait_for(lambda: _recording(client, 2), what="the first day's samples")
        today[0] += timedelta(days=1)
        second = wait_for(lambda: _recording(client, 2, exclude={first.info.run_id}), what="the next day's run")
    finally:
        stop.set()
        loop.join(30)
        assert monitor.end("stopped")

    host = socket.gethostname()
    day1, day2 = client.get_run(first.info.run_id), client.get_run(second.info.run_id)
    assert day1.info.run_name == f"{host} 2026-03-01" and day2.info.run_name == f"{host} 2026-03-02"
    assert day1.info.status == "FINISHED" and day1.data.tags["radt.stop_reason"] == "day_end"
    assert day2.info.status == "FINISHED" and day2.data.tags["radt.stop_reason"] == "stopped"
    for run in (day1, day2):
        steps = [m.step for m in sorted(client.get_metric_history(run.info.run_id, MEMORY), key=lambda m: m.timestamp)]
        assert steps == list(range(len(steps))), "each day's run counts its own steps from 0"
    last_of_day1 = max(m.timestamp for m in client.get_metric_history(day1.info.run_id, CPU))
    first_of_day2 = min(m.timestamp for m in client.get_metric_history(day2.info.run_id, CPU))
    assert last_of_day1 < first_of_day2
