"""A real one-node Slurm for the tests: munged, slurmctld and slurmd from Debian's `slurm-wlm` and `munge`.

Started once and left running (other tests, other test runs, may be using it): a second call finds it
up and only checks that it answers. Its configuration, state, logs and the plain files that stand in
for 4 GPUs (`Gres=gpu:4`) live in CLUSTER_DIR; it listens on its own ports, so a site's Slurm on the
default ones is left alone. Commands reach it through SLURM_CONF (`env()`).

A second slurmd on the same host is node MIG_NODE of partition MIG_PARTITION: two A100s partitioned by an
admin, offered as Slurm's MIG GRES types (`gpu:1g.5gb:7,gpu:3g.20gb:2`) on plain files, in the order the
fake NVML's MIG_GPUS lists the slices (AutoDetect=nvml numbers them so). A third is node MPS_NODE of partition
MPS_PARTITION: GPUS plain GPUs offered as Slurm's `mps` GRES too (`gpu:4,mps:400`, 100 per GPU).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import warnings
from pathlib import Path

import psutil
import pytest

from tests.support.polling import alive, wait_for

CLUSTER_DIR = Path(os.environ.get("RADT_TEST_SLURM_DIR", "/tmp/radt-test-slurm"))
GPUS = 4
PARTITION = "debug"
CTLD_PORT = int(os.environ.get("RADT_TEST_SLURM_PORT", "6917"))  # not Slurm's 6817: a site's own cluster on this host keeps it
SLURMD_PORT, MIG_SLURMD_PORT, MPS_SLURMD_PORT = CTLD_PORT + 1, CTLD_PORT + 2, CTLD_PORT + 3
MIG_NODE, MIG_PARTITION = "radtmig", "mig"
MPS_NODE, MPS_PARTITION, MPS_PER_GPU = "radtmps", "mps", 100
MIG_SLICES = (("1g.5gb", 7), ("3g.20gb", 2))  # per Slurm GRES type, its slices; GPU 0 holds the 1g.5gb, GPU 1 the 3g.20gb
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
GresTypes=gpu,mps
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool/%n
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd-%n.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd-%n.log
ReturnToService=2
KillWait=10
NodeName={host} CPUs=8 RealMemory=4000 Gres=gpu:{gpus} State=UNKNOWN
NodeName={mig_node} NodeHostname={host} NodeAddr=127.0.0.1 Port={mig_port} CPUs=8 RealMemory=4000 Gres={mig_gres} State=UNKNOWN
PartitionName={partition} Nodes={host} Default=YES MaxTime=INFINITE State=UP
NodeName={mps_node} NodeHostname={host} NodeAddr=127.0.0.1 Port={mps_port} CPUs=8 RealMemory=4000 Gres=gpu:{gpus},mps:{mps} State=UNKNOWN
PartitionName={mig_partition} Nodes={mig_node} MaxTime=INFINITE State=UP
PartitionName={mps_partition} Nodes={mps_node} MaxTime=INFINITE State=UP
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
        files = _configure()
        if any(not path.exists() or path.read_text() != text for path, text in files.items()):
            _stop()  # daemons of an earlier test run, started with another configuration: Slurm adds nodes on a restart
            for path, text in files.items():
                path.write_text(text)
        if _trouble() is not None:
            _start()
        _node_ready()
    return env()


def _munge_answers() -> bool:
    """Whether munged gives and reads back a credential (`munge -n | unmunge`)."""
    return subprocess.run("munge -n | unmunge", shell=True, capture_output=True, timeout=10).returncode == 0


def _munge() -> None:
    """munged, started if `munge -n` cannot get a credential."""
    if _munge_answers():
        return
    key = Path("/etc/munge/munge.key")
    if not key.exists():
        subprocess.run(["mungekey", "-c"], check=True, capture_output=True)
    Path("/run/munge").mkdir(parents=True, exist_ok=True)
    shutil.chown("/run/munge", "munge", "munge")
    shutil.chown(key, "munge", "munge")
    subprocess.run(["su", "-s", "/bin/sh", "munge", "-c", "/usr/sbin/munged"], check=True, capture_output=True)
    wait_for(_munge_answers, timeout=20, what="munged to answer")


def _configure() -> dict[Path, str]:
    """The cluster's folders and plain device files; its configuration files' text, written by the caller."""
    host = socket.gethostname().split(".")[0]
    for folder in ("state", "spool", *(f"spool/{node}" for node in _nodes()), "gpus"):
        (CLUSTER_DIR / folder).mkdir(exist_ok=True)
    for number in range(GPUS):
        (CLUSTER_DIR / "gpus" / f"gpu{number}").touch()  # slurmd counts a generic GPU per device file
    gres = [f"AutoDetect=off\nNodeName={host} Name=gpu File={CLUSTER_DIR}/gpus/gpu[0-{GPUS - 1}]\n"]
    first = 0
    for profile, count in MIG_SLICES:  # one plain file per slice, numbered as Slurm numbers the node's GPU GRES
        for number in range(first, first + count):
            (CLUSTER_DIR / "gpus" / f"mig{number}").touch()
        gres.append(f"NodeName={MIG_NODE} Name=gpu Type={profile} File={CLUSTER_DIR}/gpus/mig[{first}-{first + count - 1}]\n")
        first += count
    gres.append(f"NodeName={MPS_NODE} Name=gpu File={CLUSTER_DIR}/gpus/gpu[0-{GPUS - 1}]\n")
    gres += [f"NodeName={MPS_NODE} Name=mps Count={MPS_PER_GPU} File={CLUSTER_DIR}/gpus/gpu{number}\n" for number in range(GPUS)]
    mig_gres = ",".join(f"gpu:{profile}:{count}" for profile, count in MIG_SLICES)
    values = {"host": host, "dir": CLUSTER_DIR, "gpus": GPUS, "partition": PARTITION, "ctld_port": CTLD_PORT, "slurmd_port": SLURMD_PORT}
    values |= {"mig_node": MIG_NODE, "mig_port": MIG_SLURMD_PORT, "mig_gres": mig_gres, "mig_partition": MIG_PARTITION}
    values |= {"mps_node": MPS_NODE, "mps_port": MPS_SLURMD_PORT, "mps": MPS_PER_GPU * GPUS, "mps_partition": MPS_PARTITION}
    return {CLUSTER_DIR / "slurm.conf": CONF.format(**values), CLUSTER_DIR / "gres.conf": "".join(gres)}


def _nodes() -> tuple[str, ...]:
    """The cluster's nodes, each a slurmd of its own on this host."""
    return (socket.gethostname().split(".")[0], MIG_NODE, MPS_NODE)


def mig_gpus() -> str:
    """The MIG node's GPUs as the fake NVML answers (RADT_FAKE_NVML): the slices in Slurm's GRES order."""
    from tests.fakes.fake_nvml import A100, mig_gpu

    ones = [(gi, "1g.5gb", 0.3) for gi in range(7, 14)]  # nvidia-smi's GPU instance ids of an A100 40GB's 1g.5gb slices
    gpus = [
        mig_gpu(A100, *ones, uuid="GPU-a100a000-0000-4000-8000-000000000000"),
        mig_gpu(A100, (1, "3g.20gb", 0.6), (2, "3g.20gb", 0.4), uuid="GPU-a100b000-0000-4000-8000-000000000001"),
    ]
    return json.dumps(gpus)


def _trouble() -> str | None:
    """What keeps the cluster from answering (munge, slurmctld's ping, sinfo, a daemon not running), or None."""
    try:
        if not _munge_answers():
            return "munged does not answer (munge -n | unmunge fails)"
        ping = _run(["scontrol", "ping"], timeout=10)
        if "is UP" not in ping.stdout:
            return f"scontrol ping says {(ping.stdout + ping.stderr).strip()!r}"
        nodes = _run(["sinfo", "-h", "-N", "-o", "%N"], timeout=10)
        if nodes.returncode != 0 or not nodes.stdout.strip():
            return f"sinfo exits {nodes.returncode}: {(nodes.stdout + nodes.stderr).strip()!r}"
    except subprocess.TimeoutExpired as exc:
        return f"{' '.join(map(str, exc.cmd)) if isinstance(exc.cmd, list) else exc.cmd} took over {exc.timeout:.0f} s"
    dead = [pidfile for _, pidfile, _ in _daemons() if not _alive(pidfile)]
    return f"not running: {', '.join(dead)}" if dead else None


def _daemons() -> list[tuple[list[str], str, str]]:
    """(arguments, pid file, log file) of each daemon: slurmctld, and a slurmd per node."""
    slurmd = [(["/usr/sbin/slurmd", "-N", node], f"slurmd-{node}.pid", f"slurmd-{node}.log") for node in _nodes()]
    return [(["/usr/sbin/slurmctld"], "slurmctld.pid", "slurmctld.log"), *slurmd]


def _pid(pidfile: str) -> int | None:
    """The daemon's pid while it runs: a live process started with this cluster's slurm.conf. A pid file outlives its
    daemon when the daemon is killed (a machine that ends a session's processes, then runs CI): its pid may belong to
    another process by now, which is neither this cluster's daemon nor to be signalled. A zombie does not run either."""
    try:
        pid = int((CLUSTER_DIR / pidfile).read_text())
        command = psutil.Process(pid).cmdline()
    except (OSError, ValueError, psutil.Error):
        return None
    return pid if str(CLUSTER_DIR / "slurm.conf") in command and alive([pid]) else None


def _alive(pidfile: str) -> bool:
    return _pid(pidfile) is not None


def _start() -> None:
    """Each daemon that is not running started; if the cluster still does not answer in 30 s, every daemon is stopped
    and started again once (a daemon that hangs, or one another one can no longer reach) before the fixture fails."""
    try:
        _launch()
        wait_for(lambda: _trouble() is None, timeout=30, what=_report)
    except AssertionError as first:
        warnings.warn(f"the test Slurm was started again from scratch: {first}", stacklevel=2)
        _stop()
        _launch()
        wait_for(lambda: _trouble() is None, timeout=60, what=_report)


def _launch() -> None:
    conf = str(CLUSTER_DIR / "slurm.conf")
    for args, pidfile, logfile in _daemons():
        if not _alive(pidfile):
            done = subprocess.run([*args, "-f", conf], capture_output=True, text=True, env={**os.environ, **env()}, timeout=60)
            if done.returncode != 0:
                log = (CLUSTER_DIR / logfile).read_text()[-2000:] if (CLUSTER_DIR / logfile).exists() else ""
                raise RuntimeError(f"{args[0]} did not start ({done.returncode}): {done.stderr.strip()}\n{log}")


def _report() -> str:
    """Why the cluster does not answer, with the end of each daemon's log."""
    tails = "\n".join(_tail(logfile) for _, _, logfile in _daemons())
    return f"slurmctld and slurmd to answer ({_trouble()}); pids {[(p, _pid(p)) for _, p, _ in _daemons()]}\n{tails}"


def _stop() -> None:
    """The cluster's daemons ended (SIGTERM, as systemd stops them; SIGKILL after 20 s), those of an older
    configuration's pid files included."""
    pids = [pid for pidfile in ("slurmctld.pid", "slurmd.pid", *[p for _, p, _ in _daemons()]) if (pid := _pid(pidfile))]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in alive(pids):
            os.kill(pid, sig)
        try:
            wait_for(lambda: not alive(pids), timeout=20, what=f"the test cluster's daemons to end on {sig.name}")
            return
        except AssertionError:
            if sig == signal.SIGKILL:
                raise


def _node_ready() -> None:
    """The nodes idle (or running jobs): each resumed once if it registered down or drained."""
    for node in _nodes():

        def state(node: str = node) -> str:
            return _run(["sinfo", "-h", "-N", "-n", node, "-o", "%t"]).stdout.strip()

        if any(word in state() for word in ("down", "drain", "inval", "fail")):
            _run(["scontrol", "update", f"nodename={node}", "state=resume"])
        wait_for(
            lambda state=state, node=node: state().rstrip("*") in ("idle", "mix", "alloc"),
            timeout=60,
            what=lambda state=state, node=node: f"node {node} idle (sinfo says {state()!r}); {_tail(f'slurmd-{node}.log')}",
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
