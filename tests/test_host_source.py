"""The host source on this machine's real /proc: the training tree's CPU is measured between ticks."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import psutil
from mlflow import MlflowClient

from radt.collectors.process.proctree import ProcessTree
from radt.collectors.sources.base import SamplingContext
from radt.collectors.sources.host import HostSource
from tests.support.polling import wait_for
from tests.support.radtproc import radt_env, run_radt

BUSY = "import time\nend = time.time() + 30\nwhile time.time() < end: pass\n"


def test_process_tree_cpu_of_a_busy_child_and_its_child():
    parent = subprocess.Popen([sys.executable, "-c", f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {BUSY!r}]); exec({BUSY!r})"])
    try:
        tree = ProcessTree(parent.pid, max_age=0.0)
        wait_for(lambda: len(tree.processes()) >= 2, timeout=10, what="the grandchild to exist")
        assert len(tree.processes()) == 2
        source = HostSource()
        source.open(SamplingContext(interval=0.5, pids=tree.processes))
        source.sample()  # the first tick, right after open(): no CPU value (see below)
        readings = []
        for _ in range(3):
            time.sleep(0.5)
            readings.append(source.sample()["system/process_cpu_utilization_percentage"])
        # two busy loops on a 2-core machine shared with other tests: above zero on every tick, more than a fifth of a core at least once
        assert min(readings) > 5 and max(readings) > 20, readings
        assert source.sample()["system/process_memory_rss_megabytes"] > 5
    finally:
        for proc in tree.processes():
            proc.kill()
        parent.wait()


def _busy_tree():
    """A busy Python with a busy child (two loops), and its ProcessTree once both are seen."""
    parent = subprocess.Popen([sys.executable, "-c", f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {BUSY!r}]); exec({BUSY!r})"])
    tree = ProcessTree(parent.pid, max_age=0.0)
    wait_for(lambda: len(tree.processes()) >= 2, timeout=10, what="the grandchild to exist")
    return parent, tree


def _end(parent: subprocess.Popen, tree: ProcessTree) -> None:
    for proc in tree.processes():
        proc.kill()
    parent.wait()


def _on_another_thread(call):
    """`call()` on a thread of its own, as the sampler's thread calls sample() after the runner's open()."""
    result = []
    thread = threading.Thread(target=lambda: result.append(call()))
    thread.start()
    thread.join(30)
    return result[0]


def test_the_first_cpu_readings_are_measured_over_the_interval_since_open_on_the_samplers_thread():
    """psutil keeps cpu_percent()'s last reading per thread and per Process object: the sampler's first tick (its
    thread's first call) gave the host's CPU 0.0 and the run's CPU 0.0, a line down to 0 at t = 0 on every run."""
    parent, tree = _busy_tree()
    try:
        source = HostSource()
        source.open(SamplingContext(interval=0.5, pids=tree.processes))  # on this thread, as the runner opens its sources
        time.sleep(0.5)
        first = _on_another_thread(source.sample)
        cores = psutil.cpu_count()
        # two busy loops: the host is at least a share of one core of `cores` busy, the run's tree more than a fifth of a core
        assert first.get("system/cpu_utilization_percentage", 0.0) > 20 / cores, first
        assert first.get("system/process_cpu_utilization_percentage", 0.0) > 20, first
    finally:
        _end(parent, tree)


def test_a_reading_right_after_open_has_no_cpu_value_rather_than_an_unmeasured_zero():
    parent, tree = _busy_tree()
    try:
        source = HostSource()
        source.open(SamplingContext(interval=0.5, pids=tree.processes))
        first = source.sample()  # the sampler's first tick comes right after open(): nothing measured yet
        assert "system/cpu_utilization_percentage" not in first and "system/process_cpu_utilization_percentage" not in first, first
        assert first["system/process_memory_rss_megabytes"] > 5, "what needs no interval is there at once"
        time.sleep(0.5)
        assert source.sample()["system/process_cpu_utilization_percentage"] > 20
    finally:
        _end(parent, tree)


def test_a_tracked_busy_script_has_no_unmeasured_zero_in_its_cpu_series(tmp_path, radt_home, empty_sqlite):
    """What MLflow's UI and the charts read: the stored series of a busy script, from its first point on."""
    store = empty_sqlite(tmp_path / "s.db")
    (tmp_path / "busy.py").write_text("import time\nend = time.time() + 3\nwhile time.time() < end: pass\n")
    done = run_radt(["-l", "host", "--interval", "0.5", "busy.py"], env=radt_env(radt_home, store), cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    client = MlflowClient(store)
    run = client.search_runs([e.experiment_id for e in client.search_experiments()])[0]
    for name in ("system/cpu_utilization_percentage", "system/process_cpu_utilization_percentage"):
        values = [m.value for m in sorted(client.get_metric_history(run.info.run_id, name), key=lambda m: m.step)]
        assert len(values) >= 3 and values[0] > 0, (name, values)
