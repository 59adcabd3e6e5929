"""Every way a recording ends closes all of its parts, once: a script that cannot start ends FAILED, a CSV run
whose workload is called off before its start ends KILLED, an error inside radt ends the run FAILED; each time
the sources are closed, radt's signal handlers are back as they were and every point the writer took is in the store.

The runner's paths run in a real `python -m radt`-like process (tests/support/radtproc.py's environment, a driver
that calls runner.run_script and reports its signal handlers and closed sources); the error path runs
collectors/recording.Recording in this process, with one source that fails every sample: the only fake, at the
hardware boundary. Real SQLite stores.
"""

from __future__ import annotations

import json
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import sqlalchemy as sa
from mlflow import MlflowClient

from radt.collectors.sources.base import MetricSource, SamplingContext
from radt.rundir import DONE_FILE, SPOOL_FILE
from tests.support.polling import wait_for
from tests.support.radtproc import radt_env

# runs runner.run_script as `radt` would, the host source's close() counted; prints the handlers before and after
DRIVER = textwrap.dedent(
    """
    import json, signal, sys
    from pathlib import Path
    from radt.collectors.run import runner
    from radt.collectors.sources.host import HostSource

    closed = []
    real_close = HostSource.close

    def close(self):
        closed.append(self.name)
        real_close(self)

    HostSource.close = close

    def handlers():
        return {s.name: repr(signal.getsignal(s)) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}

    options = json.loads(sys.argv[1])
    if options.get("start_gate"):
        options["start_gate"] = Path(options["start_gate"])
    # a shell's foreground Python; from a background job SIGINT comes ignored, and radt answers Ctrl-C there on
    # purpose (proctree.restore_interrupts), so "as they were" starts from Python's own handler
    signal.signal(signal.SIGINT, signal.default_int_handler)
    before = handlers()
    code = runner.run_script(runner.RunOptions(**options))
    print(json.dumps({"code": code, "closed": closed, "before": before, "after": handlers()}))
    """
)


def _run_script(tmp_path: Path, home: Path, store: str, **options) -> dict:
    env = radt_env(home, store)
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, json.dumps({"store": store, "listeners": ["host"], "interval": 0.1, "flush_timeout": 10, **options})],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["stderr"] = done.stderr
    return result


def _only_run(store: str):
    client = MlflowClient(store)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert len(runs) == 1, runs
    return runs[0]


def _metric_rows(store: str, run_id: str) -> int:
    engine = sa.create_engine(store)
    try:
        with engine.connect() as conn:
            return conn.execute(sa.text("select count(*) from metrics where run_uuid = :r"), {"r": run_id}).scalar_one()
    finally:
        engine.dispose()


def test_a_script_that_cannot_start_ends_failed_with_its_sources_closed_and_the_signals_back(radt_home, tmp_path, empty_sqlite):
    store = empty_sqlite(tmp_path / "s.db")
    script = tmp_path / "job.bin"
    script.write_bytes(b"\x7fELF" + b"\x00" * 60)  # passes radt's checks; exec says "Exec format error" (the Popen OSError path)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)

    result = _run_script(tmp_path, radt_home, store, script="./job.bin")

    assert result["code"] == 126, result["stderr"]
    run = _only_run(store)
    assert run.info.status == "FAILED" and run.data.tags["radt.exit_code"] == "126"
    assert result["closed"] == ["host"], "the opened source was closed, once"
    assert result["after"] == result["before"], "radt's signal handlers are back as they were"
    assert (radt_home / "runs" / run.info.run_id / DONE_FILE).exists(), "nothing waits for radt sync"


def test_a_workload_called_off_before_the_start_ends_the_run_killed_with_everything_closed(radt_home, tmp_path, empty_sqlite):
    store = empty_sqlite(tmp_path / "s.db")
    (tmp_path / "train.py").write_text("print('trained')\n")
    gate = tmp_path / "gate"
    gate.mkdir()
    (gate / "abort").touch()  # the scheduler called the workload off (another run failed to set up)

    result = _run_script(tmp_path, radt_home, store, script="train.py", start_gate=str(gate), letter="B")

    assert result["code"] == 130
    assert "trained" not in result["stderr"]
    assert (gate / "ready-B").exists() and (gate / "status-B").read_text() == "KILLED", "the scheduler reads the run's end from the gate"
    run = _only_run(store)
    assert run.info.status == "KILLED" and run.data.tags["radt.stop_reason"] == "not_started"
    assert result["closed"] == ["host"]
    assert result["after"] == result["before"]


class Counter(MetricSource):
    """Gives one reading a tick; records that it was closed."""

    name = "counter"

    def __init__(self) -> None:
        self.ticks = 0
        self.closed = 0

    def open(self, ctx: SamplingContext) -> None:
        pass

    def sample(self) -> dict[str, float]:
        self.ticks += 1
        return {"system/counter": float(self.ticks)}

    def close(self) -> None:
        self.closed += 1


class Broken(Counter):
    """A driver that opened, then fails every read."""

    name = "broken"

    def sample(self) -> dict[str, float]:
        raise RuntimeError("driver went away")


def test_an_error_inside_radt_ends_the_run_failed_with_its_points_written_and_everything_closed(radt_home, tmp_path, empty_sqlite):
    from radt.collectors.run.finish import RunPart, local_run_dir
    from radt.collectors.run.recording import Recording
    from radt.collectors.store.tracking import connect

    store = empty_sqlite(tmp_path / "s.db")
    client = connect(store)
    run_id = client.create_run(client.create_experiment("recording")).info.run_id
    part = RunPart(run_id, local_run_dir(store, run_id, None))
    counter, broken = Counter(), Broken()
    before = [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)]
    said: list[str] = []

    with pytest.raises(ZeroDivisionError), Recording(10.0, said.append) as rec:
        rec.catch_signals(lambda *_: None)
        rec.write(client, part, store)
        rec.sample([broken, counter], 0.05)
        wait_for(lambda: counter.ticks >= 5, what="a few ticks")
        1 / 0  # a bug in radt while the script runs  # noqa: B018

    assert [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)] == before
    assert (counter.closed, broken.closed) == (1, 1), "both sources closed, once"
    assert any("driver went away" in line for line in said), said
    run = MlflowClient(store).get_run(run_id)
    assert run.info.status == "FAILED" and run.data.tags["radt.stop_reason"] == "radt_error"
    stored = _metric_rows(store, run_id)
    assert stored == counter.ticks == rec.writer.written, "every point the sampler took is in the store"
    assert run.data.tags["radt.points"] == str(stored)
    assert not (part.run_dir / SPOOL_FILE).exists() or not (part.run_dir / SPOOL_FILE).read_text()
    assert (part.run_dir / DONE_FILE).exists()
