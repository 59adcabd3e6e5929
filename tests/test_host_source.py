"""The host source on this machine's real /proc: the training tree's CPU is measured between ticks."""

from __future__ import annotations

import subprocess
import sys
import time

from radt.collectors.proctree import ProcessTree
from radt.collectors.sources.base import SamplingContext
from radt.collectors.sources.host import HostSource
from tests.support.polling import wait_for

BUSY = "import time\nend = time.time() + 30\nwhile time.time() < end: pass\n"


def test_process_tree_cpu_of_a_busy_child_and_its_child():
    parent = subprocess.Popen([sys.executable, "-c", f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {BUSY!r}]); exec({BUSY!r})"])
    try:
        tree = ProcessTree(parent.pid, max_age=0.0)
        wait_for(lambda: len(tree.processes()) >= 2, timeout=10, what="the grandchild to exist")
        assert len(tree.processes()) == 2
        source = HostSource()
        source.open(SamplingContext(interval=0.5, pids=tree.processes))
        first = source.sample()  # psutil's first reading of a process is 0 by definition
        readings = []
        for _ in range(3):
            time.sleep(0.5)
            readings.append(source.sample()["system/process_cpu_utilization_percentage"])
        assert "system/process_cpu_utilization_percentage" in first
        # two busy loops on a 2-core machine shared with other tests: above zero on every tick, more than a fifth of a core at least once
        assert min(readings) > 5 and max(readings) > 20, readings
        assert source.sample()["system/process_memory_rss_megabytes"] > 5
    finally:
        for proc in tree.processes():
            proc.kill()
        parent.wait()
