"""A real one-node Slurm with accounting for the tests: munged, MariaDB, slurmdbd, slurmctld and slurmd from Debian's
packages (slurm-wlm, slurmdbd, munge, mariadb-server), as ../shared/slurm-accounting.md starts them.

Started once and left running, like tests/support/slurm.py's cluster: a second call finds it answering. Everything lives
in ACCT_DIR on ports of its own (slurmctld 16927, slurmd 16928, slurmdbd 16929, MariaDB 13326), so the other test
cluster, a site's Slurm and the system's MariaDB are left alone. Its four GPUs are plain files (Gres=gpu:4) and
radt's own PrologSlurmctld (examples/slurm/radt-gres-prolog.sh) copies each job's GPU indices into its AdminComment.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
import subprocess
from pathlib import Path

from tests.support.paths import REPO
from tests.support.polling import wait_for

ACCT_DIR = Path(os.environ.get("RADT_TEST_ACCT_DIR", "/tmp/radt-test-acct"))
CTLD_PORT = 16927
PROGRAMS = ("munged", "mariadbd", "mariadb-install-db", "slurmdbd", "slurmctld", "slurmd", "sbatch", "sacct", "sacctmgr", "scontrol")
PROLOG = REPO / "examples" / "slurm" / "radt-gres-prolog.sh"

START = r"""
set -eu; A={dir}; H=$(hostname -s); export SLURM_CONF=$A/etc/slurm.conf
mkdir -p $A/etc $A/state $A/spool $A/log $A/run $A/gpu $A/munge; touch $A/gpu/gpu0 $A/gpu/gpu1 $A/gpu/gpu2 $A/gpu/gpu3
MS=$A/munge/munge.socket.2; chmod 755 $A/munge
[ -f $A/munge/munge.key ] || mungekey -c -k $A/munge/munge.key
pgrep -f "munged --socket=$MS" >/dev/null || munged --socket=$MS --key-file=$A/munge/munge.key --pid-file=$A/munge/munged.pid --log-file=$A/log/munged.log --seed-file=$A/munge/munged.seed
[ -d $A/db/mysql ] || mariadb-install-db --no-defaults --user=root --datadir=$A/db --auth-root-authentication-method=normal --skip-test-db >$A/log/install-db.log 2>&1
SQL="mariadb --no-defaults -S $A/run/mariadb.sock -uroot"
$SQL -e 'select 1' >/dev/null 2>&1 || setsid mariadbd --no-defaults --user=root --datadir=$A/db --socket=$A/run/mariadb.sock --port={db_port} --skip-networking=0 \
  --bind-address=127.0.0.1 --pid-file=$A/run/mariadbd.pid --log-error=$A/log/mariadbd.err \
  --innodb-lock-wait-timeout=900 --innodb-flush-log-at-trx-commit=2 --skip-log-bin </dev/null >/dev/null 2>&1 &
w() {{ for i in $(seq 300); do "$@" >/dev/null 2>&1 && return; sleep 0.1; done; echo "gave up: $*" >&2; exit 1; }}
w $SQL -e 'select 1'
$SQL -e "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'pw'; GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1'"
printf 'AuthType=auth/munge\nAuthInfo=socket=%s\nDbdHost=localhost\nDbdPort={dbd_port}\nSlurmUser=root\nLogFile=%s/log/slurmdbd.log\nPidFile=%s/run/slurmdbd.pid\nStorageType=accounting_storage/mysql\nStorageHost=127.0.0.1\nStoragePort={db_port}\nStorageUser=slurm\nStoragePass=pw\n' $MS $A $A > $A/etc/slurmdbd.conf
chmod 600 $A/etc/slurmdbd.conf
cat > $A/etc/prolog.sh <<EOF
#!/bin/sh
export SLURM_CONF=$SLURM_CONF
exec {prolog}
EOF
chmod 755 $A/etc/prolog.sh
cat > $A/etc/slurm.conf <<EOF
ClusterName=radtacct
SlurmctldHost=$H
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket=$MS
AccountingStoragePass=$MS
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
GresTypes=gpu
StateSaveLocation=$A/state
SlurmdSpoolDir=$A/spool
SlurmctldPidFile=$A/run/slurmctld.pid
SlurmdPidFile=$A/run/slurmd.pid
SlurmctldLogFile=$A/log/slurmctld.log
SlurmdLogFile=$A/log/slurmd.log
ReturnToService=2
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort={dbd_port}
AccountingStorageTRES=gres/gpu
AccountingStoreFlags=job_comment
PrologSlurmctld=$A/etc/prolog.sh
NodeName=$H CPUs=8 RealMemory=8000 Gres=gpu:4 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
printf 'AutoDetect=off\nNodeName=%s Name=gpu File=%s/gpu/gpu[0-3]\n' $H $A > $A/etc/gres.conf
sacctmgr -n list cluster >/dev/null 2>&1 || slurmdbd
w sacctmgr -n list cluster
sacctmgr -i add cluster radtacct >/dev/null 2>&1 || true
sacctmgr -i add account proj >/dev/null 2>&1 || true
sacctmgr -i add user root Account=proj >/dev/null 2>&1 || true
scontrol ping >/dev/null 2>&1 || slurmctld
pgrep -f "slurmd -f $A" >/dev/null || slurmd -f $A/etc/slurm.conf
# a node drained by an earlier start (another configuration) is resumed: its state is kept in $A/state
w sh -c "case \"\$(sinfo -h -o %t)\" in idle|mix|alloc) exit 0 ;; drain*|inval*|down*) scontrol update nodename=$H state=resume ;; esac; exit 1"
"""


def env() -> dict[str, str]:
    """The environment that points Slurm's commands at this cluster."""
    return {**os.environ, "SLURM_CONF": str(ACCT_DIR / "etc" / "slurm.conf")}


def unavailable() -> str | None:
    """Why this cluster cannot run here (a missing program), else None."""
    missing = [p for p in PROGRAMS if shutil.which(p) is None and not Path("/usr/sbin", p).exists()]
    if missing:
        return f"{', '.join(missing)} not installed (apt-get install slurm-wlm slurmdbd munge mariadb-server; .ci/run installs them)"
    return None


def cluster() -> dict[str, str]:
    """Start the cluster where it is not answering (under a lock: several test workers may ask at once); its env()."""
    problem = unavailable()
    assert problem is None, problem
    ACCT_DIR.mkdir(parents=True, exist_ok=True)
    with open(ACCT_DIR / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _answers():
            script = START.format(dir=ACCT_DIR, ctld_port=CTLD_PORT, slurmd_port=CTLD_PORT + 1, dbd_port=CTLD_PORT + 2, db_port=13326, prolog=PROLOG)
            log = ACCT_DIR / "start.log"
            with open(log, "w") as out:  # a file, not a pipe: the daemons it starts would hold a pipe open
                done = subprocess.run(
                    ["bash", "-c", script], env={**os.environ, "PATH": os.environ["PATH"] + ":/usr/sbin"}, stdout=out, stderr=out, timeout=120
                )
            assert done.returncode == 0, f"the accounting cluster did not start: {log.read_text()[-2000:]}"
    return env()


def _answers() -> bool:
    def ok(*args: str) -> bool:
        return subprocess.run(args, env=env(), capture_output=True, timeout=20).returncode == 0

    return (ACCT_DIR / "etc" / "slurm.conf").exists() and ok("scontrol", "ping") and ok("sacctmgr", "-n", "list", "cluster")


def host() -> str:
    """The one node's name (hostname -s), which the exporter stand-in must publish as Hostname."""
    return socket.gethostname().split(".")[0]


def submit(*args: str) -> str:
    """sbatch ARGS on this cluster; the job id."""
    out = ACCT_DIR / "out"  # not the tests' working directory (the repository)
    out.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["sbatch", "--parsable", f"--output={out}/slurm-%j.out", *args], env=env(), capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().split(";")[0]


def scontrol(*args: str) -> str:
    """scontrol ARGS on this cluster (as its administrator); what it printed."""
    done = subprocess.run(["scontrol", *args], env=env(), capture_output=True, text=True, timeout=20)
    assert done.returncode == 0, done.stderr
    return done.stdout


def accounted(job: str, states: tuple[str, ...], timeout: float = 60) -> str:
    """Wait until sacct holds `job` (an id, or array_task) in one of `states`; that state."""

    def state() -> str | None:
        done = subprocess.run(["sacct", "-n", "-X", "-P", "-j", job, "-o", "JobID,State"], env=env(), capture_output=True, text=True, timeout=20)
        for line in done.stdout.splitlines():
            jid, _, found = line.partition("|")
            if jid == job and found.split()[0] in states:
                return found.split()[0]
        return None

    return wait_for(state, timeout=timeout, what=lambda: f"job {job} in sacct as one of {states}")


def running(job: str, timeout: float = 60) -> str:
    """Wait until slurmctld runs `job` (sacct may show a short job only once it ended); its `scontrol -o -d show job`."""

    def detail() -> str | None:
        done = subprocess.run(["scontrol", "-o", "-d", "show", "job", job], env=env(), capture_output=True, text=True, timeout=20)
        return done.stdout if "JobState=RUNNING" in done.stdout else None

    return wait_for(detail, timeout=timeout, what=lambda: f"job {job} running", interval=0.1)
