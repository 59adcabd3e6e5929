"""The test Slurm's pid files (tests/support/slurm.py) on a machine that killed the daemons of an earlier session and
gave their pids to other processes: CI found such a cluster, took each stale pid for its daemon, started none, and every
Slurm test failed with "slurmctld and slurmd to answer". A pid counts only while its process was started with this
cluster's slurm.conf, and the cluster's stop never signals another process."""

from __future__ import annotations

import subprocess
import sys

import psutil
import pytest

from tests.support import slurm
from tests.support.polling import alive, gone_within, wait_for


@pytest.fixture
def cluster_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(slurm, "CLUSTER_DIR", tmp_path)
    return tmp_path


def _sleeper(*argv: str) -> subprocess.Popen:
    """A process that is not a Slurm daemon (or looks like one by its arguments) and waits to be ended; returned once its
    command line is readable (Popen returns when exec closes its pipe, before the kernel has set the new argv)."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", *argv])
    wait_for(lambda: psutil.Process(process.pid).cmdline()[2:] == ["import time; time.sleep(600)", *argv], timeout=10, what="the sleeper's command line")
    return process


def test_a_pid_file_whose_pid_another_process_took_names_no_daemon_and_stop_leaves_that_process_alone(cluster_dir):
    stranger = _sleeper()
    try:
        for _, pidfile, _ in slurm._daemons():
            (cluster_dir / pidfile).write_text(f"{stranger.pid}\n")
        assert [slurm._pid(pidfile) for _, pidfile, _ in slurm._daemons()] == [None] * 4
        slurm._stop()
        assert alive([stranger.pid]) == [stranger.pid], "the cluster's stop signalled a process that is not its daemon"
    finally:
        stranger.kill()
        stranger.wait()


def test_a_process_started_with_the_clusters_configuration_is_its_daemon_until_it_ends(cluster_dir):
    daemon = _sleeper("-f", str(cluster_dir / "slurm.conf"))
    try:
        (cluster_dir / "slurmctld.pid").write_text(str(daemon.pid))
        assert slurm._pid("slurmctld.pid") == daemon.pid
        slurm._stop()
        gone_within([daemon.pid], timeout=10)
        assert slurm._pid("slurmctld.pid") is None
    finally:
        daemon.kill()
        daemon.wait()
