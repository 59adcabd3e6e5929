"""Start-up failures leave nothing behind: a RADT_HOME that cannot be written (a full disk, a read-only
mount, /proc) is one line and exit 2 before any run exists; `radt sync` skips a broken run folder with one
line naming it and syncs every other run; a full disk under the script's logs costs the logs, never the
script's output, a traceback or a hung script; radt.points counts every point stored for a run whose radt
was SIGKILLed, whoever sent it.

Real mounts (a 64 KiB tmpfs filled up, a tmpfs remounted read-only: root or CAP_SYS_ADMIN, as the full
disk of tests/test_outage.py), real `python -m radt` processes, the real PostgreSQL and SQLite stores.
Every wait is on a condition, never a fixed sleep.
"""

from __future__ import annotations

import os
import signal
import subprocess
import textwrap
from contextlib import contextmanager
from pathlib import Path

import pytest
import sqlalchemy as sa
from mlflow import MlflowClient

from radt.collectors.store.writer import Spool
from radt.rundir import META_FILE, SPOOL_FILE
from tests.support.disks import fill, tmpfs
from tests.support.polling import wait_for
from tests.support.postgres import address
from tests.support.proxy import TcpProxy
from tests.support.radtproc import LiveRadt, radt_command, radt_env, run_radt
from tests.support.rollupcheck import assert_rollups_cover_raw

STEADY = """
    import os, time
    while not os.path.exists("finish"):
        sum(i for i in range(2000))
        time.sleep(0.01)
"""
# waits for the test's "go", then writes 300 KB to stdout: more than a pipe holds, so a tee that stops reading blocks it
CHATTY = """
    import os, sys, time
    while not os.path.exists("go"):
        time.sleep(0.02)
    for i in range(300):
        sys.stdout.write(f"line {i:03d} " + "x" * 1000 + "\\n")
    sys.stdout.flush()
"""


def _script(folder: Path, body: str, name: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(body))
    return path


def _count(uri: str, sql: str, **params) -> int:
    engine = sa.create_engine(uri)
    try:
        with engine.connect() as conn:
            return conn.execute(sa.text(sql), params).scalar_one()
    finally:
        engine.dispose()


def _runs(uri: str) -> int:
    return _count(uri, "select count(*) from runs")


def _metric_rows(uri: str, run_id: str) -> int:
    return _count(uri, "select count(*) from metrics where run_uuid = :r", r=run_id)


@pytest.mark.parametrize("kind", ["full", "read-only", "proc"])
def test_a_radt_home_that_cannot_be_written_is_one_line_exit_2_and_no_run(kind, store_uri, tmp_path):
    _script(tmp_path, "print('trained')", "train.py")
    with tmpfs(tmp_path / "home", read_only=kind == "read-only") if kind != "proc" else _proc_home() as home:
        if kind == "full":
            fill(home)
        env = radt_env(home, store_uri)
        tries = [run_radt(["-l", "host", "train.py"], env=env, cwd=tmp_path) for _ in range(2)]  # a user tries again
        left = sorted(p.name for p in home.iterdir()) if home.is_dir() else []
    reason = {"full": "No space left on device", "read-only": "Read-only file system", "proc": "No such file or directory"}[kind]
    for done in tries:
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"radt: RADT_HOME {home} cannot be written ("), done.stderr
        assert reason in lines[0] and "set RADT_HOME to a folder radt can write" in lines[0], lines[0]
        assert "trained" not in done.stdout
    assert _runs(store_uri) == 0, "no run was created"
    assert left == (["filler"] if kind == "full" else []), "nothing was left in RADT_HOME"


@contextmanager
def _proc_home():
    yield Path("/proc/x")


def _spooled_after_store(spool: Spool, uri: str, run_id: str) -> int:
    """Spooled points newer than every point of the run in the store."""
    last = _count(uri, "select coalesce(max(timestamp), 0) from metrics where run_uuid = :r", r=run_id)
    return sum(1 for point in spool.read() if point.timestamp > last)


def _killed_run_with_spool(pg_uri: str, home: Path, folder: Path) -> tuple[str, dict, TcpProxy]:
    """A run whose radt wrote points to the store, spooled more while the store was away, and was SIGKILLed;
    the store is reachable again through the returned proxy (stop it when done), whose URI the run's meta.json names."""
    host, port, database = address(pg_uri)
    proxy = TcpProxy(host, port).start()
    env = radt_env(home, f"postgresql://postgres@127.0.0.1:{proxy.port}/{database}")
    _script(folder, STEADY, "steady.py")
    radt = LiveRadt(["-e", "killed", "-l", "host", "--interval", "0.2", "steady.py"], env, folder)
    try:
        run_id = radt.run_id()
        spool = Spool(home / "runs" / run_id / SPOOL_FILE)
        wait_for(lambda: _metric_rows(pg_uri, run_id) >= 20, what="first samples in the store")
        proxy.stop()  # the store refuses connections: radt spools
        radt.line("store unreachable")
        # a batch in flight when the store went away may be stored and spooled both (sync takes it as once):
        # wait for points the store has never seen, so sync has something of its own to send
        wait_for(lambda: _spooled_after_store(spool, pg_uri, run_id) >= 20, what="samples spooled after the last stored one")
        radt.proc.kill()
        radt.wait()
    finally:
        radt.end()
        proxy.stop()
    return run_id, env, TcpProxy(host, port, port=proxy.port).start()


def test_radt_points_counts_what_radt_wrote_before_a_sigkill_and_what_sync_sent(pg_uri, radt_home, tmp_path):
    run_id, env, proxy = _killed_run_with_spool(pg_uri, radt_home, tmp_path)
    try:
        before = _metric_rows(pg_uri, run_id)
        synced = run_radt(["sync"], env=env, cwd=tmp_path)
    finally:
        proxy.stop()
    assert synced.returncode == 0, synced.stderr
    stored = _metric_rows(pg_uri, run_id)
    assert stored > before > 0, "radt wrote some points itself and sync sent the spooled rest"
    run = MlflowClient(pg_uri).get_run(run_id)
    assert run.info.status == "KILLED"
    assert run.data.tags["radt.points"] == str(stored), f"radt.points counts all {stored} stored points ({before} written by radt before the SIGKILL)"
    assert assert_rollups_cover_raw(pg_uri, run_id) == stored  # what radt wrote, and what sync sent, each once


def test_sync_skips_broken_run_folders_with_one_line_each_and_syncs_the_others(pg_uri, radt_home, tmp_path):
    run_id, env, proxy = _killed_run_with_spool(pg_uri, radt_home, tmp_path)
    empty = radt_home / "runs" / "0000empty"  # what a full disk left: meta.json created, nothing written in it
    cut = radt_home / "runs" / "0001cut"  # a meta.json cut short
    for folder, text in ((empty, ""), (cut, '{"store": "postgresql://')):
        (folder / "logs").mkdir(parents=True)
        (folder / META_FILE).write_text(text)
    try:
        synced = run_radt(["sync"], env=env, cwd=tmp_path)
    finally:
        proxy.stop()
    assert synced.returncode == 0, synced.stderr
    assert "Traceback" not in synced.stderr and "Expecting value" not in synced.stderr, synced.stderr
    lines = synced.stderr.splitlines()
    assert [line for line in lines if str(empty) in line] == [
        f"radt sync: skipped {empty}: its {META_FILE} is empty (a disk that was full?), so which run and store it belongs to is unknown; "
        "keep what you need of it and remove the folder"
    ], synced.stderr
    assert [line for line in lines if str(cut) in line] == [
        f"radt sync: skipped {cut}: its {META_FILE} is not JSON (a disk that was full?), so which run and store it belongs to is unknown; "
        "keep what you need of it and remove the folder"
    ], synced.stderr
    assert f"radt sync: run {run_id}: " in synced.stderr
    assert MlflowClient(pg_uri).get_run(run_id).info.status == "KILLED"
    assert not Spool(radt_home / "runs" / run_id / SPOOL_FILE), "the good run's spool was sent"
    assert (empty / META_FILE).exists() and (cut / META_FILE).exists(), "sync removes nothing it cannot read"


def test_a_full_disk_under_the_script_logs_is_one_line_and_the_output_still_reaches_the_terminal(empty_sqlite, radt_home, tmp_path):
    store = empty_sqlite(tmp_path / "store.db")
    _script(tmp_path, CHATTY, "chatty.py")
    with tmpfs(radt_home / "runs") as runs:
        out, err = tmp_path / "out.txt", tmp_path / "err.txt"
        with open(out, "wb") as stdout, open(err, "wb") as stderr:
            proc = subprocess.Popen(radt_command("-l", "host", "chatty.py"), env=radt_env(radt_home, store), cwd=tmp_path, stdout=stdout, stderr=stderr)
        try:
            log = wait_for(lambda: next(iter(runs.glob("*/logs/stdout.log")), None), process=proc, what="the script's log")
            fill(runs)
            (tmp_path / "go").write_text("")
            code = proc.wait(60)  # a tee that died on the full disk leaves the script blocked on a full pipe
        finally:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(30)
        said = err.read_text()
        assert code == 0, said
        assert "Traceback" not in said, said
        assert [line for line in said.splitlines() if str(log) in line] == [
            f"radt: cannot write the script's output to {log} (No space left on device); from here on it goes to the terminal only"
        ], said
        printed = out.read_text().splitlines()
        assert [line[:8] for line in printed] == [f"line {i:03d}" for i in range(300)], "every line reached the terminal"
        assert log.stat().st_size < 300 * 1010
