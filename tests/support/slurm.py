"""A real one-node Slurm for the tests: munged, slurmctld and slurmd from Debian's `slurm-wlm` and `munge`.

Started once and left running (other tests, other test runs, may be using it): a second call finds it
up and only checks that it answers. Its configuration, state, logs and the plain files that stand in
for 4 GPUs (`Gres=gpu:4`) live in CLUSTER_DIR; it listens on its own ports, so a site's Slurm on the
default ones is left alone. Commands reach it through SLURM_CONF (`env()`).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from tests.support.polling import wait_for

CLUSTER_DIR = Path(os.environ.get("RADT_TEST_SLURM_DIR", "/tmp/radt-test-slurm"))
GPUS = 4
PARTITION = "debug"
CTLD_PORT, SLURMD_PORT = 6917, 6918  # not Slurm's 6817/6818: a site's own cluster on this host keeps them
PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "sinfo")

CONF = """\
ClusterName=radttest
SlurmctldHost={host}
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
AuthType=auth/munge
MpiDefault=none
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
GresTypes=gpu
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd.log
ReturnToService=2
KillWait=10
NodeName={host} CPUs=8 RealMemory=4000 Gres=gpu:{gpus} State=UNKNOWN
PartitionName={partition} Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def env() -> dict[str, str]:
    """What a process needs to reach the test cluster (pass it as radt_env's `extra`)."""
    return {"SLURM_CONF": str(CLUSTER_DIR / "slurm.conf")}


def _run(args: list[str], timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, env={**os.environ, **env()})


def unavailable() -> str | None:
    """Why this machine cannot run the test cluster, or None."""
    missing = [p for p in PROGRAMS if not shutil.which(p) and not Path("/usr/sbin", p).exists()]
    if missing:
        return f"{', '.join(missing)} not installed (apt-get install slurm-wlm munge)"
    if os.geteuid() != 0:
        return "slurmd must run as root"
    return None


def cluster() -> dict[str, str]:
    """The running test cluster (started if it is not): env() for its commands. Skips without Slurm, fails under CI."""
    reason = unavailable()
    if reason:
        if os.environ.get("CI") == "true":
            pytest.fail(f"Slurm is required under CI: {reason}")
        pytest.skip(f"no Slurm for the test cluster: {reason}")
    CLUSTER_DIR.mkdir(parents=True, exist_ok=True)
    with open(CLUSTER_DIR / "start.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # xdist workers and concurrent test runs start it once
        _munge()
        changed = _configure()
        if not _answers():
            _start()
        elif changed:  # daemons of an earlier test run, started with another configuration
            _run(["scontrol", "reconfigure"])
        _node_ready()
    return env()


def _munge() -> None:
    """munged, started if `munge -n` cannot get a credential."""
    if subprocess.run("munge -n | unmunge", shell=True, capture_output=True).returncode == 0:
        return
    key = Path("/etc/munge/munge.key")
    if not key.exists():
        subprocess.run(["mungekey", "-c"], check=True, capture_output=True)
    Path("/run/munge").mkdir(parents=True, exist_ok=True)
    shutil.chown("/run/munge", "munge", "munge")
    shutil.chown(key, "munge", "munge")
    subprocess.run(["su", "-s", "/bin/sh", "munge", "-c", "/usr/sbin/munged"], check=True, capture_output=True)
    wait_for(lambda: subprocess.run("munge -n | unmunge", shell=True, capture_output=True).returncode == 0, timeout=20, what="munged to answer")


def _configure() -> bool:
    """The cluster's files; True when they changed."""
    host = socket.gethostname().split(".")[0]
    for folder in ("state", "spool", "gpus"):
        (CLUSTER_DIR / folder).mkdir(exist_ok=True)
    for number in range(GPUS):
        (CLUSTER_DIR / "gpus" / f"gpu{number}").touch()  # slurmd counts a generic GPU per device file
    values = {"host": host, "dir": CLUSTER_DIR, "gpus": GPUS, "partition": PARTITION, "ctld_port": CTLD_PORT, "slurmd_port": SLURMD_PORT}
    conf = _write(CLUSTER_DIR / "slurm.conf", CONF.format(**values))
    gres = _write(CLUSTER_DIR / "gres.conf", f"AutoDetect=off\nNodeName={host} Name=gpu File={CLUSTER_DIR}/gpus/gpu[0-{GPUS - 1}]\n")
    return conf or gres


def _write(path: Path, text: str) -> bool:
    if path.exists() and path.read_text() == text:
        return False
    path.write_text(text)
    return True


def _answers() -> bool:
    try:
        ping = _run(["scontrol", "ping"], timeout=10)
        nodes = _run(["sinfo", "-h", "-N", "-o", "%N"], timeout=10)
    except subprocess.TimeoutExpired:
        return False
    return "is UP" in ping.stdout and nodes.returncode == 0 and bool(nodes.stdout.strip()) and _alive("slurmd.pid")


def _alive(pidfile: str) -> bool:
    try:
        pid = int((CLUSTER_DIR / pidfile).read_text())
        os.kill(pid, 0)
        return True
    except (OSError, ValueError):
        return False


def _start() -> None:
    conf = str(CLUSTER_DIR / "slurm.conf")
    for daemon, pidfile in (("slurmctld", "slurmctld.pid"), ("slurmd", "slurmd.pid")):
        if not _alive(pidfile):
            done = subprocess.run([f"/usr/sbin/{daemon}", "-f", conf], capture_output=True, text=True, env={**os.environ, **env()}, timeout=60)
            if done.returncode != 0:
                log = (CLUSTER_DIR / f"{daemon}.log").read_text()[-2000:] if (CLUSTER_DIR / f"{daemon}.log").exists() else ""
                raise RuntimeError(f"{daemon} did not start ({done.returncode}): {done.stderr.strip()}\n{log}")
    wait_for(_answers, timeout=60, what=lambda: f"slurmctld and slurmd to answer; {_tail('slurmctld.log')}")


def _node_ready() -> None:
    """The node idle (or running jobs): resumed once if it registered down or drained."""
    host = socket.gethostname().split(".")[0]

    def state() -> str:
        return _run(["sinfo", "-h", "-N", "-n", host, "-o", "%t"]).stdout.strip()

    if any(word in state() for word in ("down", "drain", "inval", "fail")):
        _run(["scontrol", "update", f"nodename={host}", "state=resume"])
    wait_for(
        lambda: state().rstrip("*") in ("idle", "mix", "alloc"), timeout=60, what=lambda: f"node {host} idle (sinfo says {state()!r}); {_tail('slurmd.log')}"
    )


def _tail(name: str) -> str:
    path = CLUSTER_DIR / name
    return f"{name}: {path.read_text()[-1500:]}" if path.exists() else f"no {name}"


def jobs(name_prefix: str = "") -> list[tuple[str, str]]:
    """(job id, state) of the cluster's jobs still in squeue (pending, running, completing), whose name starts with the prefix."""
    out = _run(["squeue", "-h", "-o", "%i|%T|%j"]).stdout
    found = [line.split("|", 2) for line in out.splitlines() if line.strip()]
    return [(job, state) for job, state, name in found if name.startswith(name_prefix)]


def job_state(job: str) -> str:
    """Slurm's state of one job (PENDING, RUNNING, COMPLETED, CANCELLED, ...), '' once forgotten."""
    out = _run(["scontrol", "show", "job", "-o", job]).stdout
    return next((word.split("=", 1)[1] for word in out.split() if word.startswith("JobState=")), "")
