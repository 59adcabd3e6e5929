"""A disk that fills during a run costs the logs, never the run: RADT_HOME on a small tmpfs that the script's own
stdout fills mid-run (issue #52, item 15; old radt: "store still unreachable" while the store was up, the run left
RUNNING, and `radt sync` ended it KILLED without its exit code).

The run ends FINISHED or FAILED with the script's exit code, every sampled point and the script's own metrics in
the store, the terminal gets every byte, one line says how many bytes of the output the logs lack and what else of
the run's folder could not be written, radt exits with the script's status, and `radt sync` afterwards changes
nothing. A real tmpfs (root or CAP_SYS_ADMIN, as tests/test_startup_failures.py), real `python -m radt` processes,
the real PostgreSQL and SQLite stores (the SQLite file outside the small disk). Every wait is on a condition.
"""

from __future__ import annotations

import os
import re
import subprocess
import textwrap
from pathlib import Path

import pytest
import sqlalchemy as sa
from mlflow import MlflowClient

from tests.support.disks import fill, tmpfs
from tests.support.polling import wait_for
from tests.support.radtproc import radt_command, radt_env, run_radt
from tests.support.stored import per_key_and_step

pytestmark = pytest.mark.dialects

LINES = 2000  # 2 MB of output: the 256 KiB disk fills a few lines in
LINE = 1000  # bytes of each line's text, its newline aside
MEMORY = "system/system_memory_usage_megabytes"  # sampled on every tick from step 0
# left out of a tick that comes right after the previous one (the sampler caught up): the host's and the run's CPU
CPU_KEYS = ("system/cpu_utilization_percentage", "system/process_cpu_utilization_percentage")
# logs its loss with radt.run(), waits for "go", prints 2 MB (a line on stderr too), waits for "finish", exits with $CODE
SCRIPT = f"""
    import os, sys, time
    import radt
    with radt.run() as run:
        run.log_param("lr", "0.1")
        for step in range(5):
            run.log_metric("loss", 1.0 / (step + 1), step=step)
        while not os.path.exists("go"):
            time.sleep(0.02)
        for i in range({LINES}):
            sys.stdout.write(f"line {{i:04d}} " + "x" * ({LINE} - 10) + "\\n")
        sys.stdout.flush()
        sys.stderr.write("the script's own stderr line\\n")
        sys.stderr.flush()
        while not os.path.exists("finish"):
            time.sleep(0.02)
    sys.exit(int(os.environ["CODE"]))
"""


def _per_key_and_step(uri: str, run_id: str) -> dict[str, dict[int, int]]:
    """Every key's rows per step; nothing yet while SQLite is busy with the writer."""
    try:
        return per_key_and_step(uri, run_id)
    except sa.exc.OperationalError:
        return {}


def _last_tick(uri: str, run_id: str) -> int:
    return max(_per_key_and_step(uri, run_id).get(MEMORY, {-1: 0}))


def _assert_every_point_once(counts: dict[str, dict[int, int]]) -> int:
    """Each step of each system key once, none missing in between; the run's system points."""
    system = {key: steps for key, steps in counts.items() if key.startswith("system/")}
    twice = {(key, step): n for key, steps in system.items() for step, n in steps.items() if n != 1}
    assert not twice, f"points stored more than once: {list(twice.items())[:10]}"
    gaps = {}
    for key, steps in system.items():
        missing = set(range(min(steps), max(steps) + 1)) - set(steps)
        if key in CPU_KEYS:
            missing -= set(system.get(MEMORY, {}))
        if missing:
            gaps[key] = sorted(missing)
    assert not gaps, f"points lost: {gaps}"
    assert min(system[MEMORY]) == 0
    return sum(sum(steps.values()) for steps in system.values())


def _store_state(uri: str, run_id: str) -> tuple:
    run = MlflowClient(uri).get_run(run_id)
    return run.info.status, run.info.end_time, dict(run.data.tags), dict(run.data.params), _per_key_and_step(uri, run_id)


def _full(folder: Path) -> bool:
    stat = os.statvfs(folder)
    return stat.f_bavail == 0


@pytest.mark.parametrize("code", [3, 0])
def test_a_disk_the_script_fills_mid_run_costs_the_logs_never_the_run(code, store_uri, radt_home, tmp_path):
    (tmp_path / "chatty.py").write_text(textwrap.dedent(SCRIPT))
    env = radt_env(radt_home, store_uri, extra={"CODE": str(code)})
    out, err = tmp_path / "out.txt", tmp_path / "err.txt"
    with tmpfs(radt_home, size="256k") as home:
        (tmp_path / "cache").mkdir()
        (home / "cache").symlink_to(tmp_path / "cache", target_is_directory=True)  # pip freeze's cache off the small disk
        with open(out, "wb") as stdout, open(err, "wb") as stderr:
            proc = subprocess.Popen(
                radt_command("-e", "fulldisk", "-l", "host", "--interval", "0.2", "chatty.py"), env=env, cwd=tmp_path, stdout=stdout, stderr=stderr
            )
        try:
            run_dir = wait_for(lambda: next(iter((home / "runs").glob("*/meta.json")), None), process=proc, what="the run's folder").parent
            run_id = run_dir.name
            wait_for(lambda: _per_key_and_step(store_uri, run_id).get("loss", {}).keys() == set(range(5)), process=proc, what="the script's losses")
            wait_for(lambda: _last_tick(store_uri, run_id) >= 2, process=proc, what="first samples in the store")
            (tmp_path / "go").write_text("")
            wait_for(lambda: _full(home), process=proc, what="the small disk full")
            filled = _last_tick(store_uri, run_id)
            wait_for(lambda: _last_tick(store_uri, run_id) >= filled + 3, process=proc, what="samples taken on the full disk")
            (tmp_path / "finish").write_text("")
            returned = proc.wait(60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)
        said = err.read_text()
        assert returned == code, said
        assert "Traceback" not in said, said
        assert "store still unreachable" not in said, said
        assert "KILLED" not in said, said
        printed = out.read_text().splitlines()
        assert [line[:9] for line in printed] == [f"line {i:04d}" for i in range(LINES)], "every line reached the terminal"
        kept = (run_dir / "logs" / "stdout.log").stat().st_size + (run_dir / "logs" / "stderr.log").stat().st_size
        missing = LINES * (LINE + 1) + len("the script's own stderr line\n") - kept
        lines = [line for line in said.splitlines() if "bytes of the script's output" in line]
        assert len(lines) == 1, said
        assert re.fullmatch(
            rf"radt: {re.escape(str(run_dir))} could not be written \(No space left on device\): {missing:,} bytes of the script's output "
            r"are not in its logs \(the terminal got them\); not written either: .*",
            lines[0],
        ), lines[0]
        status, _end, tags, params, counts = before = _store_state(store_uri, run_id)
        assert status == ("FINISHED" if code == 0 else "FAILED")
        assert tags["radt.exit_code"] == str(code)
        assert params["lr"] == "0.1"
        assert counts["loss"] == dict.fromkeys(range(5), 1), "the script's own metrics, once each"
        points = _assert_every_point_once(counts)
        assert int(tags["radt.points"]) == points, "radt.points counts every sampled point, each of them in the store"
        assert max(counts[MEMORY]) >= filled + 3

        synced = run_radt(["sync"], env, tmp_path)
        assert synced.returncode == 0, synced.stderr
        assert _store_state(store_uri, run_id) == before, synced.stderr
        assert "nothing waits" in synced.stderr, synced.stderr


def test_a_final_status_with_nowhere_to_wait_is_written_now_where_the_store_answers(store_uri, radt_home, monkeypatch, capfd):
    """Something of the run is not in the store (the writer lost points while the store was away and the spool's disk was full)
    and pending.json cannot be written either: the run ends now, with its status and exit code, never RUNNING for sync to KILL."""
    from radt.collectors.run.finish import RunEnd, RunPart, finish_run, local_run_dir
    from radt.collectors.store.tracking import PROCESS_ONLY_ENV, connect
    from radt.rundir import release_run_dir

    for name, value in PROCESS_ONLY_ENV.items():  # what connect() sets in this process, undone after the test
        monkeypatch.setenv(name, os.environ.get(name, value))
    client = connect(store_uri)
    run_id = client.create_run(client.create_experiment("nowhere")).info.run_id
    with tmpfs(radt_home / "runs") as runs:
        run_dir = local_run_dir(store_uri, run_id, None)
        fill(runs)
        try:
            finish_run(client, RunPart(run_id, run_dir), RunEnd("FAILED", 3), False, 42)
        finally:
            release_run_dir(run_dir)
        said = capfd.readouterr().err
    run = MlflowClient(store_uri).get_run(run_id)
    assert (run.info.status, run.data.tags.get("radt.exit_code"), run.data.tags.get("radt.points")) == ("FAILED", "3", "42"), said
    assert "store still unreachable" not in said and "KILLED" not in said, said
    assert (
        f"radt: cannot save the final status in {run_dir} (No space left on device); ending run {run_id} now, what it has not sent stays there for 'radt sync'"
        in said
    ), said
