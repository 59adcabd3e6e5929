"""How a training ends under radt: limits that let the script save its checkpoint, Ctrl-C that works
whatever radt inherited, and the script path that is the file the user named.

Real `python -m radt` processes on a SQLite store; every wait is on a condition with a deadline.
"""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from mlflow import MlflowClient

from tests.support.polling import gone_within, wait_for
from tests.support.radtproc import radt_command, radt_env, run_radt

EPOCHS = """
    import sys, time, radt
    epoch = -1
    with radt.run() as run:
        for epoch in range(1000):
            time.sleep(0.2)  # an epoch (sleeping: CPU burnt here would only slow the tests beside this one)
            run.log_metric("loss", 1.0 / (epoch + 1), step=epoch)
            print(f"epoch {epoch}", flush=True)
    open("checkpoint.txt", "w").write(str(epoch))  # what a user saves after the training loop
    print("saved", flush=True)
"""


@pytest.fixture(autouse=True)
def _store(tmp_path, empty_sqlite):
    """s.db, each test's store: MLflow's empty schema, as a SQLite file radt is given (how radt creates one is test_sqltracking's)."""
    empty_sqlite(tmp_path / "s.db")


def _script(folder: Path, body: str, name: str, mode: int | None = None) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(body))
    if mode is not None:
        path.chmod(mode)
    return path


def _runs(store_path: Path) -> list:
    if not store_path.exists():
        return []
    client = MlflowClient(f"sqlite:///{store_path}")
    return [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id]) if r.data.tags.get("radt.role") == "run"]


def _only_run(store_path: Path):
    runs = _runs(store_path)
    assert len(runs) == 1, runs
    return runs[0]


def test_max_epoch_ends_the_with_block_and_the_code_after_it_runs(radt_home, tmp_path):
    _script(tmp_path, EPOCHS, "train.py")
    result = run_radt(["-e", "stops", "-l", "host", "--max-epoch", "2", "train.py"], env=radt_env(radt_home, f"sqlite:///{tmp_path / 's.db'}"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "checkpoint.txt").read_text() == "2", "the checkpoint after the with block was saved, after epoch 2"
    assert "max-epoch reached" in result.stderr and "Traceback" not in result.stderr
    run = _only_run(tmp_path / "s.db")
    assert run.info.status == "FINISHED" and run.data.tags["radt.stop_reason"] == "max_epoch"
    assert run.data.tags["radt.exit_code"] == "0"


def test_max_time_ends_the_with_block_at_the_next_log_metric(radt_home, tmp_path):
    _script(tmp_path, EPOCHS, "train.py")
    result = run_radt(["-e", "stops", "-l", "host", "--max-time", "0.03", "train.py"], env=radt_env(radt_home, f"sqlite:///{tmp_path / 's.db'}"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    saved = int((tmp_path / "checkpoint.txt").read_text())
    printed = [int(n) for n in re.findall(r"^epoch (\d+)$", result.stdout, re.M)]
    assert "saved" in result.stdout and printed == list(range(len(printed))), result.stdout
    assert saved < 999 and saved in (len(printed) - 1, len(printed)), f"the loop left at the epoch it was in, checkpoint {saved}: {printed}"
    assert "KeyboardInterrupt" not in result.stderr and "Traceback" not in result.stderr, result.stderr
    run = _only_run(tmp_path / "s.db")
    assert run.info.status == "FINISHED" and run.data.tags["radt.stop_reason"] == "max_time"
    assert (run.info.end_time - run.info.start_time) / 1000 < 30


def test_a_loop_that_checks_should_stop_saves_and_breaks_itself(radt_home, tmp_path):
    _script(
        tmp_path,
        """
        import radt
        with radt.run() as run:
            for epoch in range(1000):
                sum(i * i for i in range(20000))
                if run.should_stop(epoch):
                    open("checkpoint.txt", "w").write(str(epoch))
                    break
                run.log_metric("loss", 1.0 / (epoch + 1), step=epoch)
        """,
        "train.py",
    )
    result = run_radt(["-e", "stops", "-l", "host", "--max-epoch", "3", "train.py"], env=radt_env(radt_home, f"sqlite:///{tmp_path / 's.db'}"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "checkpoint.txt").read_text() == "3"
    run = _only_run(tmp_path / "s.db")
    assert run.info.status == "FINISHED" and run.data.tags["radt.stop_reason"] == "max_epoch"


def test_a_script_that_fails_after_the_stop_is_failed(radt_home, tmp_path):
    _script(tmp_path, EPOCHS.replace('open("checkpoint.txt"', 'open("no/such/folder/checkpoint.txt"'), "train.py")
    result = run_radt(["-e", "stops", "-l", "host", "--max-epoch", "1", "train.py"], env=radt_env(radt_home, f"sqlite:///{tmp_path / 's.db'}"), cwd=tmp_path)
    assert result.returncode == 1 and "FileNotFoundError" in result.stderr
    run = _only_run(tmp_path / "s.db")
    assert run.info.status == "FAILED" and run.data.tags["radt.stop_reason"] == "max_epoch"


HANDLERS = """
    import json, os, signal, time
    handlers = {"SIGINT": repr(signal.getsignal(signal.SIGINT)), "SIGTERM": repr(signal.getsignal(signal.SIGTERM)), "pid": os.getpid()}
    open("handlers.json", "w").write(json.dumps(handlers))
    while True:
        time.sleep(0.02)
"""
# what `nohup`, `cmd &` in a script and many batch systems do: radt starts with SIGINT ignored
IGNORING_SIGINT = "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"


def _radt_ignoring_sigint(args: list[str], env: dict, cwd: Path) -> subprocess.Popen:
    command = [sys.executable, "-c", IGNORING_SIGINT, *radt_command(*args)[1:]]
    return subprocess.Popen(command, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_ctrl_c_stops_the_script_promptly_when_radt_started_with_sigint_ignored(radt_home, tmp_path):
    _script(tmp_path, HANDLERS, "wait.py")
    proc = _radt_ignoring_sigint(["-e", "ign", "-l", "host", "wait.py"], radt_env(radt_home, f"sqlite:///{tmp_path / 's.db'}"), tmp_path)
    try:
        handlers = json.loads(wait_for(lambda: (tmp_path / "handlers.json").exists() and (tmp_path / "handlers.json").read_text(), what="the script to start"))
        proc.send_signal(signal.SIGINT)
        took = gone_within([handlers.pop("pid")], 10)  # radt's own escalation would take 30 s
        _, stderr = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert handlers == {"SIGINT": "<built-in function default_int_handler>", "SIGTERM": "<Handlers.SIG_DFL: 0>"}, "the script got default handlers"
    print(f"\nCtrl-C to a radt started with SIGINT ignored: the script ended {took:.2f} s later")
    assert proc.returncode == 130, stderr
    assert _only_run(tmp_path / "s.db").info.status == "KILLED"


def test_max_time_stops_a_script_promptly_when_radt_started_with_sigint_ignored(radt_home, tmp_path):
    _script(tmp_path, HANDLERS, "wait.py")
    proc = _radt_ignoring_sigint(["-e", "ign", "-l", "host", "--max-time", "0.03", "wait.py"], radt_env(radt_home, f"sqlite:///{tmp_path / 's.db'}"), tmp_path)
    try:
        _, stderr = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr
    run = _only_run(tmp_path / "s.db")
    assert run.info.status == "FINISHED" and run.data.tags["radt.stop_reason"] == "max_time"
    assert (run.info.end_time - run.info.start_time) / 1000 < 25, "not SIGINT ignored for 30 s, then SIGTERM"


@pytest.mark.parametrize("path", ["./train.sh", "sub/train.sh"])
def test_a_script_path_with_a_slash_is_that_file_not_one_on_path(radt_home, tmp_path, path):
    _script(tmp_path, "#!/bin/sh\necho here > which.txt\n", path, 0o755)
    _script(tmp_path, "#!/bin/sh\necho path > which.txt\n", "bin/train.sh", 0o755)
    env = radt_env(radt_home, f"sqlite:///{tmp_path / 's.db'}", extra={"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"})
    result = run_radt(["-e", "paths", "-l", "host", path], env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "which.txt").read_text().strip() == "here"
    assert _only_run(tmp_path / "s.db").info.status == "FINISHED"


@pytest.mark.parametrize(
    ("content", "mode", "needle"),
    [
        ("#!/bin/sh\necho hi\n", 0o644, "is not executable; make it so with 'chmod +x ./job.sh'"),
        ("#!/nonexistent/bin/python3\nprint('hi')\n", 0o755, "its #! line names /nonexistent/bin/python3, which does not exist"),
        ("#!/bin/sh\r\necho hi\r\n", 0o755, "Windows line endings"),
        ("#!/usr/bin/env no-such-interpreter-xyz\nprint('hi')\n", 0o755, "'no-such-interpreter-xyz' is not on PATH"),
        ("echo hi\n", 0o755, "has no #! line"),
    ],
    ids=["no-x-bit", "missing-interpreter", "crlf", "env-missing", "no-shebang"],
)
def test_a_file_that_cannot_run_is_one_line_and_no_run(radt_home, tmp_path, content, mode, needle):
    _script(tmp_path, content, "job.sh", mode)
    result = run_radt(["-e", "bad", "-l", "host", "./job.sh"], env=radt_env(radt_home, f"sqlite:///{tmp_path / 's.db'}"), cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert lines[0].startswith("radt: script './job.sh'") and needle in lines[0], lines[0]
    assert not any(r.info.status == "RUNNING" for r in _runs(tmp_path / "s.db"))


def test_a_file_the_kernel_refuses_ends_a_failed_run_with_the_reason(radt_home, tmp_path):
    path = tmp_path / "job.bin"
    path.write_bytes(b"\x7fELF" + b"\x00" * 60)  # looks like a program; exec says "Exec format error"
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    result = run_radt(["-e", "bad", "-l", "host", "./job.bin"], env=radt_env(radt_home, f"sqlite:///{tmp_path / 's.db'}"), cwd=tmp_path)
    assert result.returncode == 126, result.stderr
    assert "Traceback" not in result.stderr
    said = [line for line in result.stderr.splitlines() if "cannot run" in line]
    assert len(said) == 1 and "./job.bin" in said[0] and "Exec format error" in said[0], result.stderr
    run = _only_run(tmp_path / "s.db")
    assert run.info.status == "FAILED"
    log = Path(MlflowClient(f"sqlite:///{tmp_path / 's.db'}").download_artifacts(run.info.run_id, "radt/stderr.log", str(tmp_path))).read_text()
    assert said[0].removeprefix("radt: ") in log
